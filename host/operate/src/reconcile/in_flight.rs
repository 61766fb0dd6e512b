//! The stream's side of a comparison: its current position, and the keys changed after the
//! consumer's checkpoint (in flight: the consumer's next run hands them off).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bson::{Bson, Document};

use super::{Options, server};
use crate::outbox_view::{StreamOrder, key_text};
use handoff_domain::checkpoint::Mode;
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;
use handoff_mongo::Connection;
use handoff_mongo::events::{Events, Resume};

/// How long one reading of the stream (to the current position) may take.
const STREAM_WAIT: Duration = Duration::from_secs(120);
/// The await bound of the stream's reads.
const AWAIT: Duration = Duration::from_millis(100);

fn token_document(token: Option<Bson>) -> Option<Document> {
    match token? {
        Bson::Document(doc) => Some(doc),
        _ => None,
    }
}

/// The stream's current position: the post-batch resume token of a stream opened now, and
/// where it stands.
pub(super) async fn now(
    connection: &Connection,
    options: &Options,
) -> Result<(Document, StreamOrder)> {
    position_now(connection, &options.database, &options.collection).await
}

/// The current position of the stream of `database.collection`: the post-batch resume token
/// of a stream opened now, and where it stands.
pub(crate) async fn position_now(
    connection: &Connection,
    database: &str,
    collection: &str,
) -> Result<(Document, StreamOrder)> {
    let what = "reading the stream's current position";
    let mut stream = Events::now(connection, database, collection, Some(AWAIT), what)
        .await
        .map_err(server)?;
    let token = match token_document(stream.token()) {
        Some(token) => token,
        None => {
            let _ = stream.next(what).await.map_err(server)?;
            token_document(stream.token()).ok_or_else(|| {
                HandoffError::Unavailable(format!("{what}: the server gave no resume token"))
            })?
        }
    };
    let at = StreamOrder::of_token(&token).ok_or_else(|| {
        HandoffError::Unavailable("the server's resume token has no cluster time".into())
    })?;
    Ok((token, at))
}

/// The keys changed in the stream from `from` (with its mode) up to `until`, added to `keys`
/// (more than `--max-in-flight` of them is refused); returns the token the reading ended at.
pub(super) async fn changed_keys(
    connection: &Connection,
    options: &Options,
    from: (&Document, Mode),
    until: &StreamOrder,
    keys: &mut HashSet<String>,
) -> Result<Document> {
    let what = "reading the change stream after the checkpoint";
    let max = options.max_in_flight;
    let resume = Resume::of(from.0, from.1).ok_or_else(|| {
        HandoffError::MalformedCheckpoint(
            "Checkpoint is malformed; restore a verified token before retrying".into(),
        )
    })?;
    let mut stream = Events::keys_after(
        connection,
        &options.database,
        &options.collection,
        resume,
        AWAIT,
        what,
    )
    .await
    .map_err(server)?;
    let started = Instant::now();
    let mut last = from.0.clone();
    loop {
        if let Some(token) = token_document(stream.token()) {
            let reached = StreamOrder::of_token(&token).is_some_and(|p| p >= *until);
            last = token;
            if reached {
                return Ok(last);
            }
        }
        if started.elapsed() > STREAM_WAIT {
            return Err(HandoffError::Unavailable(format!(
                "{what}: the stream did not reach the current position within {} s",
                STREAM_WAIT.as_secs()
            )));
        }
        match stream.next(what).await.map_err(server)? {
            Some(event) => {
                let key = event
                    .get_document("documentKey")
                    .ok()
                    .and_then(|k| k.get("_id"));
                match key {
                    Some(key) => {
                        keys.insert(key_text(key));
                        if keys.len() > max {
                            return Err(HandoffError::Conflict(format!(
                                "More than {max} keys changed after the consumer's checkpoint \
                                 (--max-in-flight): run the consumer first, then reconcile"
                            )));
                        }
                    }
                    None => {
                        let operation = event.get_str("operationType").unwrap_or_default();
                        return Err(HandoffError::Conflict(format!(
                            "The stream after the consumer's checkpoint holds a {} event (the \
                             collection was dropped or renamed): run the consumer first, then \
                             reconcile",
                            escape_untrusted(operation, 40)
                        )));
                    }
                }
            }
            None if !stream.is_alive() => return Ok(last),
            None => {}
        }
    }
}
