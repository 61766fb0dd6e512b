//! Write a `handoff` policy as decisions only.
//!
//! A handoff policy is a WebAssembly component that the `handoff` host runs to move MongoDB
//! change events into a durable outbox. The host owns the stream, every transaction and the
//! checkpoint; the policy drives the run through the host's imports. This crate owns that run
//! loop, exactly as the default policy (the baseline task) runs it, so a policy supplies only what
//! is its own:
//!
//! - [`Policy::decide`]: what becomes of each delivered event — hand it off under an ID
//!   ([`Decision::HandOff`]), as a shaped domain event ([`Decision::Record`]), skip it
//!   ([`Decision::Skip`]) or quarantine it ([`Decision::Quarantine`]) — given the event (token,
//!   operation type, namespace, cluster time, and any field through [`Delivered::field`]) and
//!   its baseline ID;
//! - snapshot events too: `backfill` and `reconcile --repair` hand the watched collection's
//!   documents to the same [`Policy::decide`], as events whose operation type is `snapshot`
//!   ([`Event::is_snapshot`]; `fullDocument` is the document, `null` for one the source no longer
//!   holds), through the same run loop ([`RunKind`] tells the runs apart);
//! - optionally [`Policy::batch_size`] (events per transaction, default 1), construction from the
//!   run's [`Settings`] ([`FromSettings`], for parameters) and [`Policy::finish`] (end of run).
//!
//! [`run`] drives one bounded run: resume from the checkpoint (`resumeAfter`, or `startAfter`
//! after an invalidation, or now when there is none), commit events in delivery order (a batch is
//! committed when full, when the stream is caught up, at an invalidation and at the end of the
//! run), skip every invalidation and end the run there (saved with `startAfter`), stop after
//! `max_events` or `max_wait_ms` without an event, save the idle watermark without ever leaving
//! an uncheckpointed gap, and report.
//!
//! The loop is plain Rust over the [`Host`] trait, so a whole run unit-tests natively against
//! [`fake::FakeHost`]. Built for `wasm32`, `export_policy!` exports a policy as the component's
//! `handoff:policy/policy.run`, on the contract's bindings generated here from `wit/policy.wit`.
//!
//! # Example
//!
//! A policy that hands off everything but deletes, tested over a whole run:
//!
//! ```
//! use handoff_policy_sdk::fake::FakeHost;
//! use handoff_policy_sdk::{Decision, Delivered, Policy, Settings, Status, event_id};
//!
//! #[derive(Default)]
//! pub struct NoDeletes;
//!
//! impl Policy for NoDeletes {
//!     fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
//!         if event.operation_type == "delete" {
//!             Decision::Skip("deletes are not published".into())
//!         } else {
//!             Decision::HandOff(id)
//!         }
//!     }
//! }
//!
//! // In the component: handoff_policy_sdk::export_policy!(NoDeletes);
//!
//! let mut host = FakeHost::new()
//!     .event("A", "insert")
//!     .event("B", "delete")
//!     .event("C", "update")
//!     .watermark("W");
//! let report = handoff_policy_sdk::run::<NoDeletes>(&mut host, &Settings::new(50, 3000)).unwrap();
//! assert_eq!(report.status, Status::HandedOff);
//! assert_eq!(report.events_handed_off, 2);
//! assert_eq!(host.handed_off(), vec![event_id("A"), event_id("C")]);
//! assert_eq!(host.token(), Some("W")); // the idle watermark was saved
//! ```

#[cfg(target_arch = "wasm32")]
pub mod component;
pub mod fake;

use std::fmt;

use sha2::{Digest, Sha256};

/// The most events one commit may cover.
pub const MAX_BATCH: usize = 500;

/// How a stream resumes from a saved token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// After the token's event (`resumeAfter`).
    ResumeAfter,
    /// After the token (`startAfter`): the only way past an invalidation.
    StartAfter,
}

/// The checkpoint as the host loaded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The last committed token; `None` for a consumer that has never committed.
    pub token: Option<String>,
    /// How the next stream must resume from `token`.
    pub mode: Mode,
}

/// What the run is pinned to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deployment {
    /// The stable consumer identity.
    pub consumer: String,
    /// The watched namespace, `database.collection`.
    pub source: String,
    /// The replica set's ID, as a hex ObjectId.
    pub replica_set_id: String,
}

/// Where the stream opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// At the deployment's current time (no saved token).
    Now,
    /// `resumeAfter` the checkpoint's token.
    ResumeAfter(String),
    /// `startAfter` the checkpoint's token.
    StartAfter(String),
}

/// One change event as the stream delivered it; further fields are read through the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event's `_id`, its resume token, in canonical text form (opaque but for hashing).
    pub token: String,
    /// `operationType`: insert, update, replace, delete, drop, rename, dropDatabase,
    /// invalidate, or any type a newer server sends.
    pub operation_type: String,
    /// `ns` as `database.collection`, when the event has one.
    pub namespace: Option<String>,
    /// `clusterTime` as seconds since the epoch and increment, when present.
    pub cluster_time: Option<(u32, u32)>,
}

impl Event {
    /// An event with a token and an operation type, without namespace or cluster time.
    pub fn new(token: impl Into<String>, operation_type: impl Into<String>) -> Event {
        Event {
            token: token.into(),
            operation_type: operation_type.into(),
            namespace: None,
            cluster_time: None,
        }
    }

    /// Whether this event invalidates the stream (it is then skipped and ends the run).
    pub fn is_invalidate(&self) -> bool {
        self.operation_type == "invalidate"
    }

    /// Whether this event is a document an operator command read (`backfill`, `reconcile
    /// --repair`), not a change: `fullDocument` holds the document as read, or `null` when the
    /// source no longer holds it (contract 1.3).
    pub fn is_snapshot(&self) -> bool {
        self.operation_type == SNAPSHOT
    }
}

/// The operation type of a snapshot event (contract 1.3).
pub const SNAPSHOT: &str = "snapshot";

/// What a run reads (contract 1.3). The run loop is the same for every kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunKind {
    /// The change stream, live or replayed.
    #[default]
    Changes,
    /// The watched collection's existing documents, as `snapshot` events (`handoff backfill`).
    Backfill,
    /// Documents the consumer's outbox disagrees with, as `snapshot` events (`handoff
    /// reconcile`).
    Repair,
}

/// The run's outcome as reported to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Caught up without handing off an event.
    Idle,
    /// At least one event was handed off and the stream was not invalidated.
    HandedOff,
    /// The stream was invalidated; its token is saved with `startAfter`.
    Invalidated,
}

/// The limits and parameters of one run, validated by the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Stop after this many events (1-500).
    pub max_events: u32,
    /// Stop after this long without an event, in milliseconds; restarts after each event.
    pub max_wait_ms: u64,
    /// Policy parameters, `key=value` pairs given to the host (`--policy-param`).
    pub params: Vec<(String, String)>,
}

impl Settings {
    /// Settings without parameters.
    pub fn new(max_events: u32, max_wait_ms: u64) -> Settings {
        Settings {
            max_events,
            max_wait_ms,
            params: Vec::new(),
        }
    }

    /// The same settings with one more parameter.
    pub fn param_set(mut self, key: impl Into<String>, value: impl Into<String>) -> Settings {
        self.params.push((key.into(), value.into()));
        self
    }

    /// A policy parameter by key.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An outbox record shaped by the policy (contract 1.2): a domain event with a stable business
/// schema. `aggregate_id`, `aggregate_version` and `payload` are Extended JSON text (what
/// [`Delivered::field`] returns reads back as is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The event ID.
    pub id: String,
    /// `eventType`, e.g. `OrderCreated`: 1-100 characters from `[A-Za-z0-9._:-]`.
    pub event_type: String,
    pub schema_version: u32,
    /// One Extended JSON value, e.g. `"o-5"`; at most 1 KiB.
    pub aggregate_id: String,
    /// One Extended JSON value, when known.
    pub aggregate_version: Option<String>,
    /// One Extended JSON document (no `_id` at its top level, no `$` keys); at most 4 MiB.
    pub payload: String,
}

/// What becomes of one delivered event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An outbox record (the change event as delivered) with this event ID: 1 to 200
    /// characters from `[A-Za-z0-9._:-]`.
    HandOff(String),
    /// This policy-shaped outbox record (contract 1.2).
    Record(Box<Record>),
    /// No record; the checkpoint moves past the event and the host logs the reason.
    Skip(String),
    /// A quarantine record (the event as delivered, its token and the reason) with this ID,
    /// instead of an outbox record: a poison event never blocks the stream.
    Quarantine { id: String, reason: String },
}

impl Decision {
    /// The outbox ID of a hand-off, `None` for a skip or a quarantine.
    pub fn handed_off(&self) -> Option<&str> {
        match self {
            Decision::HandOff(id) => Some(id),
            Decision::Record(record) => Some(&record.id),
            Decision::Skip(_) | Decision::Quarantine { .. } => None,
        }
    }
}

/// The report of a successful run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub status: Status,
    /// Outbox records committed by this run.
    pub events_handed_off: u32,
    /// The last committed outbox ID (the invalidate event's baseline ID when invalidated),
    /// empty when none.
    pub last_event_id: String,
}

/// The level of a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Why the stream failed, as the host classified the server's error. Displays as the host's
/// message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// The token fell off the retained history: events may be missing.
    HistoryLost(String),
    /// The token cannot be used with this mode.
    InvalidToken(String),
    /// The server refused to continue the stream.
    Fatal(String),
    /// The backend is unavailable after the host's retries.
    Unavailable(String),
    /// The request broke the contract.
    Rejected(String),
}

impl StreamError {
    /// The host's message.
    pub fn message(&self) -> &str {
        match self {
            StreamError::HistoryLost(m)
            | StreamError::InvalidToken(m)
            | StreamError::Fatal(m)
            | StreamError::Unavailable(m)
            | StreamError::Rejected(m) => m,
        }
    }
}

/// Why a commit or a watermark advance was not applied; nothing was written. Displays as the
/// host's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitError {
    /// The checkpoint is not at `expected` any more: another run moved it.
    Conflict(String),
    /// The host refused the decision.
    Rejected(String),
    /// The backend failed after its retries.
    Unavailable(String),
}

impl CommitError {
    /// The host's message.
    pub fn message(&self) -> &str {
        match self {
            CommitError::Conflict(m) | CommitError::Rejected(m) | CommitError::Unavailable(m) => m,
        }
    }
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl fmt::Display for CommitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for StreamError {}
impl std::error::Error for CommitError {}

/// A run's error is the host's message: the host keeps the classification of every failure it
/// reported.
impl From<StreamError> for String {
    fn from(error: StreamError) -> String {
        error.to_string()
    }
}

impl From<CommitError> for String {
    fn from(error: CommitError) -> String {
        error.to_string()
    }
}

/// Everything the host grants a policy (the `host` interface of `wit/policy.wit`). On wasm32,
/// `component::WitHost` implements it over the imports; [`fake::FakeHost`] implements it
/// natively for tests.
pub trait Host {
    /// The deployment this run is pinned to.
    fn deployment(&mut self) -> Deployment;
    /// The checkpoint as loaded before the run started.
    fn load_checkpoint(&mut self) -> Checkpoint;
    /// What this run reads (contract 1.3).
    fn run_kind(&mut self) -> RunKind {
        RunKind::Changes
    }
    /// Opens the change stream (at most one per run). A token in `start` must be the
    /// checkpoint's.
    fn open(&mut self, start: Start) -> Result<(), StreamError>;
    /// The next event, waiting at most the stream's await bound; `None` when caught up for now.
    fn next(&mut self) -> Result<Option<Event>, StreamError>;
    /// The stream's current resume position, `None` before the server reported one.
    fn watermark(&mut self) -> Option<String>;
    /// A field of a delivered event by dotted path, as relaxed Extended JSON text.
    fn field(&mut self, token: &str, path: &str) -> Option<String>;
    /// Commits the next delivered event (contract 1.0): an outbox record under `outbox_id`, or
    /// none for an invalidation.
    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), CommitError>;
    /// Commits the next delivered events, one decision each in delivery order ending with the
    /// event whose token is `next`, in one transaction (contract 1.1; with [`Decision::Record`],
    /// 1.2). A record the outbox already holds for the same event (a checkpoint moved back) is
    /// not written twice: the host counts it as a suppressed duplicate.
    fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        decisions: Vec<Decision>,
    ) -> Result<(), CommitError>;
    /// Saves the stream's watermark as the checkpoint (`resumeAfter`), once every delivered
    /// event is committed.
    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), CommitError>;
    /// Milliseconds on a monotonic clock (virtual against a replay backend).
    fn now_ms(&mut self) -> u64;
    /// A structured log line through the host's logger (messages are cut at 1 KiB).
    fn log(&mut self, level: Level, message: &str, fields: &[(&str, &str)]);
}

/// A delivered event while the policy decides about it: the [`Event`] (it dereferences to it)
/// and what the policy may ask of the host meanwhile. The run loop keeps the stream and the
/// commits to itself.
pub struct Delivered<'a> {
    event: &'a Event,
    host: &'a mut dyn Host,
}

impl<'a> Delivered<'a> {
    /// The event as delivered by `host` (for tests of [`Policy::decide`] alone).
    pub fn new(event: &'a Event, host: &'a mut dyn Host) -> Delivered<'a> {
        Delivered { event, host }
    }

    /// The event.
    pub fn event(&self) -> &Event {
        self.event
    }

    /// A field of the event by dotted path (e.g. `fullDocument.status`), as relaxed Extended
    /// JSON text; `None` when absent.
    pub fn field(&mut self, path: &str) -> Option<String> {
        self.host.field(&self.event.token, path)
    }

    /// A structured log line through the host's logger.
    pub fn log(&mut self, level: Level, message: &str, fields: &[(&str, &str)]) {
        self.host.log(level, message, fields);
    }

    /// The deployment this run is pinned to.
    pub fn deployment(&mut self) -> Deployment {
        self.host.deployment()
    }

    /// What this run reads: the change stream, or a snapshot's documents.
    pub fn run_kind(&mut self) -> RunKind {
        self.host.run_kind()
    }

    /// Milliseconds on the host's monotonic clock.
    pub fn now_ms(&mut self) -> u64 {
        self.host.now_ms()
    }
}

impl std::ops::Deref for Delivered<'_> {
    type Target = Event;

    fn deref(&self) -> &Event {
        self.event
    }
}

/// How a policy is built from the run's settings. Every `Default` type has it (parameters are
/// then ignored); a policy with parameters implements it instead of `Default`, returning a clear
/// message for a bad parameter (the run fails with it before the stream opens). (A type cannot
/// have both: implementing it for a `Default` type conflicts with this blanket implementation.)
///
/// ```
/// use handoff_policy_sdk::{FromSettings, Settings};
///
/// struct Prefixed {
///     prefix: String,
/// }
///
/// impl FromSettings for Prefixed {
///     fn from_settings(settings: &Settings) -> Result<Prefixed, String> {
///         match settings.param("prefix") {
///             Some(p) if !p.is_empty() && p.len() <= 20 => Ok(Prefixed { prefix: p.into() }),
///             Some(p) => Err(format!("prefix must be 1-20 characters, not {p:?}")),
///             None => Err("the prefix parameter is required".into()),
///         }
///     }
/// }
///
/// assert!(Prefixed::from_settings(&Settings::default()).is_err());
/// let settings = Settings::default().param_set("prefix", "shop");
/// assert_eq!(Prefixed::from_settings(&settings).unwrap().prefix, "shop");
/// ```
pub trait FromSettings: Sized {
    fn from_settings(settings: &Settings) -> Result<Self, String>;
}

impl<T: Default> FromSettings for T {
    fn from_settings(_settings: &Settings) -> Result<T, String> {
        Ok(T::default())
    }
}

/// A policy's decisions; [`run`] drives everything else.
pub trait Policy: FromSettings {
    /// What becomes of one delivered event, given its baseline ID ([`event_id`] of its token).
    /// Never called for an invalidation: the run skips it and ends there.
    fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision;

    /// How many events one transaction commits, 1 to [`MAX_BATCH`] (default 1). A batch is
    /// also committed when the stream is caught up, at an invalidation and at the end of the
    /// run, so events are never held back.
    fn batch_size(&self) -> usize {
        1
    }

    /// Called once after a successful run, every commit and the idle watermark done, with the
    /// report the run returns. An error fails the run (what was committed stays).
    fn finish(&mut self, host: &mut dyn Host, report: &Report) -> Result<(), String> {
        let _ = (host, report);
        Ok(())
    }
}

/// One bounded run of the policy `P`, built from `settings` ([`FromSettings`]).
pub fn run<P: Policy>(host: &mut dyn Host, settings: &Settings) -> Result<Report, String> {
    let mut policy = P::from_settings(settings)?;
    run_policy(&mut policy, host, settings)
}

/// Delivered events not yet committed, with their decisions.
#[derive(Default)]
struct Batch {
    /// The token of the last one and the mode saved with it.
    last: Option<(String, Mode)>,
    decisions: Vec<Decision>,
}

impl Batch {
    /// Commits the pending decisions, if any, moving `token` to the last one.
    fn flush(&mut self, host: &mut dyn Host, token: &mut Option<String>) -> Result<(), String> {
        if let Some((next, mode)) = self.last.take() {
            let decisions = std::mem::take(&mut self.decisions);
            host.commit_batch(token.as_deref(), &next, mode, decisions)?;
            *token = Some(next);
        }
        Ok(())
    }
}

/// One bounded run of an already built policy: the baseline's loop with the policy's decisions.
pub fn run_policy<P: Policy>(
    policy: &mut P,
    host: &mut dyn Host,
    settings: &Settings,
) -> Result<Report, String> {
    let size = policy.batch_size();
    if !(1..=MAX_BATCH).contains(&size) {
        return Err(format!(
            "the batch size must be from 1 to {MAX_BATCH}, not {size}"
        ));
    }
    let checkpoint = host.load_checkpoint();
    let mut token = checkpoint.token.clone();
    let (mut events, mut handed_off) = (0u32, 0u32);
    let mut last_event_id = String::new();
    let mut invalidated = false;
    let mut batch = Batch::default();

    host.open(stream_start(&checkpoint))?;
    let mut deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    while events < settings.max_events && host.now_ms() < deadline {
        let Some(event) = host.next()? else {
            // Caught up for now: do not hold delivered events back.
            batch.flush(host, &mut token)?;
            continue;
        };
        events += 1;
        if event.is_invalidate() {
            // Never handed off; saved with `startAfter`, it ends the batch and the run, which
            // reports the invalidate event's own ID, as the baseline does.
            batch.decisions.push(Decision::Skip("invalidate".into()));
            last_event_id = event_id(&event.token);
            batch.last = Some((event.token, Mode::StartAfter));
            invalidated = true;
            break;
        }
        let id = event_id(&event.token);
        let decision = policy.decide(&mut Delivered::new(&event, host), id);
        if let Some(id) = decision.handed_off() {
            handed_off += 1;
            last_event_id = id.to_string();
        }
        batch.decisions.push(decision);
        batch.last = Some((event.token, Mode::ResumeAfter));
        if batch.decisions.len() >= size {
            batch.flush(host, &mut token)?;
        }
        deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    }
    batch.flush(host, &mut token)?;
    if events < settings.max_events && !invalidated {
        save_idle_watermark(host, token.as_deref())?;
    }
    let report = Report {
        status: status(handed_off, invalidated),
        events_handed_off: handed_off,
        last_event_id,
    };
    policy.finish(host, &report)?;
    Ok(report)
}

/// Saves the idle watermark after a run that neither hit `max_events` nor was invalidated, as the
/// baseline does: nothing to save when it equals the token, an error when there is no token at all.
pub fn save_idle_watermark(host: &mut dyn Host, token: Option<&str>) -> Result<(), String> {
    match (host.watermark(), token) {
        (None, None) => Err(
            "MongoDB did not provide an idle resume token; refusing to leave an uncheckpointed gap"
                .to_string(),
        ),
        (Some(mark), current) if current != Some(mark.as_str()) => {
            Ok(host.advance_watermark(current, &mark)?)
        }
        _ => Ok(()),
    }
}

/// The status a run reports, from what it committed.
pub fn status(handed_off: u32, invalidated: bool) -> Status {
    if invalidated {
        Status::Invalidated
    } else if handed_off > 0 {
        Status::HandedOff
    } else {
        Status::Idle
    }
}

/// The baseline's event ID: lowercase hex SHA-256 of the canonical token text.
pub fn event_id(canonical_token: &str) -> String {
    hex::encode(Sha256::digest(canonical_token.as_bytes()))
}

/// Resume-mode selection: no token starts now; otherwise the saved mode decides.
pub fn stream_start(checkpoint: &Checkpoint) -> Start {
    match (&checkpoint.token, checkpoint.mode) {
        (None, _) => Start::Now,
        (Some(token), Mode::ResumeAfter) => Start::ResumeAfter(token.clone()),
        (Some(token), Mode::StartAfter) => Start::StartAfter(token.clone()),
    }
}

/// The mode saved with an event's token: only an invalidation needs `startAfter`.
pub fn mode_after(event: &Event) -> Mode {
    if event.is_invalidate() {
        Mode::StartAfter
    } else {
        Mode::ResumeAfter
    }
}

#[cfg(test)]
mod tests;
