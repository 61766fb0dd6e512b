//! The host side of one run: every primitive the policy can call, with the validation that keeps
//! the guarantees whatever the policy decides.
//!
//! This module knows nothing of WebAssembly: the component bindings delegate to it, and so does the
//! native benchmark path. Rules enforced here:
//! - the stream opens only from the checkpoint's own token (or from now for a fresh consumer);
//! - a commit moves the checkpoint from the token this run holds to the *next delivered* event, in
//!   delivery order: an event is never skipped silently and a token never comes from the policy;
//! - every event but an invalidation carries an outbox record with a bounded, printable ID;
//!   an invalidation must be saved with `startAfter`;
//! - the idle watermark is saved only when every delivered event is committed, and only as the
//!   stream's current watermark;
//! - the first failure ends the run: later calls are refused, so a policy cannot continue past a
//!   lost history or a lost compare-and-set.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bson::{Bson, Document, doc};

use super::stop::StopSignal;
use crate::backend::{
    BSON_OBJECT_TOO_LARGE, ChangeSource, CheckpointStore, Commit, CommitError, Consumer,
    Deployment, Mode, StreamError, StreamStart,
};
use crate::error::{EVENT_TOO_LARGE_GUIDANCE, HandoffError, RECONCILE_GUIDANCE};
use crate::output::text::escape_untrusted;
use crate::token::{canonical_text, value_text};
use sha2::{Digest, Sha256};

/// The longest outbox ID a policy may choose.
pub const MAX_ID_LEN: usize = 200;
/// How many delivered events may wait for their commit.
pub const MAX_PENDING: usize = 1000;
/// How many bytes of delivered events may wait for their commit.
pub const MAX_PENDING_BYTES: usize = 256 << 20;
/// How many events one commit may cover.
pub const MAX_BATCH: usize = 500;
/// MongoDB's document size limit: no outbox or quarantine record may exceed it.
pub const MAX_RECORD_BYTES: usize = 16 << 20;
/// The records one transaction writes at most, in bytes. A commit whose records exceed it is
/// written as consecutive transactions, each moving the checkpoint to its own last event: every
/// event still lands atomically with its checkpoint, and a failure between two leaves a
/// checkpoint that matches the outbox.
pub const MAX_TRANSACTION_BYTES: usize = 16 << 20;
/// How many committed events stay readable through `field`.
const RECENT: usize = 16;

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

/// The checkpoint as loaded and validated before the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub token: Option<Document>,
    pub mode: Mode,
}

/// Where the policy asks to open the stream (tokens as canonical text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    Now,
    ResumeAfter(String),
    StartAfter(String),
}

/// What the policy sees of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    pub token: String,
    pub operation_type: String,
    pub namespace: Option<String>,
    pub cluster_time: Option<(u32, u32)>,
}

/// A stream failure as the policy receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamFailure {
    HistoryLost(String),
    InvalidToken(String),
    Fatal(String),
    Unavailable(String),
    Rejected(String),
}

/// A commit failure as the policy receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitFailure {
    Conflict(String),
    Rejected(String),
    Unavailable(String),
}

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
pub struct Report {
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
    /// The ID of the last committed event, as the baseline reports it: the last outbox ID, or
    /// for an invalidated run the invalidate event's ID (SHA-256 of its canonical token).
    pub last_event_id: String,
    /// The last outbox ID handed off (what a policy built before the invalidate ID may report).
    pub last_outbox_id: String,
    pub invalidated: bool,
    pub watermark_saved: bool,
}

/// What a commit does with one delivered event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An outbox record with this event ID.
    HandOff(String),
    /// No record; the checkpoint moves past the event. The reason is logged.
    Skip(String),
    /// A quarantine record with this ID and reason.
    Quarantine { id: String, reason: String },
}

/// The verified result of a successful run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub status: Status,
    pub committed: Committed,
    pub consumer_id: String,
    /// The run was stopped by a signal before the policy finished; `committed` stands.
    pub stopped: bool,
}

struct Delivered {
    text: String,
    event: Document,
    invalidate: bool,
    /// The event's BSON size.
    bytes: usize,
}

/// One delivered event as a commit will write it.
#[derive(Default)]
struct Planned {
    token: Document,
    text: String,
    outbox: Option<Document>,
    quarantine: Option<Document>,
    handed_off: Option<String>,
    skipped: bool,
    quarantined: bool,
    invalidate: bool,
    /// The size of its record.
    bytes: usize,
}

/// The BSON size of a document (0 if it cannot be encoded, which a delivered event always can).
fn bson_size(document: &Document) -> usize {
    document.to_vec().map_or(0, |bytes| bytes.len())
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
    committed: Committed,
    failure: Option<HandoffError>,
    deadline: Option<Instant>,
    stop: StopSignal,
    stopped: bool,
    /// Events delivered so far, and how many the run may take.
    delivered: u32,
    max_events: Option<u32>,
    /// The host saved the stream's starting position while the policy still holds "no token":
    /// until its first commit, the policy's `expected: none` stands for that position.
    start_saved_for_policy: bool,
    bounds: Bounds,
}

fn rejected(what: impl std::fmt::Display) -> String {
    format!("policy decision rejected: {what}")
}

fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

impl Session {
    pub fn new(
        consumer: Consumer,
        deployment: Deployment,
        checkpoint: Checkpoint,
        source: Box<dyn ChangeSource>,
        store: Arc<dyn CheckpointStore>,
        deadline: Option<Instant>,
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
            committed: Committed::default(),
            failure: None,
            deadline,
            stop: StopSignal::default(),
            stopped: false,
            delivered: 0,
            max_events: None,
            start_saved_for_policy: false,
            bounds: Bounds::default(),
        }
    }

    /// Replaces the default byte and count bounds.
    pub fn with_bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
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

    pub fn stop_requested(&self) -> bool {
        self.stop.requested()
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

    /// Records the failure that ends the run (the first one wins) and returns its message.
    fn fail(&mut self, error: HandoffError) -> String {
        let message = error.to_string();
        tracing::warn!(kind = error.kind(), "run failed");
        if self.failure.is_none() {
            self.failure = Some(error);
        }
        message
    }

    /// Refuses any call once the run has failed or passed its deadline.
    fn gate(&mut self) -> Result<(), String> {
        if let Some(failure) = &self.failure {
            return Err(format!("the run has already failed: {failure}"));
        }
        if self.stopped || self.stop.requested() {
            if !self.stopped {
                tracing::warn!(
                    events = self.committed.events,
                    "stop requested; ending the run after its last commit"
                );
            }
            self.stopped = true;
            return Err("the run is stopping (signal received); nothing more is read".into());
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(self.fail(HandoffError::Policy(
                "the policy exceeded the run deadline; nothing after the last commit was written"
                    .into(),
            )));
        }
        Ok(())
    }

    fn stream_failure(&mut self, error: StreamError) -> StreamFailure {
        let detail = error.server_error().to_string();
        let message = if self.token.is_some() {
            format!("{RECONCILE_GUIDANCE} MongoDB error: {detail}")
        } else {
            format!("Change-stream read failed. MongoDB error: {detail}")
        };
        match error {
            StreamError::HistoryLost(_) => {
                StreamFailure::HistoryLost(self.fail(HandoffError::HistoryLost(message)))
            }
            StreamError::InvalidToken(_) => {
                StreamFailure::InvalidToken(self.fail(HandoffError::InvalidToken(message)))
            }
            StreamError::Fatal(_) => {
                StreamFailure::Fatal(self.fail(HandoffError::StreamFatal(message)))
            }
            StreamError::Unavailable(_) => {
                StreamFailure::Unavailable(self.fail(HandoffError::Unavailable(message)))
            }
            // The server's text names the event's token: only its code is repeated.
            StreamError::TooLarge(e) => {
                StreamFailure::Fatal(self.fail(HandoffError::EventTooLarge(format!(
                    "{EVENT_TOO_LARGE_GUIDANCE} MongoDB error: {} (code {BSON_OBJECT_TOO_LARGE})",
                    e.code_name
                ))))
            }
        }
    }

    pub fn open_stream(&mut self, start: Start) -> Result<(), StreamFailure> {
        self.gate().map_err(StreamFailure::Rejected)?;
        if self.stream_open {
            let m = self.fail(HandoffError::Policy(rejected("the stream is already open")));
            return Err(StreamFailure::Rejected(m));
        }
        let (text, start_after) = match start {
            Start::Now if self.token.is_none() => {
                self.open_source(StreamStart::Now)?;
                return self.save_start_position();
            }
            Start::Now => {
                let m = self.fail(HandoffError::Policy(rejected(
                    "a consumer with a saved token cannot start from now: that would skip history",
                )));
                return Err(StreamFailure::Rejected(m));
            }
            Start::ResumeAfter(text) => (text, false),
            Start::StartAfter(text) => (text, true),
        };
        let token = match (&self.token, &self.token_text) {
            (Some(token), Some(saved)) if *saved == text => token.clone(),
            _ => {
                let m = self.fail(HandoffError::Policy(rejected(
                    "a stream may only resume from the checkpoint's own token",
                )));
                return Err(StreamFailure::Rejected(m));
            }
        };
        if start_after != (self.mode == Mode::StartAfter) {
            let m = self.fail(HandoffError::Policy(rejected(format!(
                "the checkpoint's token was saved for {}; the stream must open with that mode",
                self.mode.as_str()
            ))));
            return Err(StreamFailure::Rejected(m));
        }
        self.open_source(if start_after {
            StreamStart::StartAfter(token)
        } else {
            StreamStart::ResumeAfter(token)
        })
    }

    fn open_source(&mut self, start: StreamStart) -> Result<(), StreamFailure> {
        match self.source.open(start) {
            Ok(()) => {
                self.stream_open = true;
                Ok(())
            }
            Err(error) => Err(self.stream_failure(error)),
        }
    }

    /// A fresh consumer's stream opened "now": its starting position (the first post-batch resume
    /// token) is saved with a compare-and-set before any event is delivered, so that a run that
    /// fails before its first commit cannot make the next one open "now" again and lose the
    /// events in between. A source that reports no position (a recording played from its start)
    /// has nothing to lose.
    fn save_start_position(&mut self) -> Result<(), StreamFailure> {
        let Some(start) = self.source.watermark() else {
            return Ok(());
        };
        self.move_checkpoint(
            start,
            "Checkpoint changed while saving the stream's starting position; retry from the current token",
            "Could not save the stream's starting position; nothing was handed off.",
        )
        .map_err(|failure| match failure {
            CommitFailure::Unavailable(m) => StreamFailure::Unavailable(m),
            CommitFailure::Conflict(m) | CommitFailure::Rejected(m) => StreamFailure::Rejected(m),
        })?;
        tracing::debug!("stream starting position saved");
        self.start_saved_for_policy = true;
        Ok(())
    }

    pub fn next_event(&mut self) -> Result<Option<EventView>, StreamFailure> {
        self.gate().map_err(StreamFailure::Rejected)?;
        if !self.stream_open {
            let m = self.fail(HandoffError::Policy(rejected(
                "`next` before `open-stream`",
            )));
            return Err(StreamFailure::Rejected(m));
        }
        let bounds = self.bounds;
        if self.pending.len() >= bounds.max_pending
            || self.pending_bytes >= bounds.max_pending_bytes
        {
            let m = self.fail(HandoffError::Policy(rejected(format!(
                "{} delivered events ({} bytes) are waiting for their commit (at most {} events or {} bytes)",
                self.pending.len(),
                self.pending_bytes,
                bounds.max_pending,
                bounds.max_pending_bytes
            ))));
            return Err(StreamFailure::Rejected(m));
        }
        if let Some(max) = self.max_events
            && self.delivered >= max
        {
            let m = self.fail(HandoffError::Policy(rejected(format!(
                "the run already read max_events = {max} events"
            ))));
            return Err(StreamFailure::Rejected(m));
        }
        let event = match self.source.next() {
            Ok(Some(event)) => event,
            Ok(None) => return Ok(None),
            Err(error) => return Err(self.stream_failure(error)),
        };
        let Ok(token) = event.get_document("_id") else {
            let m = self.fail(HandoffError::StreamFatal(
                "The change stream delivered an event without a resume token; refusing to continue"
                    .into(),
            ));
            return Err(StreamFailure::Fatal(m));
        };
        let text = canonical_text(token);
        let operation_type = event
            .get_str("operationType")
            .unwrap_or_default()
            .to_string();
        let namespace = event.get_document("ns").ok().and_then(|ns| {
            let db = ns.get_str("db").ok()?;
            Some(match ns.get_str("coll") {
                Ok(coll) => format!("{db}.{coll}"),
                Err(_) => db.to_string(),
            })
        });
        let cluster_time = match event.get("clusterTime") {
            Some(Bson::Timestamp(ts)) => Some((ts.time, ts.increment)),
            _ => None,
        };
        let view = EventView {
            token: text.clone(),
            operation_type: operation_type.clone(),
            namespace,
            cluster_time,
        };
        let bytes = bson_size(&event);
        tracing::debug!(operation_type = %escape_untrusted(&operation_type, 64), bytes, "event delivered");
        self.delivered += 1;
        self.pending_bytes += bytes;
        self.pending.push_back(Delivered {
            text,
            event,
            invalidate: operation_type == "invalidate",
            bytes,
        });
        Ok(Some(view))
    }

    pub fn watermark(&self) -> Option<String> {
        self.source.watermark().as_ref().map(canonical_text)
    }

    /// A field of a delivered event by dotted path, as relaxed Extended JSON text.
    pub fn field(&self, token: &str, path: &str) -> Option<String> {
        let delivered = self
            .pending
            .iter()
            .chain(self.recent.iter())
            .find(|d| d.text == token)?;
        let mut current = Bson::Document(delivered.event.clone());
        for part in path.split('.') {
            current = match current {
                Bson::Document(mut d) => d.remove(part)?,
                Bson::Array(mut items) => {
                    let index: usize = part.parse().ok()?;
                    if index >= items.len() {
                        return None;
                    }
                    items.swap_remove(index)
                }
                _ => return None,
            };
        }
        Some(value_text(&current))
    }

    fn check_expected(&mut self, expected: Option<&str>) -> Result<(), CommitFailure> {
        let holds = expected == self.token_text.as_deref()
            || (self.start_saved_for_policy && expected.is_none());
        if !holds {
            let m = self.fail(HandoffError::Policy(rejected(
                "`expected` is not the checkpoint token this run holds",
            )));
            return Err(CommitFailure::Rejected(m));
        }
        Ok(())
    }

    fn reject_commit(&mut self, what: impl std::fmt::Display) -> CommitFailure {
        CommitFailure::Rejected(self.fail(HandoffError::Policy(rejected(what))))
    }

    /// Commits the next delivered event (contract 1.0): an outbox record for every event but an
    /// invalidation, which must have none.
    pub fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), CommitFailure> {
        self.gate().map_err(CommitFailure::Rejected)?;
        let invalidate = self
            .pending
            .front()
            .is_some_and(|d| d.invalidate && d.text == next);
        let decision = match outbox_id {
            Some(id) => Decision::HandOff(id.to_string()),
            None if invalidate => Decision::Skip("invalidate".into()),
            None => {
                return Err(self.reject_commit(
                    "every event but an invalidation needs an outbox record (use commit-batch to skip)",
                ));
            }
        };
        self.commit_batch(expected, next, mode, vec![decision])
    }

    /// Commits the next delivered events in one transaction, one decision each, in delivery order.
    pub fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        decisions: Vec<Decision>,
    ) -> Result<(), CommitFailure> {
        self.gate().map_err(CommitFailure::Rejected)?;
        self.check_expected(expected)?;
        let count = decisions.len();
        if count == 0 {
            return Err(self.reject_commit("a commit must cover at least one delivered event"));
        }
        if count > MAX_BATCH {
            return Err(self.reject_commit(format!("a commit covers at most {MAX_BATCH} events")));
        }
        if count > self.pending.len() {
            return Err(self.reject_commit(if self.pending.is_empty() {
                "no delivered event is waiting for a commit".to_string()
            } else {
                format!(
                    "the commit covers {count} events but only {} were delivered",
                    self.pending.len()
                )
            }));
        }
        if self.pending[count - 1].text != next {
            let what = if self.pending.iter().any(|d| d.text == next) {
                "events must be committed in delivery order; this would skip a delivered event"
            } else {
                "the token was not delivered by the stream"
            };
            return Err(self.reject_commit(what));
        }
        let mut plan = Vec::with_capacity(count);
        let mut ids = std::collections::HashSet::new();
        for (index, decision) in decisions.iter().enumerate() {
            let delivered = &self.pending[index];
            if delivered.invalidate {
                if index != count - 1 || mode != Mode::StartAfter {
                    return Err(
                        self.reject_commit("an invalidate token must be saved with startAfter")
                    );
                }
                if !matches!(decision, Decision::Skip(_)) {
                    return Err(self
                        .reject_commit("an invalidate event is never handed off or quarantined"));
                }
            }
            let Ok(token) = delivered.event.get_document("_id") else {
                return Err(self.reject_commit("the event has no token"));
            };
            let mut step = Planned {
                token: token.clone(),
                text: delivered.text.clone(),
                ..Planned::default()
            };
            match decision {
                Decision::HandOff(id) | Decision::Quarantine { id, .. } => {
                    if !valid_id(id) {
                        return Err(self.reject_commit(format!(
                            "an outbox or quarantine ID must be 1-{MAX_ID_LEN} characters from [A-Za-z0-9._:-]"
                        )));
                    }
                    let key = format!("{}/{id}", self.consumer.consumer);
                    let kind = matches!(decision, Decision::HandOff(_));
                    if !ids.insert((kind, key.clone())) {
                        return Err(
                            self.reject_commit(format!("the ID {id} appears twice in one commit"))
                        );
                    }
                    let record = if let Decision::Quarantine { reason, .. } = decision {
                        let reason: String = reason.chars().take(1024).collect();
                        doc! {
                            "_id": key,
                            "consumer": &self.consumer.consumer,
                            "source": &self.consumer.source,
                            "token": token.clone(),
                            "reason": reason,
                            "event": delivered.event.clone(),
                        }
                    } else {
                        step.handed_off = Some(id.clone());
                        doc! {
                            "_id": key,
                            "consumer": &self.consumer.consumer,
                            "source": &self.consumer.source,
                            "event": delivered.event.clone(),
                        }
                    };
                    step.bytes = bson_size(&record);
                    if step.bytes > self.bounds.max_record_bytes {
                        return Err(self.record_too_large(id, step.bytes));
                    }
                    if kind {
                        step.outbox = Some(record);
                    } else {
                        step.quarantine = Some(record);
                        step.quarantined = true;
                    }
                }
                Decision::Skip(reason) => {
                    if !delivered.invalidate {
                        step.skipped = true;
                        tracing::info!(
                            reason = %escape_untrusted(reason, 200),
                            "event skipped by the policy"
                        );
                    }
                }
            }
            step.invalidate = delivered.invalidate;
            plan.push(step);
        }
        // Consecutive transactions of at most `max_transaction_bytes` of records each.
        let limit = self.bounds.max_transaction_bytes;
        let mut chunk_end = 0;
        while chunk_end < plan.len() {
            let chunk_start = chunk_end;
            let mut bytes = 0;
            while chunk_end < plan.len()
                && (chunk_end == chunk_start || bytes + plan[chunk_end].bytes <= limit)
            {
                bytes += plan[chunk_end].bytes;
                chunk_end += 1;
            }
            let last = chunk_end == plan.len();
            let chunk_mode = if last { mode } else { Mode::ResumeAfter };
            self.commit_planned(&mut plan[chunk_start..chunk_end], chunk_mode)?;
        }
        tracing::debug!(
            events = self.committed.events,
            batch = count,
            "event committed"
        );
        Ok(())
    }

    /// A record over MongoDB's document limit: nothing of the commit is written.
    fn record_too_large(&mut self, id: &str, bytes: usize) -> CommitFailure {
        let m = self.fail(HandoffError::EventTooLarge(format!(
            "{EVENT_TOO_LARGE_GUIDANCE} The record {id} would be {bytes} bytes, over the {}-byte document limit.",
            self.bounds.max_record_bytes
        )));
        CommitFailure::Rejected(m)
    }

    /// Writes the records of consecutive pending events and moves the checkpoint to the last
    /// of them, in one transaction; then takes them off the pending queue.
    fn commit_planned(&mut self, steps: &mut [Planned], mode: Mode) -> Result<(), CommitFailure> {
        let Some(last) = steps.last() else {
            return Ok(());
        };
        let next_token = last.token.clone();
        let next_text = last.text.clone();
        let outbox: Vec<Document> = steps.iter_mut().filter_map(|s| s.outbox.take()).collect();
        let quarantine: Vec<Document> = steps
            .iter_mut()
            .filter_map(|s| s.quarantine.take())
            .collect();
        let step = Commit {
            consumer: &self.consumer,
            expected: self.token.as_ref(),
            next: &next_token,
            mode,
            outbox,
            quarantine,
        };
        match self.store.commit(&step) {
            Ok(()) => {}
            Err(CommitError::Conflict) => {
                let m = self.fail(HandoffError::Conflict(
                    "Checkpoint changed during this run; retry from the current token".into(),
                ));
                return Err(CommitFailure::Conflict(m));
            }
            Err(CommitError::Duplicate(id)) => {
                let m = self.fail(HandoffError::Conflict(format!(
                    "A record {id} already exists; another run handed this event off. Retry from the current token"
                )));
                return Err(CommitFailure::Conflict(m));
            }
            Err(CommitError::Unavailable(detail)) => {
                let m = self.fail(HandoffError::Unavailable(format!(
                    "{RECONCILE_GUIDANCE} Store error: {detail}"
                )));
                return Err(CommitFailure::Unavailable(m));
            }
            Err(CommitError::TooLarge(id)) => {
                let m = self.fail(HandoffError::EventTooLarge(format!(
                    "{EVENT_TOO_LARGE_GUIDANCE} The record {id} is over the limit."
                )));
                return Err(CommitFailure::Rejected(m));
            }
        }
        for done in self.pending.drain(..steps.len()) {
            self.pending_bytes = self.pending_bytes.saturating_sub(done.bytes);
            self.recent.push_back(done);
        }
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        self.token_text = Some(next_text);
        self.token = Some(next_token);
        self.mode = mode;
        self.start_saved_for_policy = false;
        let c = &mut self.committed;
        for step in steps.iter() {
            c.events += 1;
            if let Some(id) = &step.handed_off {
                c.handed_off += 1;
                c.last_event_id = id.clone();
                c.last_outbox_id = id.clone();
            }
            if step.skipped {
                c.skipped += 1;
            }
            if step.quarantined {
                c.quarantined += 1;
            }
            if step.invalidate {
                c.invalidated = true;
                // The baseline reports the invalidate event's own ID.
                c.last_event_id = hex::encode(Sha256::digest(step.text.as_bytes()));
            }
        }
        Ok(())
    }

    pub fn advance_watermark(
        &mut self,
        expected: Option<&str>,
        next: &str,
    ) -> Result<(), CommitFailure> {
        self.gate().map_err(CommitFailure::Rejected)?;
        self.check_expected(expected)?;
        if !self.pending.is_empty() {
            return Err(self.reject_commit(
                "the watermark can only be saved once every delivered event is committed",
            ));
        }
        let Some(watermark) = self.source.watermark() else {
            return Err(self.reject_commit("the stream has reported no watermark"));
        };
        if canonical_text(&watermark) != next {
            return Err(self.reject_commit("the token is not the stream's current watermark"));
        }
        if self.committed.invalidated {
            return Err(self.reject_commit("an invalidated stream has no watermark to save"));
        }
        if self.token_text.as_deref() == Some(next) {
            return Ok(());
        }
        self.move_checkpoint(
            watermark,
            "Checkpoint changed while saving the idle watermark",
            RECONCILE_GUIDANCE,
        )?;
        self.committed.watermark_saved = true;
        Ok(())
    }

    /// Moves the checkpoint from the token this run holds to `next` (resumeAfter), writing no
    /// record: the stream's starting position or its idle watermark.
    fn move_checkpoint(
        &mut self,
        next: Document,
        on_conflict: &str,
        on_unavailable: &str,
    ) -> Result<(), CommitFailure> {
        let step = Commit {
            consumer: &self.consumer,
            expected: self.token.as_ref(),
            next: &next,
            mode: Mode::ResumeAfter,
            outbox: Vec::new(),
            quarantine: Vec::new(),
        };
        match self.store.commit(&step) {
            Ok(()) => {}
            Err(CommitError::Conflict | CommitError::Duplicate(_)) => {
                let m = self.fail(HandoffError::Conflict(on_conflict.into()));
                return Err(CommitFailure::Conflict(m));
            }
            Err(CommitError::Unavailable(detail) | CommitError::TooLarge(detail)) => {
                let m = self.fail(HandoffError::Unavailable(format!(
                    "{on_unavailable} Store error: {detail}"
                )));
                return Err(CommitFailure::Unavailable(m));
            }
        }
        self.token_text = Some(canonical_text(&next));
        self.token = Some(next);
        self.mode = Mode::ResumeAfter;
        Ok(())
    }

    pub fn now_ms(&self) -> u64 {
        self.source.now_ms()
    }

    /// Checks the policy's outcome against what the host saw committed.
    pub fn finish(&mut self, outcome: Result<Report, String>) -> Result<Summary, HandoffError> {
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        if self.stopped || self.stop.requested() {
            return Ok(self.stopped_summary());
        }
        let report =
            outcome.map_err(|message| HandoffError::Policy(escape_untrusted(&message, 1024)))?;
        let c = &self.committed;
        let expected_status = self.stopped_summary().status;
        // An invalidated run reports the invalidate event's ID; a policy built before the host
        // reported it may still report its last outbox ID.
        let id_matches = report.last_event_id == c.last_event_id
            || (c.invalidated && report.last_event_id == c.last_outbox_id);
        if report.status != expected_status
            || report.events_handed_off != c.handed_off
            || !id_matches
        {
            return Err(HandoffError::Policy(format!(
                "the policy's report ({} event(s), status {}) disagrees with what was committed ({} event(s), status {}); \
                 the committed events stand",
                report.events_handed_off,
                report.status.as_str(),
                c.handed_off,
                expected_status.as_str()
            )));
        }
        Ok(Summary {
            status: report.status,
            committed: c.clone(),
            consumer_id: self.consumer.consumer.clone(),
            stopped: false,
        })
    }

    /// The summary of a stopped run: its status follows from what was committed.
    fn stopped_summary(&self) -> Summary {
        let c = &self.committed;
        Summary {
            status: if c.invalidated {
                Status::Invalidated
            } else if c.handed_off > 0 {
                Status::HandedOff
            } else {
                Status::Idle
            },
            committed: c.clone(),
            consumer_id: self.consumer.consumer.clone(),
            stopped: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::backend::memory::MemoryStore;
    use crate::backend::replay::ReplaySource;
    use crate::backend::{Dump, StreamStart};
    use crate::fixture::Fixture;

    /// A memory store that remembers the size of every transaction it committed.
    #[derive(Default)]
    struct Counting {
        inner: MemoryStore,
        transactions: Mutex<Vec<(usize, usize)>>,
    }

    impl CheckpointStore for Counting {
        fn ensure_checkpoint(
            &self,
            consumer: &str,
            initial: Document,
        ) -> Result<Document, CommitError> {
            self.inner.ensure_checkpoint(consumer, initial)
        }
        fn commit(&self, commit: &Commit<'_>) -> Result<(), CommitError> {
            self.inner.commit(commit)?;
            let bytes = commit.outbox.iter().map(bson_size).sum();
            self.transactions
                .lock()
                .unwrap()
                .push((commit.outbox.len(), bytes));
            Ok(())
        }
        fn dump(&self, consumer: &str) -> Result<Dump, CommitError> {
            self.inner.dump(consumer)
        }
    }

    fn token(seq: u32) -> Document {
        doc! {"_data": format!("82{seq:08X}2B0429296E1404")}
    }

    /// A recording of `sizes.len()` inserts, the n-th carrying a string of `sizes[n]` bytes.
    fn fixture(sizes: &[usize], last_invalidate: bool) -> Arc<Fixture> {
        let mut text = String::new();
        for (n, size) in sizes.iter().enumerate() {
            let seq = n as u32 + 1;
            let op = if last_invalidate && n + 1 == sizes.len() {
                "invalidate"
            } else {
                "insert"
            };
            let event = doc! {
                "_id": token(seq),
                "operationType": op,
                "ns": {"db": "d", "coll": "c"},
                "fullDocument": {"_id": seq, "pad": "x".repeat(*size)},
            };
            let json = bson::Bson::Document(event).into_relaxed_extjson();
            text.push_str(&json.to_string());
            text.push('\n');
        }
        Arc::new(Fixture::parse(&text).expect("fixture"))
    }

    fn session(
        fixture: Arc<Fixture>,
        store: Arc<dyn CheckpointStore>,
        token: Option<Document>,
        mode: Mode,
    ) -> Session {
        let consumer = Consumer {
            consumer: "c".into(),
            source: "d.c".into(),
        };
        let mut initial = crate::checkpoint::initial("c", "d.c", "0");
        if let Some(t) = &token {
            initial.insert("token", t.clone());
            initial.insert("mode", mode.as_str());
        }
        store.ensure_checkpoint("c", initial).unwrap();
        Session::new(
            consumer,
            Deployment {
                set_name: "rs".into(),
                replica_set_id: "0".into(),
            },
            Checkpoint { token, mode },
            Box::new(ReplaySource::new(fixture)),
            store,
            None,
        )
    }

    fn deliver(session: &mut Session, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| session.next_event().unwrap().expect("an event").token)
            .collect()
    }

    #[test]
    fn a_batch_over_the_transaction_bound_is_written_as_consecutive_transactions() {
        let store = Arc::new(Counting::default());
        let mut s = session(
            fixture(&[3000; 10], false),
            store.clone(),
            None,
            Mode::ResumeAfter,
        )
        .with_bounds(Bounds {
            max_transaction_bytes: 10_000,
            ..Bounds::default()
        });
        s.open_stream(Start::Now).unwrap();
        let tokens = deliver(&mut s, 10);
        let decisions = (0..10)
            .map(|i| Decision::HandOff(format!("e{i}")))
            .collect();
        s.commit_batch(None, &tokens[9], Mode::ResumeAfter, decisions)
            .unwrap();
        let transactions = store.transactions.lock().unwrap().clone();
        assert!(transactions.len() >= 4, "{transactions:?}");
        assert_eq!(transactions.iter().map(|t| t.0).sum::<usize>(), 10);
        assert!(
            transactions.iter().all(|t| t.1 <= 10_000),
            "{transactions:?}"
        );
        assert_eq!(s.committed().handed_off, 10);
        assert_eq!(s.checkpoint().0.as_deref(), Some(tokens[9].as_str()));
        let dump = store.dump("c").unwrap();
        assert_eq!(dump.outbox.len(), 10);
    }

    #[test]
    fn a_record_over_the_document_limit_writes_nothing() {
        let store = Arc::new(Counting::default());
        let mut s = session(
            fixture(&[100, 5000], false),
            store.clone(),
            None,
            Mode::ResumeAfter,
        )
        .with_bounds(Bounds {
            max_record_bytes: 4000,
            ..Bounds::default()
        });
        s.open_stream(Start::Now).unwrap();
        let tokens = deliver(&mut s, 2);
        let decisions = vec![Decision::HandOff("a".into()), Decision::HandOff("b".into())];
        let error = s
            .commit_batch(None, &tokens[1], Mode::ResumeAfter, decisions)
            .unwrap_err();
        assert!(format!("{error:?}").contains("document limit"), "{error:?}");
        assert!(store.transactions.lock().unwrap().is_empty());
        assert!(store.dump("c").unwrap().outbox.is_empty());
    }

    #[test]
    fn pending_events_are_bounded_by_bytes() {
        let store = Arc::new(MemoryStore::new());
        let mut s = session(fixture(&[3000; 5], false), store, None, Mode::ResumeAfter)
            .with_bounds(Bounds {
                max_pending_bytes: 7000,
                ..Bounds::default()
            });
        s.open_stream(Start::Now).unwrap();
        deliver(&mut s, 3);
        let error = s.next_event().unwrap_err();
        assert!(
            matches!(error, StreamFailure::Rejected(ref m) if m.contains("waiting for their commit")),
            "{error:?}"
        );
        assert!(matches!(s.failure(), Some(HandoffError::Policy(_))));
    }

    #[test]
    fn the_host_enforces_max_events() {
        let store = Arc::new(MemoryStore::new());
        let mut s =
            session(fixture(&[10; 5], false), store, None, Mode::ResumeAfter).with_max_events(2);
        s.open_stream(Start::Now).unwrap();
        deliver(&mut s, 2);
        let error = s.next_event().unwrap_err();
        assert!(
            matches!(error, StreamFailure::Rejected(ref m) if m.contains("max_events = 2")),
            "{error:?}"
        );
    }

    #[test]
    fn the_stream_opens_only_with_the_saved_mode() {
        for (saved, asked) in [
            (
                Mode::StartAfter,
                Start::ResumeAfter(canonical_text(&token(1))),
            ),
            (
                Mode::ResumeAfter,
                Start::StartAfter(canonical_text(&token(1))),
            ),
        ] {
            let store = Arc::new(MemoryStore::new());
            let mut s = session(fixture(&[10; 3], false), store, Some(token(1)), saved);
            let error = s.open_stream(asked).unwrap_err();
            assert!(
                matches!(error, StreamFailure::Rejected(ref m) if m.contains("must open with that mode")),
                "{error:?}"
            );
        }
        let store = Arc::new(MemoryStore::new());
        let mut s = session(
            fixture(&[10; 3], false),
            store,
            Some(token(1)),
            Mode::StartAfter,
        );
        s.open_stream(Start::StartAfter(canonical_text(&token(1))))
            .unwrap();
    }

    /// A source whose "now" has a position, as a live stream's first post-batch token.
    struct Positioned(ReplaySource, Document);

    impl ChangeSource for Positioned {
        fn deployment(&mut self) -> crate::error::Result<Deployment> {
            self.0.deployment()
        }
        fn open(&mut self, start: StreamStart) -> Result<(), StreamError> {
            self.0.open(start)
        }
        fn next(&mut self) -> Result<Option<Document>, StreamError> {
            self.0.next()
        }
        fn watermark(&self) -> Option<Document> {
            self.0.watermark().or_else(|| Some(self.1.clone()))
        }
        fn now_ms(&self) -> u64 {
            self.0.now_ms()
        }
    }

    #[test]
    fn a_fresh_stream_saves_its_starting_position_before_delivering_anything() {
        let store = Arc::new(MemoryStore::new());
        let mut s = session(
            fixture(&[10; 2], false),
            store.clone(),
            None,
            Mode::ResumeAfter,
        );
        s.source = Box::new(Positioned(
            ReplaySource::new(fixture(&[10; 2], false)),
            token(0),
        ));
        s.open_stream(Start::Now).unwrap();
        // Saved before any event is read: a run that fails now leaves the position behind.
        let saved = store.dump("c").unwrap().checkpoint.unwrap();
        assert_eq!(saved.get_document("token").unwrap(), &token(0));
        // The policy still holds "no token" and may commit from it.
        let tokens = deliver(&mut s, 1);
        s.commit(None, &tokens[0], Mode::ResumeAfter, Some("a"))
            .unwrap();
        // After its first commit, only the real token is accepted.
        let tokens = deliver(&mut s, 1);
        assert!(
            s.commit(None, &tokens[0], Mode::ResumeAfter, Some("b"))
                .is_err()
        );
    }

    #[test]
    fn an_invalidated_run_reports_the_invalidate_events_id() {
        let store = Arc::new(MemoryStore::new());
        let mut s = session(fixture(&[10; 2], true), store, None, Mode::ResumeAfter);
        s.open_stream(Start::Now).unwrap();
        let tokens = deliver(&mut s, 2);
        s.commit(None, &tokens[0], Mode::ResumeAfter, Some("a"))
            .unwrap();
        s.commit(Some(&tokens[0]), &tokens[1], Mode::StartAfter, None)
            .unwrap();
        let invalidate_id = hex::encode(Sha256::digest(tokens[1].as_bytes()));
        assert_eq!(s.committed().last_event_id, invalidate_id);
        let report = |id: &str| Report {
            status: Status::Invalidated,
            events_handed_off: 1,
            last_event_id: id.into(),
        };
        // Both the baseline's ID and, from older policies, the last outbox ID are accepted.
        let summary = s.finish(Ok(report(&invalidate_id))).unwrap();
        assert_eq!(summary.committed.last_event_id, invalidate_id);
        assert!(s.finish(Ok(report("a"))).is_ok());
        assert!(s.finish(Ok(report("zz"))).is_err());
    }
}
