//! What a run committed, as the host saw it, and the policy's report checked against it.

use super::Session;
use handoff_domain::error::HandoffError;
use handoff_domain::text::escape_untrusted;

/// How a run ended, as the policy reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Idle,
    HandedOff,
    Invalidated,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Idle => "IDLE",
            Status::HandedOff => "HANDED_OFF",
            Status::Invalidated => "INVALIDATED",
        }
    }
}

/// The policy's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyReport {
    pub status: Status,
    pub events_handed_off: u32,
    pub last_event_id: String,
}

/// What the host saw the run commit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Committed {
    pub events: u32,
    pub handed_off: u32,
    pub skipped: u32,
    pub quarantined: u32,
    /// Records (outbox or quarantine) the store already held for the same event and did not
    /// write again; they are counted in `handed_off` / `quarantined` too.
    pub duplicates_suppressed: u32,
    /// Transactions or commits the store retried (transient errors, unknown commit results).
    pub transaction_retries: u32,
    /// Stream openings from a saved token, by outcome (boxed: a failed run's result stays small).
    pub resume_attempts: Box<ResumeAttempts>,
    /// The ID of the last committed event, as the baseline reports it: the last outbox ID, or
    /// for an invalidated run the invalidate event's ID (SHA-256 of its canonical token).
    pub last_event_id: String,
    /// The last outbox ID handed off (what a policy built before the invalidate ID may report).
    pub last_outbox_id: String,
    pub invalidated: bool,
    pub watermark_saved: bool,
    /// Invalidation markers written to the outbox (`--invalidate-marker`); not counted in
    /// `handed_off`.
    pub invalidate_markers: u32,
    /// What became of source transactions (boxed: a failed run's result stays small).
    pub transactions: Box<SourceTransactions>,
    /// From each committed change's write to its commit, once any was measured.
    pub latency: Option<Box<Latency>>,
}

/// The time from a change's write (its `wallTime`, the server's clock) to the commit of its
/// hand-off (this machine's clock), in milliseconds, over the run's committed changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    pub count: u64,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub p999_ms: u64,
    pub max_ms: u64,
}

/// What a run did with the source transactions it read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceTransactions {
    /// Source transactions (within the bound) whose events were committed together.
    pub whole: u32,
    /// Source transactions handed off in several transactions: over the bound, over one
    /// transaction's bytes, or larger than what a run reads.
    pub split: u32,
    /// Delivered events left for the next run because the run ended inside their source
    /// transaction.
    pub held_back: u32,
}

/// Attempts to resume the change stream from a saved token, by outcome class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResumeAttempts {
    pub ok: u32,
    pub history_lost: u32,
    pub invalid_token: u32,
    pub fatal: u32,
    pub unavailable: u32,
}

impl ResumeAttempts {
    /// Counts one attempt that ended with `error` (`None`: it succeeded).
    pub fn count(&mut self, error: Option<&handoff_domain::StreamError>) {
        use handoff_domain::StreamError;
        let slot = match error {
            None => &mut self.ok,
            Some(StreamError::HistoryLost(_)) => &mut self.history_lost,
            Some(StreamError::InvalidToken(_)) => &mut self.invalid_token,
            Some(
                StreamError::Fatal(_) | StreamError::TooLarge(_) | StreamError::ImageMissing(_),
            ) => &mut self.fatal,
            Some(StreamError::Unavailable(_)) => &mut self.unavailable,
        };
        *slot = slot.saturating_add(1);
    }

    /// The metric name and count of each class.
    pub fn by_class(&self) -> [(&'static str, u32); 5] {
        [
            ("resume_attempts_ok", self.ok),
            ("resume_attempts_history_lost", self.history_lost),
            ("resume_attempts_invalid_token", self.invalid_token),
            ("resume_attempts_fatal", self.fatal),
            ("resume_attempts_unavailable", self.unavailable),
        ]
    }
}

/// The verified result of a successful run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSummary {
    pub status: Status,
    pub committed: Committed,
    pub consumer_id: String,
    /// The run was stopped by a signal before the policy finished; `committed` stands.
    pub stopped: bool,
}

/// A run that failed, with what it committed before the failure (which stands).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Failed {
    pub error: HandoffError,
    /// What was committed (boxed: a failure stays small).
    pub committed: Box<Committed>,
}

impl Failed {
    /// A failure before anything could be committed.
    pub fn before_commits(error: HandoffError) -> Failed {
        Failed {
            error,
            committed: Box::default(),
        }
    }
}

impl From<HandoffError> for Failed {
    fn from(error: HandoffError) -> Failed {
        Failed::before_commits(error)
    }
}

impl From<Failed> for HandoffError {
    fn from(failed: Failed) -> HandoffError {
        failed.error
    }
}

impl Session {
    /// Checks the policy's outcome against what the host saw committed.
    pub fn finish(
        &mut self,
        outcome: Result<PolicyReport, String>,
    ) -> Result<RunSummary, HandoffError> {
        let held = self.end_held(outcome.is_ok());
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        if self.stopped || self.stop.requested() {
            return Ok(self.stopped_summary());
        }
        let report =
            outcome.map_err(|message| HandoffError::Policy(escape_untrusted(&message, 1024)))?;
        let c = &self.committed;
        // The policy counts the events it committed; those held back were among them.
        let handed_off = c.handed_off + held.handed_off;
        let expected_status = status_of(c.invalidated, handed_off);
        // An invalidated run reports the invalidate event's ID; a policy built before the host
        // reported it may still report its last outbox ID.
        let last_id = held.last_id.as_deref().unwrap_or(&c.last_event_id);
        let id_matches = report.last_event_id == last_id
            || (c.invalidated && report.last_event_id == c.last_outbox_id);
        if report.status != expected_status || report.events_handed_off != handed_off || !id_matches
        {
            return Err(HandoffError::Policy(format!(
                "the policy's report ({} event(s), status {}) disagrees with what was committed ({} event(s), status {}); \
                 the committed events stand",
                report.events_handed_off,
                report.status.as_str(),
                handed_off,
                expected_status.as_str()
            )));
        }
        Ok(RunSummary {
            status: status_of(c.invalidated, c.handed_off),
            committed: c.clone(),
            consumer_id: self.consumer.consumer.clone(),
            stopped: false,
        })
    }

    /// Ends what a run holds when it ends inside a source transaction: left for the next run,
    /// which delivers the transaction again from its first event, unless the transaction began
    /// with this run's first event and the run ended well — larger than what a run of this
    /// policy reads, it is then written as the policy committed it.
    fn end_held(&mut self, policy_ok: bool) -> Held {
        let held = std::mem::take(&mut self.held);
        self.held_ids.clear();
        if held.is_empty() {
            return Held::default();
        }
        let ended_well =
            policy_ok && self.failure.is_none() && !self.stopped && !self.stop.requested();
        if ended_well && self.held_from_start {
            let mut held = held;
            tracing::warn!(
                events = held.len(),
                "the run ended inside a source transaction that began with its first event: \
                 larger than what a run reads, it is handed off in several transactions"
            );
            self.split_transaction(&held[0]);
            // A failure here is the run's, recorded by the write.
            let _ = self.write_planned(&mut held, handoff_domain::Mode::ResumeAfter);
            return Held::default();
        }
        let count = u32::try_from(held.len()).unwrap_or(u32::MAX);
        tracing::warn!(
            events = count,
            "the run ended inside a source transaction: none of its events were written; the \
             next run hands it off whole"
        );
        self.committed.transactions.held_back += count;
        Held {
            handed_off: u32::try_from(held.iter().filter(|s| s.handed_off.is_some()).count())
                .unwrap_or(u32::MAX),
            last_id: held.iter().rev().find_map(|s| s.handed_off.clone()),
        }
    }

    /// The summary of a stopped run: its status follows from what was committed.
    fn stopped_summary(&self) -> RunSummary {
        let c = &self.committed;
        RunSummary {
            status: status_of(c.invalidated, c.handed_off),
            committed: c.clone(),
            consumer_id: self.consumer.consumer.clone(),
            stopped: true,
        }
    }
}

/// What a run held back when it ended inside a source transaction, as the policy counted it.
#[derive(Default)]
struct Held {
    handed_off: u32,
    last_id: Option<String>,
}

/// The status of a run that committed `handed_off` events.
fn status_of(invalidated: bool, handed_off: u32) -> Status {
    if invalidated {
        Status::Invalidated
    } else if handed_off > 0 {
        Status::HandedOff
    } else {
        Status::Idle
    }
}
