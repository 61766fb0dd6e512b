//! What a finished run tells the workflow engine, and the formats that carry it.
//!
//! [`RunOutputs`] is the one description of a run's outputs and metrics; a [`Format`] only
//! decides how they are written. A new engine or format is one file here implementing it.
//!
//! - `kestra`: Kestra's task protocol lines (`::{"outputs": …}::`, `::{"metrics": …}::`,
//!   `::{"logs": …}::`);
//! - `file`: the outputs as one JSON object in a file, written atomically, for engines that read
//!   a file (Argo Workflows, Airflow, GitHub Actions);
//! - `live`: the metrics of a long run, served over HTTP in the OpenMetrics format while it runs;
//!   `live_delivery`: those of a long delivery.

mod evidence;
pub mod file;
pub mod kestra;
pub mod live;
pub mod live_delivery;

pub use evidence::{Evidence, RECOVERY_STEPS, shell_word, target_flags};

use serde_json::{Value, json};

use handoff_domain::forecast::Forecast;
use handoff_domain::position::Position;
use handoff_domain::text::escape_untrusted;
use handoff_run::{FailedRun, Finished};
use handoff_session::Committed;

/// The status a failed run reports.
pub const FAILED: &str = "FAILED";

/// How a metric aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Timer,
    /// A level at the end of the run (seconds of lag, of margin), not a sum.
    Gauge,
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
        let mut run = RunOutputs::committed(
            summary.status.as_str(),
            &summary.committed,
            &summary.consumer_id,
            Some(&finished.policy_sha256),
            finished.duration,
        );
        if summary.stopped {
            run.outputs.push(("stopped", json!(true)));
        }
        if let Some(position) = &finished.position {
            run.add_position(position);
            run.add_forecast(finished.forecast.as_ref());
        }
        run
    }

    /// The outputs of a failed run: what it committed before the failure (which stands), its
    /// failure class and exit code, and what to do next. `consumer_id` is the consumer when the
    /// inputs were valid enough to name one.
    pub fn failed(failed: &FailedRun, consumer_id: &str) -> RunOutputs {
        let error = &failed.failed.error;
        let mut run = RunOutputs::committed(
            FAILED,
            &failed.failed.committed,
            consumer_id,
            failed.policy_sha256.as_deref(),
            failed.duration,
        );
        run.outputs.extend([
            ("error_class", json!(error.kind())),
            ("exit_code", json!(error.exit_code())),
        ]);
        let evidence = Evidence::of(
            error,
            failed.position.as_deref(),
            consumer_id,
            failed.source.as_deref(),
            failed.collections.as_deref(),
        );
        let guidance = match &evidence {
            Some(evidence) => {
                handoff_domain::error::sentences(&error.to_string(), &evidence.summary())
            }
            None => error.to_string(),
        };
        run.outputs
            .push(("guidance", json!(escape_untrusted(&guidance, 4096))));
        if let Some(position) = failed.position.as_deref() {
            run.add_position(position);
            run.add_forecast(failed.forecast.as_deref());
        }
        if let Some(evidence) = evidence {
            run.outputs.push(("evidence", evidence.to_json()));
        }
        run
    }

    /// Lag, checkpoint age and oplog margin, as outputs (null when unknown) and as gauges
    /// (when known).
    fn add_position(&mut self, position: &Position) {
        let figures = [
            ("lag_seconds", position.lag_seconds()),
            ("checkpoint_age_seconds", position.checkpoint_age_seconds()),
            ("oplog_margin_seconds", position.oplog_margin_seconds()),
        ];
        for (name, value) in figures {
            self.outputs.push((name, json!(value)));
            if let Some(value) = value {
                self.metrics.push(Metric {
                    name,
                    kind: MetricKind::Gauge,
                    value: json!(value),
                });
            }
        }
    }

    /// When the checkpoint would fall off the oplog if the rates hold: an output (null when it
    /// would not, or that cannot be told) and a gauge when known.
    fn add_forecast(&mut self, forecast: Option<&Forecast>) {
        let eta = forecast.and_then(Forecast::eta_seconds);
        self.outputs.push(("history_loss_eta_seconds", json!(eta)));
        if let Some(eta) = eta {
            self.metrics.push(Metric {
                name: "history_loss_eta_seconds",
                kind: MetricKind::Gauge,
                value: json!(eta),
            });
        }
    }

    fn committed(
        status: &str,
        committed: &Committed,
        consumer_id: &str,
        policy_sha256: Option<&str>,
        duration: std::time::Duration,
    ) -> RunOutputs {
        let mut outputs = vec![
            ("status", json!(status)),
            ("events_handed_off", json!(committed.handed_off)),
            ("last_event_id", json!(committed.last_event_id)),
            ("consumer_id", json!(consumer_id)),
            ("events_skipped", json!(committed.skipped)),
            ("events_quarantined", json!(committed.quarantined)),
            (
                "duplicates_suppressed",
                json!(committed.duplicates_suppressed),
            ),
        ];
        if let Some(sha256) = policy_sha256 {
            outputs.push(("policy_sha256", json!(sha256)));
        }
        let metric = |name, kind, value| Metric { name, kind, value };
        let counter = |name, value: u32| metric(name, MetricKind::Counter, json!(value));
        let mut metrics = vec![
            counter("events_handed_off", committed.handed_off),
            counter("events_committed", committed.events),
            counter("events_skipped", committed.skipped),
            counter("events_quarantined", committed.quarantined),
            counter("duplicates_suppressed", committed.duplicates_suppressed),
            counter("transaction_retries", committed.transaction_retries),
            counter("source_transactions", committed.transactions.whole),
            counter("source_transactions_split", committed.transactions.split),
            counter(
                "transaction_events_held_back",
                committed.transactions.held_back,
            ),
        ];
        metrics.extend(
            committed
                .resume_attempts
                .by_class()
                .into_iter()
                .map(|(name, value)| counter(name, value)),
        );
        if let Some(latency) = &committed.latency {
            // From each change's write to the commit of its hand-off.
            for (name, value) in [
                ("latency_p50_ms", latency.p50_ms),
                ("latency_p99_ms", latency.p99_ms),
                ("latency_p999_ms", latency.p999_ms),
                ("latency_max_ms", latency.max_ms),
            ] {
                metrics.push(metric(name, MetricKind::Gauge, json!(value)));
            }
        }
        metrics.push(metric(
            "run_duration",
            MetricKind::Timer,
            json!(duration.as_secs_f64()),
        ));
        RunOutputs {
            outputs,
            metrics,
            tags: vec![("consumer", consumer_id.to_string())],
        }
    }

    /// The outputs as one JSON object, in order.
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.outputs
                .iter()
                .map(|(key, value)| ((*key).to_string(), value.clone()))
                .collect(),
        )
    }
}

/// A way of writing a run's outputs for an engine.
pub trait Format {
    /// The lines to print on stdout.
    fn lines(&self, outputs: &RunOutputs) -> Vec<String>;
}

/// Prints a run's outputs on stdout in `format`; a stdout that cannot take them is left as it is
/// (see [`try_emit`]).
pub fn emit(format: &dyn Format, outputs: &RunOutputs) {
    let _ = try_emit(format, outputs);
}

/// Prints a run's outputs on stdout in `format`, all lines at once.
pub fn try_emit(format: &dyn Format, outputs: &RunOutputs) -> handoff_domain::error::Result<()> {
    let mut text = String::new();
    for line in format.lines(outputs) {
        text.push_str(&line);
        text.push('\n');
    }
    write_stdout(&text)
}

/// Set once a write to stdout found its reader gone (a closed pipe, as `handoff inspect | head -1`
/// leaves it): nothing more is written, and the command ends as it would have.
static READER_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether stdout's reader has gone: a command printing many lines stops there.
pub fn reader_gone() -> bool {
    READER_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Writes `text` to stdout and flushes it. A closed pipe is a reader that has read what it
/// wanted: the rest is dropped and the command ends as it would have (a run with its own exit
/// code). A full device or another write error is the command's failure (`unavailable`), never a
/// panic: `println!` would abort the process on either.
pub fn write_stdout(text: &str) -> handoff_domain::error::Result<()> {
    use std::io::Write;
    if reader_gone() {
        return Ok(());
    }
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            READER_GONE.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!("stdout's reader has gone: the rest of the output is dropped");
            Ok(())
        }
        Err(error) => Err(stdout_failed(error)),
    }
}

/// The failure of a command whose stdout cannot be written.
pub fn stdout_failed(error: std::io::Error) -> handoff_domain::error::HandoffError {
    handoff_domain::error::HandoffError::Unavailable(format!(
        "stdout cannot be written ({error}): it was closed or its device is full; what the command \
         committed stands, and a run's outputs file is written all the same"
    ))
}
