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

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document, RawDocumentBuf, doc};
use futures_util::TryStreamExt;
use mongodb::change_stream::ChangeStream;
use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};
use mongodb::options::ReturnDocument;
use mongodb::{ClientSession, Collection, Database};

use crate::backend::mongo::transaction::{self, Decision, Failure};
use crate::backend::mongo::{Connection, Redactor};
use crate::backend::snapshot::Position;
use crate::domain::StreamConfig;
use crate::domain::checkpoint::{self, Mode};
use crate::domain::text::{escape_name, escape_untrusted};
use crate::domain::token::cluster_time;
use crate::error::HandoffError;
use crate::operate::audit::AuditEntry;
use crate::operate::progress::Progress;
use crate::run::snapshot::{self, Decided, Fate, Snapshots};

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
    /// The server refused or failed an operation.
    #[error("{what}: {detail}")]
    Server {
        what: &'static str,
        code: Option<i32>,
        detail: String,
    },
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
            BackfillError::Server { code: Some(13), .. } => HandoffError::unauthorized(&text),
            BackfillError::Server { code: Some(18), .. } => HandoffError::Authentication(text),
            BackfillError::Server {
                code: Some(286), ..
            } => HandoffError::HistoryLost(text),
            BackfillError::WatermarkTimeout { .. }
            | BackfillError::Server { .. }
            | BackfillError::Unexpected(_) => HandoffError::Unavailable(text),
        }
    }
}

/// What a backfill did.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub consumer: String,
    pub source: String,
    /// Every document was decided by the policy.
    pub done: bool,
    /// Nothing was left to do when this invocation started.
    pub already_done: bool,
    /// Whether this invocation continued a saved state.
    pub resumed: bool,
    pub restarted: bool,
    /// Whether the consumer's checkpoint was given a token.
    pub checkpoint_created: bool,
    /// Totals of the whole backfill (every invocation since its start).
    pub chunks: i64,
    pub rows: i64,
    pub dropped: i64,
    /// This invocation's share.
    pub run_chunks: i64,
    /// Documents the policy decided, and how: handed off, quarantined, skipped.
    pub run_rows: i64,
    pub run_handed_off: i64,
    pub run_quarantined: i64,
    pub run_skipped: i64,
    pub run_dropped: i64,
    pub elapsed: Duration,
}

impl Summary {
    /// The summary for machines.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "consumer": self.consumer,
            "source": self.source,
            "done": self.done,
            "already_done": self.already_done,
            "resumed": self.resumed,
            "restarted": self.restarted,
            "checkpoint_created": self.checkpoint_created,
            "chunks": self.chunks,
            "rows": self.rows,
            "dropped": self.dropped,
            "this_run": {
                "chunks": self.run_chunks,
                "rows": self.run_rows,
                "handed_off": self.run_handed_off,
                "quarantined": self.run_quarantined,
                "skipped": self.run_skipped,
                "dropped": self.run_dropped,
            },
            "elapsed_seconds": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        })
    }

    /// The summary for people.
    pub fn human(&self) -> String {
        let mut text = format!(
            "backfill of {} for consumer {}: {}\n",
            escape_untrusted(&self.source, 200),
            escape_name(&self.consumer, 64),
            if self.already_done {
                "already done (nothing to do; --restart starts over)"
            } else if self.done {
                "done"
            } else {
                "not done"
            }
        );
        text.push_str(&format!(
            "  chunks {}, documents decided by the policy {}, rows superseded by stream events {}\n",
            self.chunks, self.rows, self.dropped
        ));
        text.push_str(&format!(
            "  this run: chunks {}, documents {} (handed off {}, quarantined {}, skipped {}), superseded {}, {:.1} s{}{}\n",
            self.run_chunks,
            self.run_rows,
            self.run_handed_off,
            self.run_quarantined,
            self.run_skipped,
            self.run_dropped,
            self.elapsed.as_secs_f64(),
            if self.resumed { ", resumed" } else { "" },
            if self.restarted { ", restarted" } else { "" },
        ));
        if self.checkpoint_created {
            text.push_str(
                "  the consumer's checkpoint was started at the stream's current position\n",
            );
        }
        text
    }
}

/// A document key as a comparable value (its BSON encoding).
fn key_bytes(key: &Bson) -> Vec<u8> {
    bson::serialize_to_vec(&doc! { "k": key.clone() }).unwrap_or_default()
}

/// The saved progress of a consumer's backfill.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub source: String,
    pub last_key: Option<Bson>,
    pub chunks: i64,
    pub rows: i64,
    pub dropped: i64,
    pub started_at: DateTime,
    pub done: bool,
}

impl State {
    fn fresh(source: &str, now: DateTime) -> State {
        State {
            source: source.to_string(),
            last_key: None,
            chunks: 0,
            rows: 0,
            dropped: 0,
            started_at: now,
            done: false,
        }
    }

    /// Reads a state document; `None` when its shape is not one this command writes.
    pub fn from_document(stored: &Document) -> Option<State> {
        let number = |key: &str| match stored.get(key) {
            Some(Bson::Int64(n)) if *n >= 0 => Some(*n),
            Some(Bson::Int32(n)) if *n >= 0 => Some(i64::from(*n)),
            _ => None,
        };
        Some(State {
            source: stored.get_str("source").ok()?.to_string(),
            last_key: match stored.get("last_key") {
                None | Some(Bson::Null) => None,
                Some(key) => Some(key.clone()),
            },
            chunks: number("chunks")?,
            rows: number("rows")?,
            dropped: number("dropped").unwrap_or(0),
            started_at: *stored.get_datetime("started_at").ok()?,
            done: stored.get_bool("done").ok()?,
        })
    }

    /// The document saved for `consumer`.
    pub fn to_document(&self, consumer: &str, now: DateTime) -> Document {
        doc! {
            "_id": consumer,
            "source": &self.source,
            "last_key": self.last_key.clone().unwrap_or(Bson::Null),
            "chunks": self.chunks,
            "rows": self.rows,
            "dropped": self.dropped,
            "started_at": self.started_at,
            "updated_at": now,
            "done": self.done,
        }
    }

    /// The compare-and-set filter that matches this state (and no later one).
    fn filter(&self, consumer: &str) -> Document {
        doc! {
            "_id": consumer,
            "chunks": self.chunks,
            "last_key": { "$eq": self.last_key.clone().unwrap_or(Bson::Null) },
            "done": self.done,
        }
    }

    /// Figures for the audit record (no keys, no documents).
    fn figures(&self) -> Document {
        doc! { "source": &self.source, "chunks": self.chunks, "rows": self.rows, "dropped": self.dropped, "done": self.done }
    }
}

/// The backfill of one consumer's source.
pub struct Backfill<'a> {
    connection: &'a Connection,
    redactor: Option<Redactor>,
    options: Options,
    db: Database,
    /// The consumer's policy, which decides every document as a `snapshot` event.
    snapshots: &'a Snapshots<'a>,
}

/// The state document before the next commit: absent (insert it) or as saved (compare-and-set).
enum Saved {
    Absent,
    At(State),
}

impl<'a> Backfill<'a> {
    /// `uri` only builds the redactor that keeps credentials out of error texts.
    pub fn new(
        connection: &'a Connection,
        uri: &str,
        options: Options,
        snapshots: &'a Snapshots<'a>,
    ) -> Backfill<'a> {
        let db = connection.database(&options.database);
        Backfill {
            connection,
            redactor: Redactor::for_uri(uri),
            options,
            db,
            snapshots,
        }
    }

    fn server(&self, what: &'static str, error: &DriverError) -> BackfillError {
        let code = match error.kind.as_ref() {
            ErrorKind::Command(e) => Some(e.code),
            ErrorKind::Write(WriteFailure::WriteError(e)) => Some(e.code),
            ErrorKind::Write(WriteFailure::WriteConcernError(e)) => Some(e.code),
            ErrorKind::InsertMany(e) => e
                .write_errors
                .as_ref()
                .and_then(|w| w.first())
                .map(|w| w.code),
            ErrorKind::Authentication { .. } => Some(18),
            _ => None,
        };
        let text = match &self.redactor {
            Some(redactor) => redactor.clean(&error.to_string()),
            None => "the driver's message is withheld".into(),
        };
        BackfillError::Server {
            what,
            code,
            detail: escape_untrusted(&text, 400),
        }
    }

    fn collection(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }

    /// Runs the backfill to its end (or its first error), showing progress.
    pub fn run(&self) -> Result<Summary, BackfillError> {
        self.connection.block_on(self.run_async())
    }

    async fn run_async(&self) -> Result<Summary, BackfillError> {
        let started = Instant::now();
        let o = &self.options;
        let source = o.source();
        let states = self.collection(&o.state_collection);
        let stored = states
            .find_one(doc! { "_id": &o.consumer })
            .await
            .map_err(|e| self.server("reading the backfill state", &e))?;
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
        let mut summary = Summary {
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
        crate::backend::mongo::registry::register(
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
        self.collection(&o.signal_collection)
            .delete_many(doc! { "consumer": &o.consumer, "kind": { "$in": ["low", "high"] } })
            .await
            .map_err(|e| self.server("clearing old watermarks", &e))?;
        // The stream that sees the watermarks is open before the checkpoint is read and before
        // the first low watermark is written.
        let mut stream = self.open_watermark_stream().await?;
        summary.checkpoint_created = self.ensure_checkpoint().await?;
        let estimated = self
            .collection(&o.collection)
            .estimated_document_count()
            .await
            .map_err(|e| self.server("counting the source's documents", &e))?;
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
                    (decided, *read, *dropped)
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

    fn audit_entry(&self, loaded: &Option<State>, summary: &Summary, estimated: u64) -> AuditEntry {
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

    /// The database's change stream, from now, filtered to the source and the signal
    /// collections, keeping only what the watermark logic reads.
    async fn open_watermark_stream(&self) -> Result<ChangeStream<Document>, BackfillError> {
        let o = &self.options;
        let stream = self
            .db
            .watch()
            .pipeline([
                doc! { "$match": { "ns.coll": { "$in": [&o.collection, &o.signal_collection] } } },
                doc! { "$project": { "operationType": 1, "ns": 1, "documentKey": 1, "clusterTime": 1 } },
            ])
            .max_await_time(STREAM_AWAIT)
            .await
            .map_err(|e| self.server("opening the database's change stream", &e))?;
        Ok(stream.with_type::<Document>())
    }

    /// Makes the consumer's checkpoint hold a token: a missing one is created and a null token
    /// set to the source stream's current post-batch token (mode resumeAfter), as a fresh
    /// `handoff run` saves it. Returns whether it was set here.
    async fn ensure_checkpoint(&self) -> Result<bool, BackfillError> {
        let o = &self.options;
        let source = o.source();
        let replica_set_id = &self.connection.deployment().replica_set_id;
        let checkpoints = self.collection(&o.checkpoint_collection);
        let mut on_insert = checkpoint::initial_bound(
            &o.consumer,
            &source,
            replica_set_id,
            &StreamConfig::default(),
        );
        on_insert.remove("_id");
        let stored = checkpoints
            .find_one_and_update(
                doc! { "_id": &o.consumer },
                doc! { "$setOnInsert": on_insert },
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| self.server("loading the consumer's checkpoint", &e))?
            .ok_or_else(|| {
                BackfillError::Unexpected("the checkpoint vanished after its upsert".into())
            })?;
        let loaded = checkpoint::validate(&stored, &source, replica_set_id)
            .map_err(BackfillError::Checkpoint)?;
        if let Some(config) = &loaded.config
            && (config.partition.is_some()
                || !config.pipeline.is_empty()
                || config.scope != crate::domain::config::Scope::Collection)
        {
            return Err(BackfillError::Checkpoint(HandoffError::BadInput(format!(
                "consumer {} does not stream whole documents of the whole collection (a partition, \
                 a pipeline or a wider scope): snapshot records of every document would not be \
                 what its runs hand off. Backfill a consumer of the plain collection stream",
                o.consumer
            ))));
        }
        if loaded.token.is_some() {
            return Ok(false);
        }
        let token = {
            let stream = self
                .collection(&o.collection)
                .watch()
                .await
                .map_err(|e| self.server("opening the source's change stream", &e))?;
            let token = stream.resume_token().ok_or_else(|| {
                BackfillError::Unexpected(
                    "the source's change stream reported no post-batch resume token".into(),
                )
            })?;
            match bson::serialize_to_bson(&token) {
                Ok(Bson::Document(token)) if checkpoint::is_resume_token(&token) => token,
                _ => {
                    return Err(BackfillError::Unexpected(
                        "the source's change stream reported a token of another shape".into(),
                    ));
                }
            }
        };
        let changed = checkpoints
            .update_one(
                doc! { "_id": &o.consumer, "source": &source, "token": Bson::Null },
                doc! {
                    "$set": { "token": token, "mode": Mode::ResumeAfter.as_str() },
                    "$inc": { "revision": 1_i64 },
                },
            )
            .await
            .map_err(|e| self.server("saving the consumer's starting position", &e))?;
        if changed.matched_count == 1 {
            tracing::info!(consumer = %o.consumer, "consumer checkpoint started at the stream's current position");
            return Ok(true);
        }
        // A run saved its own starting position meanwhile: that one is older still.
        let now = checkpoints
            .find_one(doc! { "_id": &o.consumer })
            .await
            .map_err(|e| self.server("loading the consumer's checkpoint", &e))?;
        match now.map(|c| checkpoint::validate(&c, &source, replica_set_id)) {
            Some(Ok(c)) if c.token.is_some() => Ok(false),
            Some(Err(e)) => Err(BackfillError::Checkpoint(e)),
            _ => Err(BackfillError::Conflict),
        }
    }

    /// One chunk between its watermarks.
    async fn chunk(
        &self,
        stream: &mut ChangeStream<Document>,
        chunk: i64,
        last_key: &Option<Bson>,
    ) -> Result<Chunk, BackfillError> {
        let o = &self.options;
        let signals = self.collection(&o.signal_collection);
        let low = ObjectId::new();
        signals
            .insert_one(doc! { "_id": low, "consumer": &o.consumer, "kind": "low", "chunk": chunk })
            .await
            .map_err(|e| self.server("writing the low watermark", &e))?;
        let rows = self.read_rows(last_key).await?;
        let Some(last) = rows.last().and_then(|r| r.get("_id")).cloned() else {
            let _ = signals.delete_one(doc! { "_id": low }).await;
            return Ok(Chunk::Empty);
        };
        let high = ObjectId::new();
        signals
            .insert_one(
                doc! { "_id": high, "consumer": &o.consumer, "kind": "high", "chunk": chunk },
            )
            .await
            .map_err(|e| self.server("writing the high watermark", &e))?;
        // The watermarks' time counts from the high one's write: reading the chunk is not
        // waiting for the stream.
        let deadline = Instant::now() + o.watermark_timeout;
        let mut low_seen = false;
        let mut changed: HashSet<Vec<u8>> = HashSet::new();
        let position = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = BackfillError::WatermarkTimeout {
                which: if low_seen { "high" } else { "low" },
                chunk,
                seconds: o.watermark_timeout.as_secs(),
            };
            if remaining.is_zero() {
                return Err(timeout);
            }
            let event = match tokio::time::timeout(remaining, stream.next_if_any()).await {
                Err(_) => return Err(timeout),
                Ok(next) => next.map_err(|e| self.server("reading the change stream", &e))?,
            };
            let Some(event) = event else {
                if !stream.is_alive() {
                    return Err(BackfillError::SourceGone("dropped (the stream ended)"));
                }
                continue;
            };
            let coll = event
                .get_document("ns")
                .ok()
                .and_then(|ns| ns.get_str("coll").ok())
                .unwrap_or_default();
            let operation = event.get_str("operationType").unwrap_or_default();
            let key = event
                .get_document("documentKey")
                .ok()
                .and_then(|k| k.get("_id"));
            if coll == o.signal_collection {
                match key {
                    Some(Bson::ObjectId(id)) if *id == low => low_seen = true,
                    Some(Bson::ObjectId(id)) if *id == high => {
                        if !low_seen {
                            return Err(BackfillError::Unexpected(
                                "the high watermark came through the stream before the low one"
                                    .into(),
                            ));
                        }
                        break watermark_position(&event)?;
                    }
                    _ => {}
                }
            } else if coll == o.collection && low_seen {
                match operation {
                    "drop" => return Err(BackfillError::SourceGone("dropped")),
                    "rename" => return Err(BackfillError::SourceGone("renamed")),
                    _ => {}
                }
                if let Some(key) = key {
                    changed.insert(key_bytes(key));
                }
            }
        };
        let read = rows.len();
        let mut reads = Vec::with_capacity(read);
        let mut dropped = 0;
        for row in rows {
            let Some(key) = row.get("_id") else {
                continue;
            };
            if changed.contains(&key_bytes(key)) {
                dropped += 1;
                continue;
            }
            reads.extend(snapshot::read(row));
        }
        let decided = self
            .snapshots
            .decide(&reads, &position)
            .map_err(BackfillError::Policy)?;
        // The watermarks have served; the signal collection need not grow with the backfill.
        let _ = signals
            .delete_many(doc! { "_id": { "$in": [low, high] } })
            .await;
        Ok(Chunk::Rows {
            decided,
            last_key: last,
            read,
            dropped,
        })
    }

    /// The next chunk's documents, by `_id`, after `last_key`. `$gt` compares within one BSON
    /// type: when the keys of that type are exhausted, the next ones are those of the following
    /// types in MongoDB's order (an aggregation comparison, across types).
    async fn read_rows(&self, last_key: &Option<Bson>) -> Result<Vec<Document>, BackfillError> {
        let o = &self.options;
        let source = self.collection(&o.collection);
        let limit = i64::from(o.chunk_size);
        let find = |filter: Document| async {
            source
                .find(filter)
                .sort(doc! { "_id": 1 })
                .limit(limit)
                .await
                .map_err(|e| self.server("reading the chunk", &e))?
                .try_collect::<Vec<Document>>()
                .await
                .map_err(|e| self.server("reading the chunk", &e))
        };
        let Some(last) = last_key else {
            return find(doc! {}).await;
        };
        let rows = find(doc! { "_id": { "$gt": last.clone() } }).await?;
        if !rows.is_empty() {
            return Ok(rows);
        }
        find(doc! { "$expr": { "$gt": ["$_id", { "$literal": last.clone() }] } }).await
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
        let retries = std::sync::atomic::AtomicU32::new(0);
        let states = self.collection(&self.options.state_collection);
        let committed =
            transaction::run(
                self.connection,
                &states,
                &retries,
                async |session| match self
                    .statements(session, saved, next, decided, audit.as_ref())
                    .await
                {
                    Ok(()) => Ok(Decision::Commit(())),
                    Err(Statement::Conflict) => Ok(Decision::Refuse(BackfillError::Conflict)),
                    Err(Statement::Driver(e)) => Err(e),
                },
            )
            .await;
        match committed {
            Ok(()) => Ok(()),
            Err(Failure::Refused(refused)) => Err(refused),
            Err(Failure::Failed(e) | Failure::Unknown(e)) => {
                tracing::debug!(consumer = %self.options.consumer, "the chunk's commit failed");
                Err(self.server("committing the chunk", &e))
            }
        }
    }

    async fn statements(
        &self,
        session: &mut ClientSession,
        saved: &Saved,
        next: &State,
        decided: &Decided,
        audit: Option<&Document>,
    ) -> Result<(), Statement> {
        let o = &self.options;
        let now = DateTime::now();
        let states = self.collection(&o.state_collection);
        match saved {
            Saved::Absent => {
                let inserted = states
                    .insert_one(next.to_document(&o.consumer, now))
                    .session(&mut *session)
                    .await;
                match inserted {
                    Ok(_) => {}
                    Err(e) if duplicate_key(&e) => return Err(Statement::Conflict),
                    Err(e) => return Err(Statement::Driver(e)),
                }
            }
            Saved::At(previous) => {
                let changed = states
                    .replace_one(
                        previous.filter(&o.consumer),
                        next.to_document(&o.consumer, now),
                    )
                    .session(&mut *session)
                    .await
                    .map_err(Statement::Driver)?;
                if changed.matched_count != 1 {
                    return Err(Statement::Conflict);
                }
            }
        }
        for (collection, records) in [
            (&o.outbox_collection, &decided.outbox),
            (&o.quarantine_collection, &decided.quarantine),
        ] {
            if !records.is_empty() {
                self.db
                    .collection::<RawDocumentBuf>(collection)
                    .insert_many(records)
                    .ordered(true)
                    .session(&mut *session)
                    .await
                    .map_err(Statement::Driver)?;
            }
        }
        if let Some(audit) = audit {
            self.collection(&o.audit_collection)
                .insert_one(audit)
                .session(&mut *session)
                .await
                .map_err(Statement::Driver)?;
        }
        Ok(())
    }
}

enum Chunk {
    /// No document after the last key: the backfill is done.
    Empty,
    Rows {
        /// What the policy made of the rows no stream event superseded.
        decided: Decided,
        last_key: Bson,
        /// Documents read.
        read: usize,
        /// Rows dropped for a stream event between the watermarks.
        dropped: usize,
    },
}

enum Statement {
    Conflict,
    Driver(DriverError),
}

fn duplicate_key(error: &DriverError) -> bool {
    match error.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) => e.code == 11000,
        ErrorKind::Command(e) => e.code == 11000,
        _ => false,
    }
}

/// The position of a high watermark's change event: its resume token and cluster time.
fn watermark_position(event: &Document) -> Result<Position, BackfillError> {
    let token = event
        .get_document("_id")
        .ok()
        .filter(|t| checkpoint::is_resume_token(t))
        .cloned()
        .ok_or_else(|| {
            BackfillError::Unexpected("the high watermark's event has no resume token".into())
        })?;
    let cluster_time = match event.get("clusterTime") {
        Some(Bson::Timestamp(ts)) => *ts,
        _ => cluster_time(&token).ok_or_else(|| {
            BackfillError::Unexpected("the high watermark's event has no cluster time".into())
        })?,
    };
    Ok(Position {
        token,
        cluster_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_its_filter_names_it() {
        let mut state = State::fresh("db.orders", DateTime::from_millis(1));
        state.last_key = Some(Bson::Int32(500));
        state.chunks = 3;
        state.rows = 1490;
        state.dropped = 10;
        let stored = state.to_document("c", DateTime::from_millis(2));
        assert_eq!(State::from_document(&stored), Some(state.clone()));
        let filter = state.filter("c");
        assert_eq!(filter.get_i64("chunks").unwrap(), 3);
        assert_eq!(
            filter.get_document("last_key").unwrap(),
            &doc! { "$eq": 500 }
        );
        let fresh = State::fresh("db.orders", DateTime::from_millis(1))
            .to_document("c", DateTime::from_millis(1));
        assert_eq!(fresh.get("last_key"), Some(&Bson::Null));
        assert!(State::from_document(&doc! { "_id": "c", "source": "x" }).is_none());
    }

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

    #[test]
    fn keys_compare_by_type_and_value() {
        assert_eq!(key_bytes(&Bson::Int32(1)), key_bytes(&Bson::Int32(1)));
        assert_ne!(key_bytes(&Bson::Int32(1)), key_bytes(&Bson::Int64(1)));
        assert_ne!(
            key_bytes(&Bson::Int32(1)),
            key_bytes(&Bson::String("1".into()))
        );
    }
}
