//! A deployment's change stream as the session sees it: where it starts, what fails, and the
//! trait every source implements.

use bson::Document;

use super::deployment::Deployment;
use super::text::escape_untrusted;
use super::time::VirtualTime;

/// Where a stream opens. The policy names a token by its canonical text (`Start<String>`); a
/// source receives the token itself (`Start<Document>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start<T> {
    Now,
    ResumeAfter(T),
    StartAfter(T),
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
        let message = escape_untrusted(&self.message, 180);
        let code_name = escape_untrusted(&self.code_name, 64);
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
    /// The stream requires a pre- or post-image (`required`) that the server does not hold
    /// for an event (`NoMatchingDocument`, 47): every run stops at that event.
    #[error("{0}")]
    ImageMissing(ServerError),
}

/// A document's size encoded as BSON (0 if it cannot be encoded, which a delivered event always
/// can).
pub fn bson_size(document: &Document) -> usize {
    document.to_vec().map_or(0, |bytes| bytes.len())
}

/// MongoDB's `NoMatchingDocument`: in a change stream, a `required` image that is missing.
pub const NO_MATCHING_DOCUMENT: i32 = 47;

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
            Some(NO_MATCHING_DOCUMENT) => StreamError::ImageMissing(error),
            _ => StreamError::Unavailable(error),
        }
    }

    pub fn server_error(&self) -> &ServerError {
        match self {
            StreamError::HistoryLost(e)
            | StreamError::InvalidToken(e)
            | StreamError::Fatal(e)
            | StreamError::Unavailable(e)
            | StreamError::TooLarge(e)
            | StreamError::ImageMissing(e) => e,
        }
    }
}

/// A deployment's change stream.
pub trait ChangeSource: Send {
    /// The replica set's identity (`hello.setName`, `replSetGetConfig.settings.replicaSetId`).
    fn deployment(&mut self) -> crate::error::Result<Deployment>;
    /// Opens the stream as the run's stream configuration says (the baseline's: the watched
    /// collection with `fullDocument: updateLookup`).
    fn open(&mut self, start: Start<Document>) -> Result<(), StreamError>;
    /// The next event, waiting at most the await bound; `None` when none arrived.
    fn next(&mut self) -> Result<Option<Document>, StreamError>;
    /// As [`ChangeSource::next`], with the event's size as BSON, which the run's bounds count. A
    /// source that receives the event encoded knows it without encoding it again.
    fn next_sized(&mut self) -> Result<Option<(Document, usize)>, StreamError> {
        Ok(self.next()?.map(|event| {
            let bytes = bson_size(&event);
            (event, bytes)
        }))
    }
    /// The stream's resume position as last reported by the server.
    fn watermark(&self) -> Option<Document>;
    /// Milliseconds on the source's monotonic clock (virtual for a replay).
    fn now_ms(&self) -> u64;
    /// The virtual time of a recorded stream, which the policy's WASI clocks and random sources
    /// then follow; `None` (real time) for a live stream.
    fn virtual_time(&self) -> Option<VirtualTime> {
        None
    }
}
