//! Kestra's task protocol on stdout: `::{"outputs": {...}}::` and `::{"metrics": [...]}::` lines.

use serde_json::{Map, Value, json};

use super::{Format, MetricKind, RunOutputs};

/// The Kestra task protocol.
pub struct Kestra;

impl Format for Kestra {
    fn lines(&self, outputs: &RunOutputs) -> Vec<String> {
        vec![outputs_line(outputs), metrics_line(outputs)]
    }
}

/// The outputs line the flow reads (`outputs.<task>.vars.*`).
fn outputs_line(run: &RunOutputs) -> String {
    let outputs: Map<String, Value> = run
        .outputs
        .iter()
        .map(|(key, value)| ((*key).to_string(), value.clone()))
        .collect();
    format!("::{}::", json!({ "outputs": outputs }))
}

/// The metrics line: counters and timers, each with the run's tags.
fn metrics_line(run: &RunOutputs) -> String {
    let tags: Map<String, Value> = run
        .tags
        .iter()
        .map(|(key, value)| ((*key).to_string(), json!(value)))
        .collect();
    let metrics: Vec<Value> = run
        .metrics
        .iter()
        .map(|metric| {
            let kind = match metric.kind {
                MetricKind::Counter => "counter",
                MetricKind::Timer => "timer",
            };
            json!({ "name": metric.name, "type": kind, "value": metric.value, "tags": tags })
        })
        .collect();
    format!("::{}::", json!({ "metrics": metrics }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Finished;
    use crate::session::{Committed, Status, Summary};

    fn protocol(line: &str) -> Value {
        let inner = line
            .strip_prefix("::")
            .and_then(|l| l.strip_suffix("::"))
            .expect("a protocol line");
        serde_json::from_str(inner).expect("JSON")
    }

    #[test]
    fn lines_parse_back_as_kestra_reads_them() {
        let finished = Finished {
            summary: Summary {
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
            },
            policy_sha256: "ff".into(),
            duration: std::time::Duration::from_millis(1500),
        };
        let lines = Kestra.lines(&RunOutputs::of(&finished));
        assert_eq!(lines.len(), 2);
        assert_eq!(
            protocol(&lines[0]),
            json!({"outputs": {"status": "HANDED_OFF", "events_handed_off": 2, "last_event_id": "ab", "consumer_id": "c", "events_skipped": 0, "events_quarantined": 1, "policy_sha256": "ff"}})
        );
        // Key order is kept as the baseline prints it.
        assert!(lines[0].starts_with(r#"::{"outputs":{"status":"HANDED_OFF","events_handed_off":2,"last_event_id":"ab","consumer_id":"c""#));
        let metrics = protocol(&lines[1]);
        assert_eq!(metrics["metrics"][0]["value"], json!(2));
        assert_eq!(metrics["metrics"][0]["tags"], json!({"consumer": "c"}));
        assert_eq!(metrics["metrics"][2]["type"], json!("timer"));
        assert_eq!(metrics["metrics"][2]["value"], json!(1.5));
    }

    #[test]
    fn a_stopped_run_says_so() {
        let finished = Finished {
            summary: Summary {
                status: Status::Idle,
                committed: Committed::default(),
                consumer_id: "c".into(),
                stopped: true,
            },
            policy_sha256: "ff".into(),
            duration: std::time::Duration::ZERO,
        };
        let lines = Kestra.lines(&RunOutputs::of(&finished));
        assert_eq!(protocol(&lines[0])["outputs"]["stopped"], json!(true));
    }
}
