//! `handoff backfill`: the watched collection's existing documents handed off beside the live
//! stream, with no gap and no race (the watermark-based incremental snapshot of DBLog, as
//! Debezium's incremental snapshots do it).
//!
//! Before the first chunk the consumer's checkpoint is made to hold a token (a fresh consumer
//! gets the stream's current post-batch token, as `handoff run` saves it), so every change made
//! after the backfill starts is handed off by the regular runs. Then, chunk after chunk (by
//! `_id`, after the last key done):
//!
//! 1. a low watermark document is inserted in the signal collection;
//! 2. the chunk is read;
//! 3. a high watermark document is inserted;
//! 4. a change stream on the database, open since before the first low watermark and filtered
//!    to the source and signal collections, is read until the high watermark's event: every
//!    source event between the two watermarks drops its key's row from the chunk (the stream
//!    hands that change off itself, later in position);
//! 5. in one transaction, the remaining rows' snapshot records go to the outbox and the state
//!    document moves on (compare-and-set on its chunk count and last key); the invocation's
//!    first transaction also inserts its audit record.
//!
//! A snapshot record's position is the high watermark's: its event `_id` is the high
//! watermark's resume token, its `clusterTime` that event's. Any source event for the key
//! before the low watermark comes before it, any after the high watermark after it, and none is
//! between them. Its `_id` is a hash of (namespace, key, position): a chunk redone after a kill
//! has a new high watermark, and the records of the killed attempt were never committed.
//!
//! A kill between two chunks redoes at most the chunk in flight; the state document says where
//! to resume. One audit record per invocation that changes anything (a start, a resume, a
//! `--restart`), in the transaction of its first chunk.
//!
//! - `state`: the saved progress (the state document);
//! - `start`: the consumer's checkpoint made to hold a token before the first chunk;
//! - `chunk`: one chunk between its watermarks;
//! - `summary`: what a backfill did, as JSON and for people.
//!
//! Every read and write goes through [`handoff_mongo::backfill`].

mod chunk;
mod start;
mod state;
mod summary;

use std::time::{Duration, Instant};

use bson::{Bson, DateTime, Document, doc};

use crate::audit::AuditEntry;
use crate::progress::Progress;
use chunk::Chunk;
use handoff_domain::error::HandoffError;
use handoff_domain::text::escape_untrusted;
use handoff_mongo::backfill::{ChunkCommit, Names, StateWrite, Store};
use handoff_mongo::transaction::Failure;
use handoff_mongo::{Connection, OperationError, registry};
use handoff_run::snapshot::{Decided, Fate, Snapshots};
pub use state::State;
pub use summary::BackfillSummary;

/// The default signal collection (`--signal-collection`).
pub const DEFAULT_SIGNAL_COLLECTION: &str = "kestra_change_signals";
/// The default state collection (`--state-collection`).
pub const DEFAULT_STATE_COLLECTION: &str = "kestra_change_backfill";
/// The default chunk size (`--chunk-size`).
pub const DEFAULT_CHUNK_SIZE: u32 = 1000;
/// How long a chunk waits for its watermarks in the stream by default.
pub const DEFAULT_WATERMARK_TIMEOUT: Duration = Duration::from_secs(30);
/// The change stream's await bound while waiting for a watermark.
const STREAM_AWAIT: Duration = Duration::from_millis(300);

/// What a backfill is asked to do (checked by the command line before anything is read).
#[derive(Debug, Clone)]
pub struct Options {
    pub database: String,
    pub collection: String,
    pub consumer: String,
    pub checkpoint_collection: String,
    pub outbox_collection: String,
    pub quarantine_collection: String,
    pub signal_collection: String,
    pub state_collection: String,
    pub audit_collection: String,
    pub chunk_size: u32,
    /// Documents per second at most, when given.
    pub max_rate: Option<f64>,
    pub watermark_timeout: Duration,
    /// Start over, whatever the saved state says.
    pub restart: bool,
    pub reason: String,
    /// The command as the operator would type it again (for the audit record).
    pub command: String,
}

impl Options {
    /// The watched namespace, `db.coll`.
    pub fn source(&self) -> String {
        format!("{}.{}", self.database, self.collection)
    }
}

/// Why a backfill stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    /// A watermark did not come through the stream in time: the chunk was not committed.
    #[error(
        "the {which} watermark of chunk {chunk} was not seen in the change stream within {seconds} s; \
         nothing was committed for this chunk. Check the deployment's load and retry (the backfill \
         resumes from its last committed chunk)"
    )]
    WatermarkTimeout {
        which: &'static str,
        chunk: i64,
        seconds: u64,
    },
    /// The state document moved under this backfill (another backfill of the consumer runs).
    #[error(
        "the backfill state of this consumer changed while this backfill ran (another backfill of it \
         is running?); nothing more was committed. Retry once the other one has ended"
    )]
    Conflict,
    /// The saved state belongs to another source.
    #[error(
        "the saved backfill state of this consumer belongs to another source ({0}); pass --restart \
         with a reason to start over on this one, or use another --state-collection"
    )]
    OtherSource(String),
    /// The source collection was dropped or renamed during the backfill.
    #[error(
        "the source collection was {0} during the backfill; nothing was committed for the chunk in flight"
    )]
    SourceGone(&'static str),
    /// The consumer's policy failed or broke a rule while deciding a chunk's documents (a
    /// record over MongoDB's document limit included): nothing was committed for the chunk.
    #[error(transparent)]
    Policy(HandoffError),
    /// The server refused or failed an operation (its text bounded and escaped when shown).
    #[error("{}: {}", .0.what, escape_untrusted(&.0.text, 400))]
    Server(OperationError),
    /// The consumer's checkpoint cannot be used (another source or replica set, a malformed
    /// document), or its state collections could not be registered: as `handoff run` would
    /// report it.
    #[error(transparent)]
    Checkpoint(HandoffError),
    /// What the server sent is not what MongoDB sends.
    #[error("{0}")]
    Unexpected(String),
}

impl From<BackfillError> for HandoffError {
    fn from(error: BackfillError) -> HandoffError {
        let text = error.to_string();
        match error {
            BackfillError::Checkpoint(error) | BackfillError::Policy(error) => error,
            BackfillError::Conflict => HandoffError::Conflict(text),
            BackfillError::OtherSource(_) => HandoffError::Mismatch(text),
            BackfillError::SourceGone(_) => HandoffError::StreamFatal(text),
            BackfillError::Server(OperationError { code: Some(13), .. }) => {
                HandoffError::unauthorized(&text)
            }
            BackfillError::Server(OperationError { code: Some(18), .. }) => {
                HandoffError::Authentication(text)
            }
            BackfillError::Server(OperationError {
                code: Some(286), ..
            }) => HandoffError::HistoryLost(text),
            BackfillError::WatermarkTimeout { .. }
            | BackfillError::Server(_)
            | BackfillError::Unexpected(_) => HandoffError::Unavailable(text),
        }
    }
}

/// The backfill of one consumer's source.
pub struct Backfill<'a> {
    connection: &'a Connection,
    /// Its reads and writes.
    store: Store<'a>,
    options: Options,
    /// The consumer's policy, which decides every document as a `snapshot` event.
    snapshots: &'a Snapshots<'a>,
}

/// The state document before the next commit: absent (insert it) or as saved (compare-and-set).
enum Saved {
    Absent,
    At(State),
}

impl<'a> Backfill<'a> {
    /// The backfill `options` ask for, on `connection`, its documents decided by `snapshots`.
    pub fn new(
        connection: &'a Connection,
        options: Options,
        snapshots: &'a Snapshots<'a>,
    ) -> Backfill<'a> {
        let o = &options;
        let names = Names {
            database: o.database.clone(),
            collection: o.collection.clone(),
            consumer: o.consumer.clone(),
            checkpoints: o.checkpoint_collection.clone(),
            outbox: o.outbox_collection.clone(),
            quarantine: o.quarantine_collection.clone(),
            signals: o.signal_collection.clone(),
            states: o.state_collection.clone(),
            audit: o.audit_collection.clone(),
        };
        Backfill {
            connection,
            store: Store::new(connection, names),
            options,
            snapshots,
        }
    }

    /// Runs the backfill to its end (or its first error), showing progress.
    pub fn run(&self) -> Result<BackfillSummary, BackfillError> {
        self.connection.block_on(self.run_async())
    }

    async fn run_async(&self) -> Result<BackfillSummary, BackfillError> {
        let started = Instant::now();
        let o = &self.options;
        let source = o.source();
        let stored = self.store.saved().await.map_err(BackfillError::Server)?;
        let loaded = match &stored {
            None => None,
            Some(stored) => Some(State::from_document(stored).ok_or_else(|| {
                BackfillError::Unexpected(format!(
                    "the backfill state of this consumer in {} has a shape this command does not \
                     write; remove it or pass another --state-collection",
                    o.state_collection
                ))
            })?),
        };
        self.check_policy().await?;
        let mut summary = BackfillSummary {
            consumer: o.consumer.clone(),
            source: source.clone(),
            done: false,
            already_done: false,
            resumed: false,
            restarted: o.restart && loaded.is_some(),
            checkpoint_created: false,
            chunks: 0,
            rows: 0,
            dropped: 0,
            run_chunks: 0,
            run_rows: 0,
            run_handed_off: 0,
            run_quarantined: 0,
            run_skipped: 0,
            run_dropped: 0,
            elapsed: Duration::ZERO,
        };
        if let Some(state) = &loaded
            && !o.restart
        {
            if state.source != source {
                return Err(BackfillError::OtherSource(escape_untrusted(
                    &state.source,
                    200,
                )));
            }
            if state.done {
                summary.done = true;
                summary.already_done = true;
                summary.chunks = state.chunks;
                summary.rows = state.rows;
                summary.dropped = state.dropped;
                summary.elapsed = started.elapsed();
                return Ok(summary);
            }
        }
        let now = DateTime::now();
        // What the next commit compares against, and where the chunks continue from.
        let mut saved = match &loaded {
            None => Saved::Absent,
            Some(state) => Saved::At(state.clone()),
        };
        let mut state = match (&loaded, o.restart) {
            (Some(state), false) => {
                summary.resumed = true;
                state.clone()
            }
            _ => State::fresh(&source, now),
        };
        // Before the first write: database and deployment streams then leave them out.
        registry::register(
            self.connection,
            &o.database,
            &[
                &o.checkpoint_collection,
                &o.outbox_collection,
                &o.quarantine_collection,
                &o.signal_collection,
                &o.state_collection,
                &o.audit_collection,
            ],
        )
        .await
        .map_err(BackfillError::Checkpoint)?;
        // Watermarks a killed invocation left behind have served their purpose.
        self.store
            .clear_watermarks()
            .await
            .map_err(BackfillError::Server)?;
        // The stream that sees the watermarks is open before the checkpoint is read and before
        // the first low watermark is written.
        let mut stream = self
            .store
            .watermark_stream(STREAM_AWAIT)
            .await
            .map_err(BackfillError::Server)?;
        summary.checkpoint_created = self.ensure_checkpoint().await?;
        let estimated = self
            .store
            .estimated_count()
            .await
            .map_err(BackfillError::Server)?;
        let already = u64::try_from(state.rows + state.dropped).unwrap_or(0);
        let progress = Progress::new("backfill", Some(estimated.saturating_sub(already)));
        let mut audit = Some(self.audit_entry(&loaded, &summary, estimated));
        tracing::info!(
            consumer = %o.consumer,
            source = %source,
            resumed = summary.resumed,
            restarted = summary.restarted,
            chunks_done = state.chunks,
            estimated_documents = estimated,
            "backfill starting"
        );
        loop {
            if let Some(rate) = o.max_rate {
                let done = summary.run_rows + summary.run_dropped;
                let due = Duration::from_secs_f64(done as f64 / rate);
                let elapsed = started.elapsed();
                if due > elapsed {
                    tokio::time::sleep(due - elapsed).await;
                }
            }
            let chunk = state.chunks + 1;
            let outcome = self.chunk(&mut stream, chunk, &state.last_key).await?;
            let mut next = state.clone();
            next.chunks = chunk;
            let empty = Decided::default();
            let (decided, read, dropped) = match &outcome {
                Chunk::Empty => {
                    next.chunks = state.chunks;
                    next.done = true;
                    (&empty, 0, 0)
                }
                Chunk::Rows {
                    decided,
                    last_key,
                    read,
                    dropped,
                } => {
                    next.last_key = Some(last_key.clone());
                    next.rows += decided.fates.len() as i64;
                    next.dropped += *dropped as i64;
                    (decided.as_ref(), *read, *dropped)
                }
            };
            let audit_record = audit.take().map(|mut entry| {
                entry.to = Bson::Document(next.figures());
                entry.document()
            });
            self.commit(&saved, &next, decided, audit_record).await?;
            if let Chunk::Rows { .. } = outcome {
                let handed_off = decided.count(Fate::HandedOff) as i64;
                let quarantined = decided.count(Fate::Quarantined) as i64;
                summary.run_chunks += 1;
                summary.run_rows += decided.fates.len() as i64;
                summary.run_handed_off += handed_off;
                summary.run_quarantined += quarantined;
                summary.run_skipped += decided.count(Fate::Skipped) as i64;
                summary.run_dropped += dropped as i64;
                progress.add(read as u64);
                tracing::debug!(
                    chunk,
                    handed_off,
                    quarantined,
                    dropped,
                    "backfill chunk committed"
                );
            }
            state = next.clone();
            saved = Saved::At(next);
            if state.done {
                break;
            }
        }
        progress.finish();
        summary.done = true;
        summary.chunks = state.chunks;
        summary.rows = state.rows;
        summary.dropped = state.dropped;
        summary.elapsed = started.elapsed();
        tracing::info!(
            consumer = %o.consumer,
            chunks = summary.chunks,
            rows = summary.rows,
            dropped = summary.dropped,
            elapsed_ms = summary.elapsed.as_millis() as u64,
            "backfill done"
        );
        Ok(summary)
    }

    fn audit_entry(
        &self,
        loaded: &Option<State>,
        summary: &BackfillSummary,
        estimated: u64,
    ) -> AuditEntry {
        let o = &self.options;
        AuditEntry {
            consumer: o.consumer.clone(),
            source: o.source(),
            command: o.command.clone(),
            from: loaded
                .as_ref()
                .map_or(Bson::Null, |s| Bson::Document(s.figures())),
            to: Bson::Null,
            reason: o.reason.clone(),
            evidence: doc! {
                "action": if summary.restarted { "restart" } else if summary.resumed { "resume" } else { "start" },
                "estimated_documents": estimated as i64,
                "chunk_size": i64::from(o.chunk_size),
                "checkpoint_created": summary.checkpoint_created,
                "state_collection": &o.state_collection,
                "signal_collection": &o.signal_collection,
            },
        }
    }

    /// The chunk's records, the state's compare-and-set and the audit record, in one
    /// transaction through the transaction runner.
    async fn commit(
        &self,
        saved: &Saved,
        next: &State,
        decided: &Decided,
        audit: Option<Document>,
    ) -> Result<(), BackfillError> {
        let consumer = &self.options.consumer;
        let filter = match saved {
            Saved::Absent => None,
            Saved::At(previous) => Some(previous.filter(consumer)),
        };
        let next = || next.to_document(consumer, DateTime::now());
        let chunk = ChunkCommit {
            state: filter
                .as_ref()
                .map_or(StateWrite::Insert, StateWrite::Replace),
            next: &next,
            outbox: &decided.outbox,
            quarantine: &decided.quarantine,
            audit: audit.as_ref(),
        };
        match self.store.commit(&chunk).await {
            Ok(()) => Ok(()),
            Err(Failure::Refused(())) => Err(BackfillError::Conflict),
            Err(Failure::Failed(e) | Failure::Unknown(e)) => {
                tracing::debug!(consumer = %self.options.consumer, "the chunk's commit failed");
                Err(BackfillError::Server(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_run_classes() {
        let timeout: HandoffError = BackfillError::WatermarkTimeout {
            which: "high",
            chunk: 2,
            seconds: 30,
        }
        .into();
        assert_eq!(
            timeout.exit_code(),
            HandoffError::Unavailable(String::new()).exit_code()
        );
        assert!(timeout.to_string().contains("chunk 2"));
        let conflict: HandoffError = BackfillError::Conflict.into();
        assert!(matches!(conflict, HandoffError::Conflict(_)));
        let other: HandoffError = BackfillError::OtherSource("db.x".into()).into();
        assert!(matches!(other, HandoffError::Mismatch(_)));
    }
}
