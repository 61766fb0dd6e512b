//! A run's hold on its consumer, from the claim to the release: the lease is given back after
//! the figures are read, in the same command as the run's record in the run history.

use std::sync::Arc;

use bson::DateTime;

use handoff_domain::CheckpointStore;
use handoff_domain::error::HandoffError;
use handoff_domain::history::RunRecord;
use handoff_domain::position::Position;
use handoff_session::{Failed, RunSummary};

/// A claimed consumer, until its lease is given back.
pub struct Held {
    pub store: Arc<dyn CheckpointStore>,
    pub consumer: String,
    pub source: String,
    pub owner: String,
    /// The run's number for its consumer.
    pub run: i64,
    /// The operator's moves of the checkpoint before the run.
    pub moves: i64,
    pub started_at: DateTime,
    /// The run follows the stream: a stop ends it cleanly.
    pub follow: bool,
}

impl Held {
    /// The run's record: how it ended and where the consumer stands.
    pub fn record(
        &self,
        outcome: std::result::Result<&RunSummary, &Failed>,
        position: Option<&Position>,
    ) -> RunRecord {
        let (status, error, committed) = match outcome {
            Ok(summary) => (summary.status.as_str(), None, &summary.committed),
            Err(failed) => ("FAILED", Some(&failed.error), &*failed.committed),
        };
        RunRecord {
            consumer: self.consumer.clone(),
            source: self.source.clone(),
            run: self.run,
            moves: self.moves,
            started_at: self.started_at,
            ended_at: DateTime::now(),
            status: status.to_string(),
            error_class: error.map(|e: &HandoffError| e.kind().to_string()),
            // A run stopped by a signal ends its process with 12, unless it follows the
            // stream, which ends that way.
            exit_code: match outcome {
                Ok(summary) if summary.stopped && !self.follow => 12,
                _ => error.map_or(0, HandoffError::exit_code),
            },
            events_handed_off: committed.handed_off,
            events_skipped: committed.skipped,
            events_quarantined: committed.quarantined,
            follow: self.follow,
            checkpoint_time: None,
            cluster_time: None,
            oplog_oldest: None,
            oplog_newest: None,
            figures_at: None,
        }
        .with_position(position)
    }

    /// Gives the lease back, keeping `record` in the run history when given. The next run need
    /// not wait for the lease to expire; a run that cannot release it (its deadline passed, the
    /// server is gone) leaves it to expire. The epoch, not this machine's time: a next run whose
    /// clock is behind finds it free.
    pub fn release(self, record: Option<&RunRecord>) {
        let epoch = DateTime::from_millis(0);
        let released = match record {
            Some(record) => {
                self.store
                    .release_recording(&self.consumer, &self.owner, epoch, record)
            }
            None => self.store.release(&self.consumer, &self.owner, epoch),
        };
        if let Err(error) = released {
            tracing::debug!(
                error = %handoff_domain::text::escape_untrusted(&error.to_string(), 500),
                "the lease could not be released; it expires by itself"
            );
        }
    }
}
