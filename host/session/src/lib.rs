//! The guarantees: the host side of one run, validating every call a policy makes.
//!
//! Nothing here knows of WebAssembly: the runtime's bindings translate the contract's calls into
//! this module's, and so does the native benchmark path. Rules enforced here:
//! - the stream opens only from the checkpoint's own token (or from now for a fresh consumer);
//! - a commit moves the checkpoint from the token this run holds to the *next delivered* event, in
//!   delivery order: an event is never skipped silently and a token never comes from the policy;
//! - every event but an invalidation carries an outbox record with a bounded, printable ID;
//!   an invalidation must be saved with `startAfter`;
//! - the idle watermark is saved only when every delivered event is committed, and only as the
//!   stream's current watermark;
//! - the first failure ends the run: later calls are refused, so a policy cannot continue past a
//!   lost history or a lost compare-and-set.
//!
//! - `stream`: opening the stream, delivering events, reading their fields;
//! - `commit`: the policy's decisions checked, planned and written with the checkpoint;
//! - `record`: outbox records shaped by the policy, checked and built;
//! - `report`: what was committed, and the policy's report checked against it;
//! - `refusal`: what a refused call tells the policy;
//! - `transaction`: source transactions read whole before they are delivered, and held until
//!   the commit that ends them.

mod commit;
mod record;
mod refusal;
mod report;
mod stream;
#[cfg(test)]
mod tests;
mod transaction;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use bson::{Document, RawDocument, RawDocumentBuf};

pub use commit::{Decision, MAX_BATCH, MAX_ID_LEN};
pub use record::{
    MAX_EVENT_TYPE_LEN, MAX_PAYLOAD_TEXT, MAX_PAYLOADS_PER_COMMIT, MAX_VALUE_TEXT, OutboxOptions,
    Shaped,
};
pub use refusal::{Refusal, RefusalKind};
pub use report::{
    Committed, Failed, Latency, PolicyReport, ResumeAttempts, RunSummary, SourceTransactions,
    Status,
};
pub use stream::EventView;
pub use transaction::{MAX_SOURCE_TRANSACTION, SourceTransaction};

use handoff_domain::StopSignal;
use handoff_domain::checkpoint::PolicyBinding;
use handoff_domain::error::HandoffError;
use handoff_domain::time::VirtualTime;
use handoff_domain::token::canonical_text;
use handoff_domain::{
    ChangeSource, Checkpoint, CheckpointStore, Consumer, Deployment, Lease, Mode,
};

/// The longest write-to-commit time the latency figures tell apart (an hour); longer ones count
/// as an hour.
const MAX_LATENCY_MS: u64 = 3_600_000;

/// How many delivered events may wait for their commit.
pub const MAX_PENDING: usize = 1000;
/// How many bytes of delivered events may wait for their commit.
pub const MAX_PENDING_BYTES: usize = 256 << 20;
/// MongoDB's document size limit: no outbox or quarantine record may exceed it.
pub const MAX_RECORD_BYTES: usize = 16 << 20;
/// The records one transaction writes at most, in bytes. A commit whose records exceed it is
/// written as consecutive transactions, each moving the checkpoint to its own last event: every
/// event still lands atomically with its checkpoint, and a failure between two leaves a
/// checkpoint that matches the outbox.
pub const MAX_TRANSACTION_BYTES: usize = 16 << 20;

/// What a run tells whoever watches it live (the metrics endpoint of a long run).
pub trait Observer: Send + Sync {
    /// The stream is open: the run is ready.
    fn opened(&self) {}
    /// A commit (or a watermark saved): what the run committed so far, the write-to-commit
    /// times in milliseconds of the changes it just committed, and the checkpoint's token.
    fn committed(
        &self,
        committed: &Committed,
        latencies_ms: &[u64],
        checkpoint: Option<&Document>,
    ) {
        let _ = (committed, latencies_ms, checkpoint);
    }
}

/// The byte and count bounds a session enforces (the constants above by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub max_pending: usize,
    pub max_pending_bytes: usize,
    pub max_record_bytes: usize,
    pub max_transaction_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_pending: MAX_PENDING,
            max_pending_bytes: MAX_PENDING_BYTES,
            max_record_bytes: MAX_RECORD_BYTES,
            max_transaction_bytes: MAX_TRANSACTION_BYTES,
        }
    }
}

/// A delivered event, kept until it is committed (and a little after, for `field`). It is kept
/// as the server sent it: its records are built from its bytes, and the policy's reads look into
/// them, so no event is decoded whole.
struct Delivered {
    /// The canonical text of its token: of its first fragment for a split event.
    text: String,
    /// The event, or its first fragment.
    event: RawDocumentBuf,
    /// The other fragments of a split event (`splitEvent`), in order; empty otherwise.
    rest: Vec<RawDocumentBuf>,
    invalidate: bool,
    /// The event's BSON size (all its fragments').
    bytes: usize,
    /// Its place in the source transaction that wrote it, if one did.
    txn: Option<transaction::Place>,
}

impl Delivered {
    /// Every fragment of the event (the event alone when it was not split).
    fn fragments(&self) -> impl Iterator<Item = &RawDocument> {
        std::iter::once(&self.event)
            .chain(&self.rest)
            .map(|fragment| fragment.as_ref())
    }

    /// The token the checkpoint moves to once the event is committed: its last fragment's.
    fn checkpoint_token(&self) -> Option<Document> {
        let last = self.rest.last().unwrap_or(&self.event);
        Document::try_from(last.get_document("_id").ok()?).ok()
    }
}

pub struct Session {
    consumer: Consumer,
    deployment: Deployment,
    source: Box<dyn ChangeSource>,
    store: Arc<dyn CheckpointStore>,
    token: Option<Document>,
    token_text: Option<String>,
    mode: Mode,
    stream_open: bool,
    pending: VecDeque<Delivered>,
    pending_bytes: usize,
    recent: VecDeque<Delivered>,
    /// Events read from the stream but not yet delivered: the rest of a source transaction
    /// whose first event was, and the event read after it.
    ahead: VecDeque<transaction::Read>,
    /// A source transaction too large to read ahead, while its events are being delivered.
    oversized: Option<transaction::Oversized>,
    /// The IDs of the last source transactions read whole.
    transactions_read: VecDeque<String>,
    /// Decided events held back because their commit ended inside a source transaction: the
    /// first `held.len()` pending events, written with the commit that ends it.
    held: Vec<commit::Planned>,
    /// The record IDs the held events write (no ID twice in one transaction).
    held_ids: HashSet<(bool, String)>,
    /// The held events began with the first event of the run.
    held_from_start: bool,
    /// The source transactions this run handed off in several transactions.
    split_transactions: HashSet<String>,
    committed: Committed,
    failure: Option<HandoffError>,
    deadline: Instant,
    stop: StopSignal,
    stopped: bool,
    /// Events delivered so far, and how many the run may take.
    delivered: u32,
    max_events: Option<u32>,
    /// The host saved the stream's starting position while the policy still holds "no token":
    /// until its first commit, the policy's `expected: none` stands for that position.
    start_saved_for_policy: bool,
    bounds: Bounds,
    outbox_options: OutboxOptions,
    /// The lease this run holds on the checkpoint, renewed by every commit, and when it was
    /// last renewed.
    lease: Option<Lease>,
    lease_renewed: Instant,
    /// The stream splits large events (`--split-large-events`): only then is `splitEvent` read.
    split_events: bool,
    kind: RunKind,
    /// The policy that decides, recorded in the checkpoint by every commit of its decisions.
    policy: Option<PolicyBinding>,
    /// The run follows the stream until it is stopped (`run --follow`).
    follow: bool,
    /// Write-to-commit times of the committed changes, in milliseconds.
    latencies: Option<hdrhistogram::Histogram<u64>>,
    /// Who watches the run live, if anyone.
    observer: Option<Arc<dyn Observer>>,
}

/// What a run reads: the change stream, or documents an operator command read (a snapshot run,
/// whose commits the command writes with its own progress).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunKind {
    Changes,
    Backfill,
    Repair,
}

impl Session {
    /// A session over `source` and `store` from a validated checkpoint, ending at `deadline`.
    pub fn new(
        consumer: Consumer,
        deployment: Deployment,
        checkpoint: Checkpoint,
        source: Box<dyn ChangeSource>,
        store: Arc<dyn CheckpointStore>,
        deadline: Instant,
    ) -> Self {
        let token_text = checkpoint.token.as_ref().map(canonical_text);
        Session {
            consumer,
            deployment,
            source,
            store,
            token: checkpoint.token,
            token_text,
            mode: checkpoint.mode,
            stream_open: false,
            pending: VecDeque::new(),
            pending_bytes: 0,
            recent: VecDeque::new(),
            ahead: VecDeque::new(),
            oversized: None,
            transactions_read: VecDeque::new(),
            held: Vec::new(),
            held_ids: HashSet::new(),
            held_from_start: false,
            split_transactions: HashSet::new(),
            committed: Committed::default(),
            failure: None,
            deadline,
            stop: StopSignal::default(),
            stopped: false,
            delivered: 0,
            max_events: None,
            start_saved_for_policy: false,
            bounds: Bounds::default(),
            outbox_options: OutboxOptions::default(),
            lease: None,
            lease_renewed: Instant::now(),
            split_events: false,
            kind: RunKind::Changes,
            policy: None,
            follow: false,
            latencies: hdrhistogram::Histogram::new_with_bounds(1, MAX_LATENCY_MS, 3).ok(),
            observer: None,
        }
    }

    /// A run that follows the stream until it is stopped: no `max_events`, and a lease it can
    /// no longer prove it holds ends it.
    pub fn with_follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    pub fn follows(&self) -> bool {
        self.follow
    }

    /// Tells `observer` of the run as it goes (the metrics endpoint).
    pub fn with_observer(mut self, observer: Option<Arc<dyn Observer>>) -> Self {
        self.observer = observer;
        self
    }

    /// Records `policy` in the checkpoint with every commit of its decisions.
    pub fn with_policy(mut self, policy: PolicyBinding) -> Self {
        self.policy = Some(policy);
        self
    }

    /// A snapshot run (`backfill`, `repair`) instead of the change stream.
    pub fn with_kind(mut self, kind: RunKind) -> Self {
        self.kind = kind;
        self
    }

    pub fn kind(&self) -> RunKind {
        self.kind
    }

    /// Puts the fragments of split events together (the stream was opened with
    /// `$changeStreamSplitLargeEvent`). Otherwise a `splitEvent` field is an event's like any.
    pub fn with_split_events(mut self, split: bool) -> Self {
        self.split_events = split;
        self
    }

    /// Commits only while `lease` holds the checkpoint, renewing it.
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.lease = Some(lease);
        self.lease_renewed = Instant::now();
        self
    }

    /// Extends the lease once a third of it has passed since it was last renewed (a commit
    /// renews it too): a run that reads for a while without committing keeps its consumer. A
    /// renewal that fails is left to the next commit, whose compare-and-set needs the lease —
    /// except in a run that follows the stream, which may not commit for a long time: it ends
    /// the moment it cannot prove it still holds the lease (another run took it, or it ran out
    /// before a renewal went through).
    fn keep_lease(&mut self) -> Result<(), Refusal> {
        let Some(lease) = &self.lease else {
            return Ok(());
        };
        let since = self.lease_renewed.elapsed();
        if since < lease.duration / 3 {
            return Ok(());
        }
        let (duration, owner) = (lease.duration, lease.owner.clone());
        let until = lease.until(bson::DateTime::now());
        match self.store.renew(&self.consumer.consumer, &owner, until) {
            Ok(()) => {
                tracing::debug!("lease renewed");
                self.lease_renewed = Instant::now();
            }
            Err(handoff_domain::CommitError::Conflict) if self.follow => {
                return Err(self.fail(HandoffError::Conflict(
                    "This run lost its lease on the consumer (another run took it over); it                      stops after its last commit"
                        .into(),
                )));
            }
            Err(error) => {
                tracing::debug!(
                    error = %handoff_domain::text::escape_untrusted(&error.to_string(), 500),
                    "the lease could not be renewed"
                );
                if self.follow && since >= duration {
                    return Err(self.fail(HandoffError::Conflict(
                        "This run could not renew its lease before it ran out, so it cannot                          prove it still holds the consumer; it stops after its last commit"
                            .into(),
                    )));
                }
                if !self.follow {
                    self.lease_renewed = Instant::now();
                }
            }
        }
        Ok(())
    }

    /// Replaces the default byte and count bounds.
    pub fn with_bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// What the outbox keeps of policy-shaped records.
    pub fn with_outbox_options(mut self, options: OutboxOptions) -> Self {
        self.outbox_options = options;
        self
    }

    /// Refuses to deliver more than `max` events in this run (the `max_events` input).
    pub fn with_max_events(mut self, max: u32) -> Self {
        self.max_events = Some(max);
        self
    }

    /// Ends the run gracefully when `stop` is raised.
    pub fn with_stop(mut self, stop: StopSignal) -> Self {
        self.stop = stop;
        self
    }

    /// The flag that ends the run after its in-flight commit.
    pub fn stop(&self) -> &StopSignal {
        &self.stop
    }

    pub fn stop_requested(&self) -> bool {
        self.stop.requested()
    }

    /// When the run must end; nothing is read or written after it.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The virtual time of a recorded stream (`None` for a live one).
    pub fn virtual_time(&self) -> Option<VirtualTime> {
        self.source.virtual_time()
    }

    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    pub fn deployment(&self) -> &Deployment {
        &self.deployment
    }

    pub fn checkpoint(&self) -> (Option<String>, Mode) {
        (self.token_text.clone(), self.mode)
    }

    pub fn committed(&self) -> &Committed {
        &self.committed
    }

    /// The first failure of the run, if any.
    pub fn failure(&self) -> Option<&HandoffError> {
        self.failure.as_ref()
    }

    /// Milliseconds on the source's clock.
    pub fn now_ms(&self) -> u64 {
        self.source.now_ms()
    }

    /// Records the failure that ends the run (the first one wins) and returns what the policy
    /// is told.
    fn fail(&mut self, error: HandoffError) -> Refusal {
        let refusal = Refusal::of(&error);
        tracing::warn!(kind = error.kind(), "run failed");
        if self.failure.is_none() {
            self.failure = Some(error);
        }
        refusal
    }

    /// Ends the run on a call the host refused before reading it whole (the bindings' bounds).
    pub fn refuse(&mut self, what: impl std::fmt::Display) -> Refusal {
        self.reject(what)
    }

    /// Ends the run on a policy decision that breaks a rule.
    fn reject(&mut self, what: impl std::fmt::Display) -> Refusal {
        self.fail(HandoffError::Policy(refusal::rejected(what)))
    }

    /// Refuses any call once the run has failed, is stopping or passed its deadline.
    fn gate(&mut self) -> Result<(), Refusal> {
        if let Some(failure) = &self.failure {
            return Err(Refusal::rejected(format!(
                "the run has already failed: {failure}"
            )));
        }
        if self.stopped || self.stop.requested() {
            if !self.stopped {
                tracing::warn!(
                    events = self.committed.events,
                    "stop requested; ending the run after its last commit"
                );
            }
            self.stopped = true;
            return Err(Refusal::rejected(
                "the run is stopping (signal received); nothing more is read",
            ));
        }
        if Instant::now() >= self.deadline {
            return Err(self.fail(HandoffError::Policy(
                "the policy exceeded the run deadline; nothing after the last commit was written"
                    .into(),
            )));
        }
        Ok(())
    }
}
