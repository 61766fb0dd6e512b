//! Kestra's task protocol on stdout: `::{"outputs": {...}}::`, `::{"metrics": [...]}::` and
//! `::{"logs": [{"level": …, "message": …}]}::` lines.
//!
//! Kestra reads every line of a task's output that matches `^::(\{.*})::$` as one JSON object
//! with optional `outputs`, `metrics` and `logs` (each log's `level` one of `ERROR`, `WARN`,
//! `INFO`, `DEBUG`, `TRACE`); any other line is logged as it is, at INFO from stdout and at ERROR
//! from stderr. So logs go to stdout as protocol lines, each one line of JSON.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::{Format, MetricKind, RunOutputs};
use handoff_domain::text::escape_untrusted;

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
                // Kestra's script protocol knows counters and timers: a level in seconds is
                // sent as a timer of one sample.
                MetricKind::Gauge => "timer",
            };
            json!({ "name": metric.name, "type": kind, "value": metric.value, "tags": tags })
        })
        .collect();
    format!("::{}::", json!({ "metrics": metrics }))
}

/// The longest log message kept, in characters (fields included).
const LOG_MESSAGE_CHARS: usize = 4096;

/// Log events as Kestra log lines, their levels kept.
pub struct KestraLogs;

/// An event's message and fields as one text: `message key=value …`.
#[derive(Default)]
struct Collected {
    message: String,
    fields: String,
}

impl Visit for Collected {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

/// The Kestra log line of one event.
pub fn log_line(level: &Level, target: &str, message: &str, fields: &str) -> String {
    let level = match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    };
    // A policy's own log lines say so; the host's speak for themselves.
    let origin = if target == "policy" { "policy: " } else { "" };
    // Escaped like any untrusted text: no character in it can end the line for Kestra's reader.
    let message = escape_untrusted(&format!("{origin}{message}{fields}"), LOG_MESSAGE_CHARS);
    format!(
        "::{}::",
        json!({ "logs": [{ "level": level, "message": message }] })
    )
}

impl<S, N> FormatEvent<S, N> for KestraLogs
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut collected = Collected::default();
        event.record(&mut collected);
        let metadata = event.metadata();
        writeln!(
            writer,
            "{}",
            log_line(
                metadata.level(),
                metadata.target(),
                &collected.message,
                &collected.fields
            )
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_run::Finished;
    use handoff_session::{Committed, RunSummary, Status};

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
            summary: RunSummary {
                status: Status::HandedOff,
                committed: Committed {
                    events: 3,
                    handed_off: 2,
                    skipped: 0,
                    quarantined: 1,
                    duplicates_suppressed: 1,
                    transaction_retries: 4,
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
            position: None,
            forecast: None,
        };
        let lines = Kestra.lines(&RunOutputs::of(&finished));
        assert_eq!(lines.len(), 2);
        assert_eq!(
            protocol(&lines[0]),
            json!({"outputs": {"status": "HANDED_OFF", "events_handed_off": 2, "last_event_id": "ab", "consumer_id": "c", "events_skipped": 0, "events_quarantined": 1, "duplicates_suppressed": 1, "policy_sha256": "ff"}})
        );
        // Key order is kept as the baseline prints it.
        assert!(lines[0].starts_with(r#"::{"outputs":{"status":"HANDED_OFF","events_handed_off":2,"last_event_id":"ab","consumer_id":"c""#));
        let metrics = protocol(&lines[1]);
        let metric = |name: &str| {
            metrics["metrics"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("no metric {name}"))
        };
        assert_eq!(metric("events_handed_off")["value"], json!(2));
        assert_eq!(
            metric("events_handed_off")["tags"],
            json!({"consumer": "c"})
        );
        assert_eq!(metric("events_quarantined")["value"], json!(1));
        assert_eq!(metric("duplicates_suppressed")["value"], json!(1));
        assert_eq!(metric("transaction_retries")["value"], json!(4));
        assert_eq!(metric("resume_attempts_history_lost")["value"], json!(0));
        assert_eq!(metric("run_duration")["type"], json!("timer"));
        assert_eq!(metric("run_duration")["value"], json!(1.5));
        // The consumer is the only tag.
        for m in metrics["metrics"].as_array().unwrap() {
            assert_eq!(m["tags"], json!({"consumer": "c"}), "{m}");
        }
    }

    #[test]
    fn log_lines_keep_their_level_and_stay_one_line() {
        let line = log_line(
            &Level::WARN,
            "policy",
            "two\nlines\u{2028}and a separator",
            " key=va\rlue",
        );
        assert!(!line.contains('\n') && !line.contains('\r') && !line.contains('\u{2028}'));
        let value = protocol(&line);
        assert_eq!(value["logs"][0]["level"], json!("WARN"));
        let message = value["logs"][0]["message"].as_str().unwrap();
        assert!(message.starts_with("policy: two\\nlines"), "{message}");
        assert!(message.ends_with("key=va\\rlue"), "{message}");
        for (level, name) in [
            (Level::ERROR, "ERROR"),
            (Level::INFO, "INFO"),
            (Level::DEBUG, "DEBUG"),
            (Level::TRACE, "TRACE"),
        ] {
            assert_eq!(
                protocol(&log_line(&level, "handoff", "m", ""))["logs"][0]["level"],
                json!(name)
            );
        }
    }

    #[test]
    fn a_stopped_run_says_so() {
        let finished = Finished {
            summary: RunSummary {
                status: Status::Idle,
                committed: Committed::default(),
                consumer_id: "c".into(),
                stopped: true,
            },
            policy_sha256: "ff".into(),
            duration: std::time::Duration::ZERO,
            position: None,
            forecast: None,
        };
        let lines = Kestra.lines(&RunOutputs::of(&finished));
        assert_eq!(protocol(&lines[0])["outputs"]["stopped"], json!(true));
    }
}
