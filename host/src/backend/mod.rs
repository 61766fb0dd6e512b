//! Backends: where change events come from and where the checkpoint and outbox live.
//!
//! A run needs two capabilities, each behind its own trait so that any source pairs with any
//! store: a [`ChangeSource`] (the deployment's identity and its change stream) and a
//! [`CheckpointStore`] (the checkpoint compare-and-set and the outbox insert, atomically).
//!
//! - `replay`: a recorded change stream served with a real server's resume semantics;
//! - `redb_store`: checkpoint and outbox in an embedded ACID store on disk;
//! - `mongo`: a MongoDB replica set through the official driver (stream, checkpoint and outbox);
//! - `memory`: an in-memory store for tests and benchmarks.

pub mod memory;
pub mod mongo;
pub mod redb_store;
pub mod replay;

use bson::Document;

/// How a saved token resumes a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    ResumeAfter,
    StartAfter,
}

impl Mode {
    /// The name stored in the checkpoint document, as the baseline writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ResumeAfter => "resumeAfter",
            Mode::StartAfter => "startAfter",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        match name {
            "resumeAfter" => Some(Mode::ResumeAfter),
            "startAfter" => Some(Mode::StartAfter),
            _ => None,
        }
    }
}

/// The replica set the source belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployment {
    pub set_name: String,
    pub replica_set_id: String,
}

/// Where a stream opens.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamStart {
    Now,
    ResumeAfter(Document),
    StartAfter(Document),
}

/// A server error as the source reported it. `message` is the server's text, never a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    pub code: Option<i32>,
    pub code_name: String,
    pub message: String,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = self
            .code
            .map_or_else(|| "n/a".to_string(), |c| c.to_string());
        let message = crate::output::text::escape_untrusted(&self.message, 180);
        let code_name = crate::output::text::escape_untrusted(&self.code_name, 64);
        write!(f, "{code_name} (code {code}): {message}")
    }
}

/// Why a stream could not open or continue.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    HistoryLost(ServerError),
    #[error("{0}")]
    InvalidToken(ServerError),
    #[error("{0}")]
    Fatal(ServerError),
    #[error("{0}")]
    Unavailable(ServerError),
    /// An event is over the 16 MiB document limit (`BSONObjectTooLarge`, 10334): the server
    /// cannot return it, so the stream cannot pass it.
    #[error("{0}")]
    TooLarge(ServerError),
}

/// MongoDB's `BSONObjectTooLarge`: a document (a change event, an inserted record) over 16 MiB.
pub const BSON_OBJECT_TOO_LARGE: i32 = 10334;

impl StreamError {
    /// Classifies a server error code the way drivers and operators do.
    pub fn from_server(error: ServerError) -> StreamError {
        match error.code {
            Some(286) => StreamError::HistoryLost(error),
            Some(260) => StreamError::InvalidToken(error),
            Some(280) => StreamError::Fatal(error),
            Some(BSON_OBJECT_TOO_LARGE) => StreamError::TooLarge(error),
            _ => StreamError::Unavailable(error),
        }
    }

    pub fn server_error(&self) -> &ServerError {
        match self {
            StreamError::HistoryLost(e)
            | StreamError::InvalidToken(e)
            | StreamError::Fatal(e)
            | StreamError::Unavailable(e)
            | StreamError::TooLarge(e) => e,
        }
    }
}

/// A deployment's change stream.
pub trait ChangeSource: Send {
    /// The replica set's identity (`hello.setName`, `replSetGetConfig.settings.replicaSetId`).
    fn deployment(&mut self) -> crate::error::Result<Deployment>;
    /// Opens the stream on the watched collection with `fullDocument: updateLookup`.
    fn open(&mut self, start: StreamStart) -> Result<(), StreamError>;
    /// The next event, waiting at most the await bound; `None` when none arrived.
    fn next(&mut self) -> Result<Option<Document>, StreamError>;
    /// The stream's resume position as last reported by the server.
    fn watermark(&self) -> Option<Document>;
    /// Milliseconds on the source's monotonic clock (virtual for a replay).
    fn now_ms(&self) -> u64;
    /// The virtual time of a recorded stream, which the policy's WASI clocks and random sources
    /// then follow; `None` (real time) for a live stream.
    fn virtual_time(&self) -> Option<crate::runtime::clock::VirtualTime> {
        None
    }
}

/// Identifies a consumer's checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumer {
    pub consumer: String,
    pub source: String,
}

/// The collections (tables) a consumer's state lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collections {
    pub checkpoints: String,
    pub outbox: String,
    pub quarantine: String,
}

/// One atomic step: move the checkpoint from `expected` to `next`, insert the outbox and
/// quarantine records.
#[derive(Clone, Debug)]
pub struct Commit<'a> {
    pub consumer: &'a Consumer,
    pub expected: Option<&'a Document>,
    pub next: &'a Document,
    pub mode: Mode,
    pub outbox: Vec<Document>,
    pub quarantine: Vec<Document>,
}

/// Why a write did not apply. Nothing was written.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CommitError {
    /// The checkpoint is not at the expected token (or source) any more.
    #[error("checkpoint compare-and-set missed")]
    Conflict,
    /// The outbox or the quarantine already holds a record with this `_id`.
    #[error("a record {0} already exists")]
    Duplicate(String),
    /// The store failed; the transaction did not commit.
    #[error("{0}")]
    Unavailable(String),
    /// The outbox or quarantine record with this `_id` is over the store's document limit
    /// (MongoDB's 16 MiB); the transaction did not commit.
    #[error("the record {0} is over the 16 MiB document limit")]
    TooLarge(String),
}

/// A consumer's state, in commit order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dump {
    pub checkpoint: Option<Document>,
    pub outbox: Vec<Document>,
    pub quarantine: Vec<Document>,
}

/// The checkpoint, the outbox and the quarantine.
pub trait CheckpointStore: Send + Sync {
    /// Creates the checkpoint with `initial` if it is missing (`$setOnInsert`), then returns it.
    fn ensure_checkpoint(&self, consumer: &str, initial: Document)
    -> Result<Document, CommitError>;
    /// Compare-and-set on `{_id, token: expected, source}` plus the record inserts, atomically.
    fn commit(&self, commit: &Commit<'_>) -> Result<(), CommitError>;
    /// The checkpoint document and the records of `consumer`, in commit order.
    fn dump(&self, consumer: &str) -> Result<Dump, CommitError>;
}

/// The compare-and-set both embedded stores apply: the filter `{_id, token: expected, source}`
/// with MongoDB's equality (`token: null` also matches a missing token), then
/// `$set: {token: next, mode}`. Returns the updated checkpoint.
pub(crate) fn compare_and_set(
    stored: &Document,
    commit: &Commit<'_>,
) -> Result<Document, CommitError> {
    let token_matches = match (stored.get("token"), commit.expected) {
        (None | Some(bson::Bson::Null), None) => true,
        (Some(bson::Bson::Document(saved)), Some(expected)) => same_token(saved, expected),
        _ => false,
    };
    let source_matches = stored.get_str("source").ok() == Some(commit.consumer.source.as_str());
    if !token_matches || !source_matches {
        return Err(CommitError::Conflict);
    }
    let mut updated = stored.clone();
    updated.insert("token", commit.next.clone());
    updated.insert("mode", commit.mode.as_str());
    Ok(updated)
}

/// Whether the saved token is the expected one: the same BSON. `Document` equality is not enough,
/// since a token holding a NaN double would never equal itself (a server's equality match, and
/// PyMongo's, take NaN as equal to NaN).
fn same_token(saved: &Document, expected: &Document) -> bool {
    saved == expected || matches!((saved.to_vec(), expected.to_vec()), (Ok(a), Ok(b)) if a == b)
}

/// The `_id`s of records, which must be strings.
pub(crate) fn record_ids(records: &[Document]) -> Result<Vec<String>, CommitError> {
    records
        .iter()
        .map(|record| {
            record
                .get_str("_id")
                .map(str::to_string)
                .map_err(|_| CommitError::Unavailable("a record without a string _id".into()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_token_holding_nan_passes_the_compare_and_set() {
        let consumer = Consumer {
            consumer: "c".into(),
            source: "db.coll".into(),
        };
        let token = doc! { "_data": "8201", "n": f64::NAN, "a": [f64::NAN] };
        let next = doc! { "_data": "8202" };
        let stored =
            doc! { "_id": "c", "source": "db.coll", "token": token.clone(), "mode": "resumeAfter" };
        let commit = |expected: &Document| {
            compare_and_set(
                &stored,
                &Commit {
                    consumer: &consumer,
                    expected: Some(expected),
                    next: &next,
                    mode: Mode::ResumeAfter,
                    outbox: vec![],
                    quarantine: vec![],
                },
            )
        };
        let updated = commit(&token.clone()).expect("the saved token is the expected one");
        assert_eq!(updated.get_document("token").unwrap(), &next);
        let other = doc! { "_data": "8201", "n": f64::NAN, "a": [1.0] };
        assert!(matches!(commit(&other), Err(CommitError::Conflict)));
    }
}
