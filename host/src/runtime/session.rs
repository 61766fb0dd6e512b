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
use crate::token::{canonical_text, value_text};

/// The longest outbox ID a policy may choose.
pub const MAX_ID_LEN: usize = 200;
/// How many delivered events may wait for their commit.
pub const MAX_PENDING: usize = 1000;
/// How many events one commit may cover.
pub const MAX_BATCH: usize = 500;
/// How many committed events stay readable through `field`.
const RECENT: usize = 16;

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
    pub last_event_id: String,
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
    recent: VecDeque<Delivered>,
    committed: Committed,
    failure: Option<HandoffError>,
    deadline: Option<Instant>,
    stop: StopSignal,
    stopped: bool,
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
            recent: VecDeque::new(),
            committed: Committed::default(),
            failure: None,
            deadline,
            stop: StopSignal::default(),
            stopped: false,
        }
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
            Start::Now if self.token.is_none() => return self.open_source(StreamStart::Now),
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

    pub fn next_event(&mut self) -> Result<Option<EventView>, StreamFailure> {
        self.gate().map_err(StreamFailure::Rejected)?;
        if !self.stream_open {
            let m = self.fail(HandoffError::Policy(rejected(
                "`next` before `open-stream`",
            )));
            return Err(StreamFailure::Rejected(m));
        }
        if self.pending.len() >= MAX_PENDING {
            let m = self.fail(HandoffError::Policy(rejected(format!(
                "{MAX_PENDING} delivered events are waiting for their commit"
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
        tracing::debug!(operation_type = %operation_type, "event delivered");
        self.pending.push_back(Delivered {
            text,
            event,
            invalidate: operation_type == "invalidate",
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
        if expected != self.token_text.as_deref() {
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
        let mut outbox = Vec::new();
        let mut quarantine = Vec::new();
        let mut ids = std::collections::HashSet::new();
        let (mut handed_off, mut skipped, mut last_id) = (0u32, 0u32, None);
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
                    if let Decision::Quarantine { reason, .. } = decision {
                        let reason: String = reason.chars().take(1024).collect();
                        quarantine.push(doc! {
                            "_id": key,
                            "consumer": &self.consumer.consumer,
                            "source": &self.consumer.source,
                            "token": token.clone(),
                            "reason": reason,
                            "event": delivered.event.clone(),
                        });
                    } else {
                        handed_off += 1;
                        last_id = Some(id.clone());
                        outbox.push(doc! {
                            "_id": key,
                            "consumer": &self.consumer.consumer,
                            "source": &self.consumer.source,
                            "event": delivered.event.clone(),
                        });
                    }
                }
                Decision::Skip(reason) => {
                    if !delivered.invalidate {
                        skipped += 1;
                        let reason: String = reason.chars().take(200).collect();
                        tracing::info!(reason = %reason, "event skipped by the policy");
                    }
                }
            }
        }
        let Ok(next_token) = self.pending[count - 1].event.get_document("_id").cloned() else {
            return Err(self.reject_commit("the event has no token"));
        };
        let invalidated = self.pending[count - 1].invalidate;
        let quarantined = quarantine.len() as u32;
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
        for done in self.pending.drain(..count) {
            self.recent.push_back(done);
        }
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        self.token_text = Some(next.to_string());
        self.token = Some(next_token);
        self.mode = mode;
        let c = &mut self.committed;
        c.events += count as u32;
        c.handed_off += handed_off;
        c.skipped += skipped;
        c.quarantined += quarantined;
        if let Some(id) = last_id {
            c.last_event_id = id;
        }
        c.invalidated |= invalidated;
        tracing::debug!(events = c.events, batch = count, "event committed");
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
        let step = Commit {
            consumer: &self.consumer,
            expected: self.token.as_ref(),
            next: &watermark,
            mode: Mode::ResumeAfter,
            outbox: Vec::new(),
            quarantine: Vec::new(),
        };
        match self.store.commit(&step) {
            Ok(()) => {}
            Err(CommitError::Conflict | CommitError::Duplicate(_)) => {
                let m = self.fail(HandoffError::Conflict(
                    "Checkpoint changed while saving the idle watermark".into(),
                ));
                return Err(CommitFailure::Conflict(m));
            }
            Err(CommitError::Unavailable(detail) | CommitError::TooLarge(detail)) => {
                let m = self.fail(HandoffError::Unavailable(format!(
                    "{RECONCILE_GUIDANCE} Store error: {detail}"
                )));
                return Err(CommitFailure::Unavailable(m));
            }
        }
        self.token_text = Some(next.to_string());
        self.token = Some(watermark);
        self.mode = Mode::ResumeAfter;
        self.committed.watermark_saved = true;
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
        let report = outcome.map_err(HandoffError::Policy)?;
        let c = &self.committed;
        let expected_status = self.stopped_summary().status;
        if report.status != expected_status
            || report.events_handed_off != c.handed_off
            || report.last_event_id != c.last_event_id
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
