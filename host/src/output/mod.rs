//! What a finished run tells the workflow engine, and the formats that carry it.
//!
//! [`RunOutputs`] is the one description of a run's outputs and metrics; a [`Format`] only
//! decides how they are written. A new engine or format is one file here implementing it.
//!
//! - `kestra`: Kestra's task protocol lines (`::{"outputs": …}::`, `::{"metrics": …}::`).

pub mod kestra;

use serde_json::{Value, json};

use crate::run::Finished;

/// How a metric aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Timer,
}

/// One metric of a run; timers are in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: MetricKind,
    pub value: Value,
}

/// A run's outputs (in order, the baseline's four keys first), its metrics and their tags.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutputs {
    pub outputs: Vec<(&'static str, Value)>,
    pub metrics: Vec<Metric>,
    pub tags: Vec<(&'static str, String)>,
}

impl RunOutputs {
    /// The outputs of a finished run (also of a stopped one: its commits stand).
    pub fn of(finished: &Finished) -> RunOutputs {
        let summary = &finished.summary;
        let committed = &summary.committed;
        let mut outputs = vec![
            ("status", json!(summary.status.as_str())),
            ("events_handed_off", json!(committed.handed_off)),
            ("last_event_id", json!(committed.last_event_id)),
            ("consumer_id", json!(summary.consumer_id)),
            ("events_skipped", json!(committed.skipped)),
            ("events_quarantined", json!(committed.quarantined)),
            ("policy_sha256", json!(finished.policy_sha256)),
        ];
        if summary.stopped {
            outputs.push(("stopped", json!(true)));
        }
        let metric = |name, kind, value| Metric { name, kind, value };
        RunOutputs {
            outputs,
            metrics: vec![
                metric(
                    "events_handed_off",
                    MetricKind::Counter,
                    json!(committed.handed_off),
                ),
                metric(
                    "events_committed",
                    MetricKind::Counter,
                    json!(committed.events),
                ),
                metric(
                    "run_duration",
                    MetricKind::Timer,
                    json!(finished.duration.as_secs_f64()),
                ),
            ],
            tags: vec![("consumer", summary.consumer_id.clone())],
        }
    }
}

/// A way of writing a run's outputs for an engine.
pub trait Format {
    /// The lines to print on stdout.
    fn lines(&self, outputs: &RunOutputs) -> Vec<String>;
}

/// Prints a run's outputs on stdout in `format`.
pub fn emit(format: &dyn Format, outputs: &RunOutputs) {
    for line in format.lines(outputs) {
        println!("{line}");
    }
}
