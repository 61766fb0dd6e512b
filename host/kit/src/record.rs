//! `handoff record`: captures a live change stream into the fixture format, so that production
//! traffic becomes policy test cases.
//!
//! The recording starts at the current time of the deployment and holds a `$deployment` line, each
//! event exactly as the server sent it (with `--redact` fields hidden wherever it carries them, see `redact`), and a
//! `$postBatchResumeToken` line whenever the stream's resume position moves past the last event
//! (the end of a batch). It stops after `max_events` events or `max_wait` without one, and is
//! written atomically: a failed recording leaves no file.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use bson::{Bson, Document};

use crate::redact::Redaction;

use handoff_domain::error::{HandoffError, Result};
use handoff_domain::{ChangeSource, Start, StreamError, Topology};

/// What to record.
pub struct Recording<'a> {
    pub database: &'a str,
    pub collection: &'a str,
    pub max_events: u32,
    pub max_wait: Duration,
    pub redact: &'a [Redaction],
}

fn line(value: Bson) -> String {
    format!("{}\n", value.into_relaxed_extjson())
}

/// Records `source` (a live stream, opened from now) into `out`; returns the number of events
/// recorded.
pub fn record(source: &mut dyn ChangeSource, what: &Recording<'_>, out: &Path) -> Result<u32> {
    let deployment = source.deployment()?;
    let mut recorded = match deployment.topology {
        Topology::ReplicaSet => bson::doc! {
            "setName": &deployment.set_name,
            "replicaSetId": &deployment.id,
        },
        Topology::ShardedCluster => bson::doc! { "clusterId": &deployment.id },
    };
    recorded.insert("source", format!("{}.{}", what.database, what.collection));
    let mut text = line(Bson::Document(bson::doc! { "$deployment": recorded }));
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
            for redaction in what.redact {
                redaction.apply(&mut event);
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
