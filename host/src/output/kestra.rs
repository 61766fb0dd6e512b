//! Kestra's task protocol on stdout: `::{"outputs": {...}}::` and `::{"metrics": [...]}::` lines.

use serde_json::{Value, json};

use crate::runtime::session::Summary;

/// The outputs line the flow reads (`outputs.<task>.vars.*`), with the baseline's four keys first.
pub fn outputs_line(summary: &Summary, extra: &[(&str, Value)]) -> String {
    let mut outputs = serde_json::Map::new();
    outputs.insert("status".into(), json!(summary.status.as_str()));
    outputs.insert(
        "events_handed_off".into(),
        json!(summary.committed.handed_off),
    );
    outputs.insert(
        "last_event_id".into(),
        json!(summary.committed.last_event_id),
    );
    outputs.insert("consumer_id".into(), json!(summary.consumer_id));
    outputs.insert("events_skipped".into(), json!(summary.committed.skipped));
    outputs.insert(
        "events_quarantined".into(),
        json!(summary.committed.quarantined),
    );
    for (key, value) in extra {
        outputs.insert((*key).to_string(), value.clone());
    }
    format!("::{}::", json!({ "outputs": outputs }))
}

/// The metrics line: a counter of events handed off and a timer of the run's duration.
pub fn metrics_line(
    summary: &Summary,
    duration: std::time::Duration,
    tags: &[(&str, &str)],
) -> String {
    let tags: serde_json::Map<String, Value> = tags
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(v)))
        .collect();
    format!(
        "::{}::",
        json!({ "metrics": [
            { "name": "events_handed_off", "type": "counter", "value": summary.committed.handed_off, "tags": tags },
            { "name": "events_committed", "type": "counter", "value": summary.committed.events, "tags": tags },
            { "name": "run_duration", "type": "timer", "value": duration.as_secs_f64(), "tags": tags },
        ]})
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::session::{Committed, Status};

    #[test]
    fn lines_parse_back_as_kestra_reads_them() {
        let summary = Summary {
            status: Status::HandedOff,
            committed: Committed {
                events: 3,
                handed_off: 2,
                skipped: 0,
                quarantined: 1,
                last_event_id: "ab".into(),
                invalidated: false,
                watermark_saved: true,
                ..Committed::default()
            },
            consumer_id: "c".into(),
            stopped: false,
        };
        let line = outputs_line(&summary, &[("policy_sha256", json!("ff"))]);
        let inner: Value =
            serde_json::from_str(line.strip_prefix("::").unwrap().strip_suffix("::").unwrap())
                .unwrap();
        assert_eq!(
            inner,
            json!({"outputs": {"status": "HANDED_OFF", "events_handed_off": 2, "last_event_id": "ab", "consumer_id": "c", "events_skipped": 0, "events_quarantined": 1, "policy_sha256": "ff"}})
        );
        let metrics = metrics_line(
            &summary,
            std::time::Duration::from_millis(1500),
            &[("consumer", "c")],
        );
        let inner: Value = serde_json::from_str(
            metrics
                .strip_prefix("::")
                .unwrap()
                .strip_suffix("::")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(inner["metrics"][0]["value"], json!(2));
        assert_eq!(inner["metrics"][2]["type"], json!("timer"));
        assert_eq!(inner["metrics"][2]["value"], json!(1.5));
    }
}
