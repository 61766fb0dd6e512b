//! The contract's values as a policy sees them: the checkpoint, the deployment, events, the
//! run's settings and kind, decisions, the report, and the host's refusals.

use std::fmt;

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

/// Where a delivered event stands in the MongoDB transaction that wrote it (contract 1.5): the
/// host delivers a source transaction's events one after the other and commits all of them in
/// one transaction, or none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceTransaction {
    /// The transaction's identity (hex SHA-256 of its `lsid` and `txnNumber`), the same on each
    /// of its events and in every run.
    pub id: String,
    /// The event's place in it, from 0.
    pub index: u32,
    /// How many of its events the stream delivers; `None` for one of more than 500 events,
    /// which is handed off in several transactions.
    pub size: Option<u32>,
}

impl SourceTransaction {
    /// Whether the event is the last of its transaction (or of one over the bound, which the
    /// host never waits to finish).
    pub fn is_last(&self) -> bool {
        self.size.is_none_or(|size| self.index + 1 >= size)
    }
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
/// [`Delivered::field`](crate::Delivered::field) returns reads back as is).
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

/// What kind of sink a delivery has (contract 1.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkKind {
    /// Keyed, versioned writes (a MongoDB projection).
    Projection,
    /// One signed HTTP POST per record.
    Webhook,
    /// Keyed writes without a transaction.
    Cache,
    /// One message per record.
    Broker,
}

/// One outbox record on its way to a sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// The delivery's name (`--delivery`).
    pub delivery: String,
    pub sink: SinkKind,
    /// The outbox record, whole, as canonical Extended JSON.
    pub json: String,
}

/// What an effect does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Write the body under the key unless the sink holds a newer version (keyed sinks).
    Upsert,
    /// Remove the key unless the sink holds a newer version (keyed sinks).
    Delete,
    /// Publish the body (a broker).
    Publish,
    /// Post the body (a webhook).
    Post,
    /// No effect: the record is settled `ignored`.
    Ignore,
}

/// A record's effect on the sink. What it leaves out is the host's default: the source
/// document's key, the event's cluster time as the version, the default body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkRequest {
    pub operation: Operation,
    /// The key, as canonical Extended JSON of one value (`"o-1"`, `5`, `{"$oid": "…"}`).
    pub key: Option<String>,
    /// The version the sink compares; it must grow with the source.
    pub version: Option<u64>,
    /// The body: a document as Extended JSON.
    pub body: Option<String>,
    /// Extra headers (a webhook), at most 32; `content-type` and `webhook-*` are the sink's.
    pub headers: Vec<(String, String)>,
}

impl SinkRequest {
    /// `operation` with everything else the default's.
    pub fn new(operation: Operation) -> SinkRequest {
        SinkRequest {
            operation,
            key: None,
            version: None,
            body: None,
            headers: Vec::new(),
        }
    }

    pub fn key(mut self, key: impl Into<String>) -> SinkRequest {
        self.key = Some(key.into());
        self
    }

    pub fn version(mut self, version: u64) -> SinkRequest {
        self.version = Some(version);
        self
    }

    pub fn body(mut self, body: impl Into<String>) -> SinkRequest {
        self.body = Some(body.into());
        self
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> SinkRequest {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// What the policy makes of a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// The host's default for the sink.
    Default,
    Request(SinkRequest),
    /// The record must not reach the sink: dead at once with the reason.
    Refuse(String),
}

/// A failed delivery attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The outbox record's `_id`.
    pub record_id: String,
    pub sink: SinkKind,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Whether the host would retry it (a timeout, a refused connection, 5xx, 408, 429).
    pub transient: bool,
    pub http_status: Option<u16>,
    pub message: String,
}

/// What becomes of a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Try again later (still at most `--max-attempts`).
    Retry,
    /// Dead now.
    Dead,
    /// Give up on the record without an effect (`ignored`).
    Ignore,
}
