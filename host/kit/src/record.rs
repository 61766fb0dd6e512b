//! `handoff record`: captures a live change stream into the fixture format, so that production
//! traffic becomes policy test cases.
//!
//! The recording starts at the current time of the deployment and holds a `$deployment` line, each
//! event exactly as the server sent it (with `--redact` paths replaced), and a
//! `$postBatchResumeToken` line whenever the stream's resume position moves past the last event
//! (the end of a batch). It stops after `max_events` events or `max_wait` without one, and is
//! written atomically: a failed recording leaves no file.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use bson::{Bson, Document};

use handoff_domain::error::{HandoffError, Result};
use handoff_domain::{ChangeSource, Start, StreamError};

/// The value that replaces a redacted field.
pub const REDACTED: &str = "<redacted>";

/// What to record.
pub struct Recording<'a> {
    pub database: &'a str,
    pub collection: &'a str,
    pub max_events: u32,
    pub max_wait: Duration,
    pub redact: &'a [String],
}

/// Checks redaction paths: dotted, and never the token.
pub fn check_redactions(paths: &[String]) -> Result<()> {
    for path in paths {
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(HandoffError::BadInput(format!(
                "--redact {path:?} is not a dotted field path"
            )));
        }
        if path == "_id" || path.starts_with("_id.") {
            return Err(HandoffError::BadInput(
                "--redact cannot hide the resume token (_id)".into(),
            ));
        }
    }
    Ok(())
}

/// Replaces the field at `path` (dotted) with [`REDACTED`] if it exists.
pub fn redact(event: &mut Document, path: &str) {
    let mut parts = path.split('.').peekable();
    let mut current = event;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            if current.contains_key(part) {
                current.insert(part, REDACTED);
            }
            return;
        }
        match current.get_mut(part) {
            Some(Bson::Document(inner)) => current = inner,
            _ => return,
        }
    }
}

fn line(value: Bson) -> String {
    format!("{}\n", value.into_relaxed_extjson())
}

/// Records `source` (a live stream, opened from now) into `out`; returns the number of events
/// recorded.
pub fn record(source: &mut dyn ChangeSource, what: &Recording<'_>, out: &Path) -> Result<u32> {
    let deployment = source.deployment()?;
    let mut text = line(Bson::Document(bson::doc! {
        "$deployment": {
            "setName": &deployment.set_name,
            "replicaSetId": &deployment.replica_set_id,
            "source": format!("{}.{}", what.database, what.collection),
        }
    }));
    let unavailable = |e: StreamError| {
        HandoffError::Unavailable(format!(
            "the change stream failed while recording: {}",
            e.server_error()
        ))
    };
    source.open(Start::Now).map_err(unavailable)?;
    tracing::info!(
        database = what.database,
        collection = what.collection,
        "recording"
    );
    let mut count = 0;
    let mut last_position: Option<Document> = None;
    let mut idle_since = Instant::now();
    let mut ended = false;
    while !ended && count < what.max_events && idle_since.elapsed() < what.max_wait {
        if let Some(mut event) = source.next().map_err(unavailable)? {
            last_position = event.get_document("_id").ok().cloned();
            // The server closes the stream after an invalidation: nothing more will come.
            ended = event.get_str("operationType").ok() == Some("invalidate");
            for path in what.redact {
                redact(&mut event, path);
            }
            text.push_str(&line(Bson::Document(event)));
            count += 1;
            idle_since = Instant::now();
        }
        // The resume position moved past the last event: a batch ended with a post-batch token.
        if let Some(position) = source.watermark()
            && last_position.as_ref() != Some(&position)
        {
            text.push_str(&line(Bson::Document(
                bson::doc! { "$postBatchResumeToken": position.clone() },
            )));
            last_position = Some(position);
        }
    }
    let temp = out.with_extension("jsonl.partial");
    let write = || -> std::io::Result<()> {
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, out)
    };
    write().map_err(|e| HandoffError::BadInput(format!("cannot write {}: {e}", out.display())))?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn redaction_replaces_only_existing_fields() {
        let mut event = doc! { "_id": {"_data": "82"}, "fullDocument": { "email": "a@b", "n": 1 } };
        redact(&mut event, "fullDocument.email");
        redact(&mut event, "fullDocument.missing.deep");
        redact(&mut event, "updateDescription.updatedFields.email");
        assert_eq!(
            event,
            doc! { "_id": {"_data": "82"}, "fullDocument": { "email": REDACTED, "n": 1 } }
        );
    }

    #[test]
    fn the_token_cannot_be_redacted() {
        assert!(check_redactions(&["_id".into()]).is_err());
        assert!(check_redactions(&["_id._data".into()]).is_err());
        assert!(check_redactions(&["a..b".into()]).is_err());
        assert!(check_redactions(&["fullDocument.email".into()]).is_ok());
    }
}
