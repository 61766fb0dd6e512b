//! The stream side of a session: opening from the checkpoint's own position, delivering events
//! within the run's bounds, and reading delivered events' fields.

use bson::{Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};

use super::refusal::Refusal;
use super::transaction::{Read, transaction_key};
use super::{Delivered, Session};
use handoff_domain::error::{
    EVENT_TOO_LARGE_GUIDANCE, FRAGMENT_TOO_LARGE_GUIDANCE, HandoffError, IMAGE_MISSING_GUIDANCE,
    RECONCILE_GUIDANCE,
};
use handoff_domain::stream::{BSON_OBJECT_TOO_LARGE, FRAGMENT_TOO_LARGE, NO_MATCHING_DOCUMENT};
use handoff_domain::text::escape_untrusted;
use handoff_domain::token::{canonical_text, value_text};
use handoff_domain::{Mode, Start, StreamError};

/// What the policy sees of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    pub token: String,
    pub operation_type: String,
    pub namespace: Option<String>,
    pub cluster_time: Option<(u32, u32)>,
}

impl Session {
    /// A stream failure ends the run with its class and the guidance that fits it.
    fn stream_failure(&mut self, error: StreamError) -> Refusal {
        let detail = error.server_error().to_string();
        let message = if self.token.is_some() {
            format!("{RECONCILE_GUIDANCE} MongoDB error: {detail}")
        } else {
            format!("Change-stream read failed. MongoDB error: {detail}")
        };
        self.fail(match error {
            StreamError::HistoryLost(_) => HandoffError::HistoryLost(message),
            StreamError::InvalidToken(_) => HandoffError::InvalidToken(message),
            StreamError::Fatal(_) => HandoffError::StreamFatal(message),
            StreamError::Unavailable(_) => HandoffError::Unavailable(message),
            // The server's text names the event's token: only its code is repeated.
            StreamError::TooLarge(e) if e.code == Some(FRAGMENT_TOO_LARGE) => {
                HandoffError::EventTooLarge(format!(
                    "{FRAGMENT_TOO_LARGE_GUIDANCE} MongoDB error: {} (code {FRAGMENT_TOO_LARGE})",
                    e.code_name
                ))
            }
            StreamError::TooLarge(e) => HandoffError::EventTooLarge(format!(
                "{EVENT_TOO_LARGE_GUIDANCE} MongoDB error: {} (code {BSON_OBJECT_TOO_LARGE})",
                e.code_name
            )),
            // The server's text names the event: only its code is repeated.
            StreamError::ImageMissing(e) => HandoffError::ImageMissing(format!(
                "{IMAGE_MISSING_GUIDANCE} MongoDB error: {} (code {NO_MATCHING_DOCUMENT})",
                e.code_name
            )),
        })
    }

    /// Opens the stream where the policy asks, which must be where the checkpoint says.
    pub fn open_stream(&mut self, start: Start<String>) -> Result<(), Refusal> {
        self.gate()?;
        if self.stream_open {
            return Err(self.reject("the stream is already open"));
        }
        let (text, start_after) = match start {
            Start::Now if self.token.is_none() => {
                self.open_source(Start::Now)?;
                return self.save_start_position();
            }
            Start::Now => {
                return Err(self.reject(
                    "a consumer with a saved token cannot start from now: that would skip history",
                ));
            }
            Start::ResumeAfter(text) => (text, false),
            Start::StartAfter(text) => (text, true),
        };
        let token = match (&self.token, &self.token_text) {
            (Some(token), Some(saved)) if *saved == text => token.clone(),
            _ => {
                return Err(self.reject("a stream may only resume from the checkpoint's own token"));
            }
        };
        if start_after != (self.mode == Mode::StartAfter) {
            let saved = self.mode.as_str();
            return Err(self.reject(format!(
                "the checkpoint's token was saved for {saved}; the stream must open with that mode"
            )));
        }
        self.open_source(if start_after {
            Start::StartAfter(token)
        } else {
            Start::ResumeAfter(token)
        })
    }

    fn open_source(&mut self, start: Start<Document>) -> Result<(), Refusal> {
        let resuming = !matches!(start, Start::Now);
        let opened = self.source.open(start);
        if resuming {
            self.committed.resume_attempts.count(opened.as_ref().err());
        }
        match opened {
            Ok(()) => {
                self.stream_open = true;
                if let Some(observer) = &self.observer {
                    observer.opened();
                }
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
    fn save_start_position(&mut self) -> Result<(), Refusal> {
        let Some(start) = self.source.watermark() else {
            return Ok(());
        };
        self.move_checkpoint(
            start,
            "Checkpoint changed while saving the stream's starting position; retry from the current token",
            "Could not save the stream's starting position; nothing was handed off.",
        )?;
        tracing::debug!("stream starting position saved");
        self.start_saved_for_policy = true;
        Ok(())
    }

    /// The next event, within the run's bounds; `None` when none arrived within the await bound.
    pub fn next_event(&mut self) -> Result<Option<EventView>, Refusal> {
        self.gate()?;
        if !self.stream_open {
            return Err(self.reject("`next` before `open-stream`"));
        }
        let bounds = self.bounds;
        if self.pending.len() >= bounds.max_pending
            || self.pending_bytes >= bounds.max_pending_bytes
        {
            let (events, bytes) = (self.pending.len(), self.pending_bytes);
            return Err(self.reject(format!(
                "{events} delivered events ({bytes} bytes) are waiting for their commit (at most {} events or {} bytes)",
                bounds.max_pending, bounds.max_pending_bytes
            )));
        }
        // A run reads past `max_events` only to finish a source transaction.
        if let Some(max) = self.max_events
            && !self.follow
            && self.delivered >= max
            && !self.inside_transaction()
        {
            return Err(self.reject(format!("the run already read max_events = {max} events")));
        }
        let Some(read) = self.next_read()? else {
            return Ok(None);
        };
        let bytes = read.delivered.bytes;
        tracing::debug!(
            operation_type = %escape_untrusted(&read.view.operation_type, 64),
            bytes,
            fragments = read.delivered.rest.len() + 1,
            "event delivered"
        );
        self.delivered += 1;
        self.pending_bytes += bytes;
        self.pending.push_back(read.delivered);
        Ok(Some(read.view))
    }

    /// The next event from the source, with its fragments and its view, or `None` when none
    /// arrived within the await bound. Events of handoff's own state are left out here.
    pub(crate) fn read_one(&mut self) -> Result<Option<Read>, Refusal> {
        let (event, text, operation_type, namespace, rest, rest_bytes) = loop {
            self.keep_lease()?;
            let event = match self.source.next_raw() {
                Ok(Some(event)) => event,
                Ok(None) => return Ok(None),
                Err(error) => return Err(self.stream_failure(error)),
            };
            let Some(token) = event
                .get_document("_id")
                .ok()
                .and_then(|token| Document::try_from(token).ok())
            else {
                return Err(self.fail(HandoffError::StreamFatal(
                    "The change stream delivered an event without a resume token; refusing to continue"
                        .into(),
                )));
            };
            let operation_type = event
                .get_str("operationType")
                .unwrap_or_default()
                .to_string();
            let (rest, rest_bytes) = self.rest_of_split(&event)?;
            // A split event's namespace may come in any of its fragments.
            let namespace = std::iter::once(event.as_ref())
                .chain(rest.iter().map(|fragment| fragment.as_ref()))
                .find_map(namespace_of);
            if self.source.is_wide() && operation_type != "invalidate" {
                let state = match &namespace {
                    None => {
                        return Err(self.fail(HandoffError::StreamFatal(
                            "The database or deployment stream delivered an event without its \
                             namespace (ns), which it needs to leave out handoff's own \
                             collections: the pipeline must keep ns; refusing to continue"
                                .into(),
                        )));
                    }
                    Some((_, None)) => false,
                    Some((database, Some(collection))) => {
                        match self.source.is_state(database, collection) {
                            Ok(state) => state,
                            Err(error) => return Err(self.stream_failure(error)),
                        }
                    }
                };
                if state {
                    // Handoff's own state: never the policy's to see. The stream moves past it
                    // (the next event or the stream's watermark is after it).
                    tracing::debug!("an event of a handoff state collection left out");
                    self.gate()?;
                    continue;
                }
            }
            break (
                event,
                canonical_text(&token),
                operation_type,
                namespace,
                rest,
                rest_bytes,
            );
        };
        let event_bytes = event.as_bytes().len();
        let namespace = namespace.map(|(database, collection)| match collection {
            Some(collection) => format!("{database}.{collection}"),
            None => database,
        });
        let cluster_time = event
            .get_timestamp("clusterTime")
            .ok()
            .map(|ts| (ts.time, ts.increment));
        let view = EventView {
            token: text.clone(),
            operation_type: operation_type.clone(),
            namespace,
            cluster_time,
        };
        let key = transaction_key(
            std::iter::once(event.as_ref()).chain(rest.iter().map(|fragment| fragment.as_ref())),
        );
        Ok(Some(Read {
            delivered: Delivered {
                text,
                event,
                rest,
                invalidate: operation_type == "invalidate",
                bytes: event_bytes + rest_bytes,
                txn: None,
            },
            view,
            key,
        }))
    }

    /// For the first fragment of a split event (`splitEvent: {fragment: 1, of: n}`), the other
    /// `n - 1` fragments, read now: the server sends them one after the other, and the event is
    /// delivered, committed and resumed from as one, with their size as BSON. A fragment out of
    /// its place ends the run.
    fn rest_of_split(
        &mut self,
        event: &RawDocument,
    ) -> Result<(Vec<RawDocumentBuf>, usize), Refusal> {
        if !self.split_events {
            return Ok((Vec::new(), 0));
        }
        let split =
            split_of(event).map_err(|why| self.fail(HandoffError::StreamFatal(why.into())))?;
        let Some((fragment, of)) = split else {
            return Ok((Vec::new(), 0));
        };
        if fragment != 1 {
            return Err(self.fail(HandoffError::StreamFatal(format!(
                "The change stream delivered fragment {fragment} of {of} of a split event without \
                 its first fragment; refusing to continue"
            ))));
        }
        let mut rest = Vec::with_capacity(of as usize - 1);
        let mut bytes = 0;
        for expected in 2..=of {
            let (waiting, mut waits) = (std::time::Instant::now(), 0u32);
            let next = loop {
                self.gate()?;
                match self.source.next_raw() {
                    Ok(Some(next)) => break next,
                    // The next fragment is on its way: the server sends an event's fragments
                    // back to back, but one may wait for the next batch.
                    Ok(None)
                        if waits < MAX_FRAGMENT_WAITS && waiting.elapsed() < MAX_FRAGMENT_WAIT =>
                    {
                        waits += 1;
                    }
                    Ok(None) => {
                        return Err(self.fail(HandoffError::StreamFatal(format!(
                            "Fragment {expected} of {of} of a split event did not arrive; \
                             refusing to continue"
                        ))));
                    }
                    Err(error) => return Err(self.stream_failure(error)),
                }
            };
            match split_of(&next) {
                Ok(Some((fragment, n))) if fragment == expected && n == of => {
                    bytes += next.as_bytes().len();
                    rest.push(next);
                }
                _ => {
                    return Err(self.fail(HandoffError::StreamFatal(format!(
                        "The change stream interrupted a split event after fragment {} of {of}; \
                         refusing to continue",
                        expected - 1
                    ))));
                }
            }
        }
        Ok((rest, bytes))
    }

    /// The stream's current resume position, as canonical text. While events read ahead wait
    /// to be delivered, it is the last delivered event's token: the stream's position is past
    /// events the policy has not seen.
    pub fn watermark(&self) -> Option<String> {
        if !self.ahead.is_empty() {
            let last = self.pending.back().or(self.recent.back())?;
            return Some(last.text.clone());
        }
        self.source.watermark().as_ref().map(canonical_text)
    }

    /// A field of a delivered event by dotted path, as relaxed Extended JSON text.
    pub fn field(&self, token: &str, path: &str) -> Option<String> {
        let delivered = self
            .pending
            .iter()
            .chain(self.recent.iter())
            .find(|d| d.text == token)?;
        // A split event's fields are spread over its fragments: the first that has the path.
        delivered
            .fragments()
            .find_map(|fragment| field_of(fragment, path))
    }
}

/// An event's namespace, `(db, coll)` (`coll` absent for a database's own events), when it
/// carries one.
fn namespace_of(event: &RawDocument) -> Option<(String, Option<String>)> {
    let ns = event.get_document("ns").ok()?;
    let database = ns.get_str("db").ok()?;
    Some((
        database.to_string(),
        ns.get_str("coll").ok().map(str::to_string),
    ))
}

/// A field of `document` by dotted path, as relaxed Extended JSON text.
fn field_of(document: &RawDocument, path: &str) -> Option<String> {
    let mut parts = path.split('.');
    let mut current = document.get(parts.next()?).ok()??;
    for part in parts {
        current = match current {
            RawBsonRef::Document(d) => d.get(part).ok()??,
            RawBsonRef::Array(items) => items.get(part.parse::<usize>().ok()?).ok()??,
            _ => return None,
        };
    }
    Bson::try_from(current).ok().map(|value| value_text(&value))
}

/// `splitEvent: {fragment, of}` of an event, when it has one. A malformed one is refused.
fn split_of(event: &RawDocument) -> Result<Option<(u32, u32)>, &'static str> {
    let split = match event.get("splitEvent") {
        Ok(None) => return Ok(None),
        Ok(Some(RawBsonRef::Document(split))) => split,
        _ => return Err(MALFORMED_SPLIT),
    };
    let number = |key: &str| match split.get(key) {
        Ok(Some(RawBsonRef::Int32(n))) => u32::try_from(n).ok(),
        Ok(Some(RawBsonRef::Int64(n))) => u32::try_from(n).ok(),
        _ => None,
    };
    match (number("fragment"), number("of")) {
        (Some(fragment), Some(of)) if (1..=of).contains(&fragment) && of <= MAX_FRAGMENTS => {
            Ok(Some((fragment, of)))
        }
        _ => Err(MALFORMED_SPLIT),
    }
}

const MALFORMED_SPLIT: &str =
    "The change stream delivered a malformed splitEvent; refusing to continue";

/// The most fragments one event may arrive in (an event's fields each fit in 16 MiB, and a
/// delivered event is bounded by the pending bytes).
const MAX_FRAGMENTS: u32 = 64;

/// How long a split event's next fragment may take to arrive, and in how many empty reads at
/// most (a recorded stream's take no time).
const MAX_FRAGMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
const MAX_FRAGMENT_WAITS: u32 = 1500;
