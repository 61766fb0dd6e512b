//! A deployment's change stream as the session sees it: where it starts, what fails, and the
//! trait every source implements.

use bson::{Document, RawBsonRef, RawDocument, RawDocumentBuf};

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
    /// An event is over the 16 MiB document limit (`BSONObjectTooLarge`, 10334), or one of its
    /// fields is too large for a fragment of a split event (7182500): the server cannot return
    /// it, so the stream cannot pass it.
    #[error("{0}")]
    TooLarge(ServerError),
    /// The stream requires a pre- or post-image (`required`) that the server does not hold
    /// for an event (`NoMatchingDocument`, 47): every run stops at that event.
    #[error("{0}")]
    ImageMissing(ServerError),
}

/// How deep an event's documents and arrays may nest: MongoDB stores no document nested more
/// than 100 levels, and an event wraps one in a few more. Deeper is a server's fabrication, and
/// refused before any recursive decoding meets it.
pub const MAX_EVENT_DEPTH: usize = 256;

/// Checks that `document` is well-formed BSON throughout — every element, nested document and
/// array (a JavaScript scope's included), keys and text valid UTF-8, at most
/// [`MAX_EVENT_DEPTH`] levels, no key twice at the top level — without decoding it. The walk
/// keeps its own stack: no nesting a server sends can exhaust the thread's. A top-level key
/// twice (`_id`, `operationType`, …) would be read one way by the run, which takes the first,
/// and another by whoever decodes the stored record, which keeps the last; nested data is kept
/// as sent.
pub fn check_bson(document: &RawDocument) -> Result<(), String> {
    let mut keys = std::collections::HashSet::new();
    for element in document {
        let (key, _) = element.map_err(|e| e.to_string())?;
        if !keys.insert(key.as_str()) {
            return Err("a top-level key appears twice".into());
        }
    }
    fn nested<'a>(
        value: RawBsonRef<'a>,
        depth: usize,
        containers: &mut Vec<(RawBsonRef<'a>, usize)>,
    ) {
        match value {
            RawBsonRef::Document(_) | RawBsonRef::Array(_) => containers.push((value, depth + 1)),
            RawBsonRef::JavaScriptCodeWithScope(code) => {
                containers.push((RawBsonRef::Document(code.scope), depth + 1));
            }
            _ => {}
        }
    }
    let mut containers = vec![(RawBsonRef::Document(document), 1)];
    while let Some((container, depth)) = containers.pop() {
        if depth > MAX_EVENT_DEPTH {
            return Err(format!("nested deeper than {MAX_EVENT_DEPTH} levels"));
        }
        match container {
            RawBsonRef::Document(document) => {
                for element in document {
                    let (_, value) = element.map_err(|e| e.to_string())?;
                    nested(value, depth, &mut containers);
                }
            }
            RawBsonRef::Array(array) => {
                for item in array {
                    nested(item.map_err(|e| e.to_string())?, depth, &mut containers);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// MongoDB's `NoMatchingDocument`: in a change stream, a `required` image that is missing.
pub const NO_MATCHING_DOCUMENT: i32 = 47;

/// MongoDB's `BSONObjectTooLarge`: a document (a change event, an inserted record) over 16 MiB.
pub const BSON_OBJECT_TOO_LARGE: i32 = 10334;

/// MongoDB's error when `$changeStreamSplitLargeEvent` cannot split an event: one of its fields
/// does not fit in a fragment, so a fragment would still be over 16 MiB.
pub const FRAGMENT_TOO_LARGE: i32 = 7182500;

impl StreamError {
    /// Classifies a server error code the way drivers and operators do.
    pub fn from_server(error: ServerError) -> StreamError {
        match error.code {
            Some(286) => StreamError::HistoryLost(error),
            Some(260) => StreamError::InvalidToken(error),
            Some(280) => StreamError::Fatal(error),
            Some(BSON_OBJECT_TOO_LARGE | FRAGMENT_TOO_LARGE) => StreamError::TooLarge(error),
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
    /// As [`ChangeSource::next`], the event encoded as BSON: its length is the size the run's
    /// bounds count, and its bytes are what the outbox record holds. A source that receives
    /// events encoded passes them on as received (checked to be well-formed BSON).
    fn next_raw(&mut self) -> Result<Option<RawDocumentBuf>, StreamError> {
        let Some(event) = self.next()? else {
            return Ok(None);
        };
        let event = RawDocumentBuf::try_from(&event).map_err(|_| {
            StreamError::Fatal(ServerError {
                code: None,
                code_name: "InvalidBSON".into(),
                message: "an event cannot be encoded as BSON".into(),
            })
        })?;
        check_bson(&event).map_err(|why| {
            StreamError::Fatal(ServerError {
                code: None,
                code_name: "InvalidBSON".into(),
                message: format!("an event is not valid BSON: {why}"),
            })
        })?;
        Ok(Some(event))
    }
    /// Whether the stream watches more than one collection (a database or the deployment):
    /// every event must then carry its namespace, and those of handoff's own state collections
    /// are left out before the policy sees them.
    fn is_wide(&self) -> bool {
        false
    }
    /// Whether an event of `database.collection` is of handoff's own state
    /// ([`crate::state`]); only a wide stream has any to leave out.
    fn is_state(&mut self, _database: &str, _collection: &str) -> Result<bool, StreamError> {
        Ok(false)
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

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    #[test]
    fn a_well_formed_event_passes_and_a_flaw_at_any_depth_is_found() {
        let event = rawdoc! {
            "_id": { "_data": "8201" },
            "fullDocument": { "items": [ { "name": "xy" } ], "n": 1_i64 },
        };
        assert!(check_bson(&event).is_ok());
        // The top level still reads; the flaw is three levels down: "xy" turned into bytes that
        // are not UTF-8.
        let mut bytes = event.as_bytes().to_vec();
        let at = bytes
            .windows(3)
            .position(|w| w == b"xy\0")
            .expect("the nested text");
        bytes[at] = 0xff;
        let flawed = RawDocument::from_bytes(&bytes).expect("the outer frame is intact");
        assert!(flawed.get("_id").is_ok());
        assert!(check_bson(flawed).is_err());
        // A nested document whose length runs past its parent.
        let mut bytes = event.as_bytes().to_vec();
        let at = bytes
            .windows(6)
            .position(|w| w == b"items\0")
            .expect("the array")
            + 6;
        bytes[at] = 0x7f;
        let flawed = RawDocument::from_bytes(&bytes).expect("the outer frame is intact");
        assert!(check_bson(flawed).is_err());
    }

    #[test]
    fn a_top_level_key_twice_is_refused_and_nested_data_is_kept_as_sent() {
        let mut twice = rawdoc! { "_id": { "_data": "8201" }, "operationType": "insert" };
        twice.append(bson::raw::cstr!("_id"), rawdoc! { "_data": "8202" });
        let why = check_bson(&twice).unwrap_err();
        assert!(why.contains("twice"), "{why}");
        let mut document = rawdoc! { "a": 1 };
        document.append(bson::raw::cstr!("a"), 2);
        let nested = rawdoc! { "_id": { "_data": "8201" }, "fullDocument": document };
        assert!(check_bson(&nested).is_ok());
    }

    #[test]
    fn a_scope_of_javascript_code_is_checked_too() {
        let code = bson::JavaScriptCodeWithScope {
            code: "f()".into(),
            scope: bson::doc! { "v": "xy" },
        };
        let event = RawDocumentBuf::try_from(&bson::doc! { "c": code }).unwrap();
        assert!(check_bson(&event).is_ok());
        let mut bytes = event.as_bytes().to_vec();
        let at = bytes.windows(3).position(|w| w == b"xy\0").unwrap();
        bytes[at + 1] = 0xfe;
        assert!(check_bson(RawDocument::from_bytes(&bytes).unwrap()).is_err());
    }

    /// `{a: {a: {… {} …}}}`, `depth` documents in all.
    fn nested(depth: usize) -> Vec<u8> {
        // Each level around the innermost `{}` is its length, an embedded document's type, the
        // key `a` and, after its child, the closing byte.
        let mut bytes = Vec::with_capacity(5 + 8 * depth);
        for level in (1..depth).rev() {
            let size = u32::try_from(5 + 8 * level).unwrap();
            bytes.extend_from_slice(&size.to_le_bytes());
            bytes.extend_from_slice(&[0x03, b'a', 0]);
        }
        bytes.extend_from_slice(&[5, 0, 0, 0, 0]);
        bytes.extend(std::iter::repeat_n(0u8, depth - 1));
        bytes
    }

    #[test]
    fn nesting_is_bounded_without_exhausting_the_stack() {
        let at_limit = nested(MAX_EVENT_DEPTH);
        assert!(check_bson(RawDocument::from_bytes(&at_limit).unwrap()).is_ok());
        let over = nested(MAX_EVENT_DEPTH + 1);
        let why = check_bson(RawDocument::from_bytes(&over).unwrap()).unwrap_err();
        assert!(why.contains("nested deeper"), "{why}");
        // The innermost document's end byte wrong: found at the bottom.
        let mut flawed = at_limit.clone();
        flawed[7 * (MAX_EVENT_DEPTH - 1) + 4] = 1;
        assert!(check_bson(RawDocument::from_bytes(&flawed).unwrap()).is_err());
        // 200,000 levels (1.6 MB, as a message may carry): refused, the stack intact.
        let deep = nested(200_000);
        assert!(check_bson(RawDocument::from_bytes(&deep).unwrap()).is_err());
    }
}
