//! `reconcile`: the watched collection compared with what the consumer's outbox says each
//! document is now ([`outbox_view`](super::outbox_view)), against a live stream.
//!
//! - **missing**: in the source, absent per the outbox (never handed off, or a record lost);
//! - **orphan**: present per the outbox, not in the source;
//! - **stale**: in both, different (compared by canonical text: field order does not count).
//!
//! Keys the stream changed after the consumer's checkpoint are **in flight**: the consumer's
//! next run hands them off, so they are counted apart and never as differences. They are read
//! from the change stream, from the checkpoint's token up to the current position, once before
//! the source is read and once more after it (no snapshot read is needed: a key with no event
//! in that window did not change while the comparison ran).
//!
//! The source is read in chunks by `_id` (sorted, `_id > last`, one BSON type class after the
//! other, as MongoDB compares `_id`s within a class only), the outbox as a stream of projected
//! records folded into one digest per key: memory grows with keys, not documents.
//!
//! `--repair` hands off a correction record per missing, stale or orphan key: a `snapshot`
//! record whose position is a fresh post-batch resume token read just before the documents are,
//! holding the document as read (null for an orphan), in transactions of [`REPAIR_BATCH`]
//! records, the first with the audit record. Record IDs are deterministic, so a retried batch
//! writes nothing twice. The checkpoint is never touched.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bson::{Bson, DateTime, Document, RawDocumentBuf, Timestamp, doc};
use futures_util::TryStreamExt;
use mongodb::change_stream::event::ResumeToken;
use mongodb::error::{Error as DriverError, ErrorKind};
use mongodb::{ClientSession, Collection, Database};
use serde_json::{Value, json};

use super::audit::AuditEntry;
use super::outbox_view::{self, Entry, OutboxView, Position, Said, key_text};
use super::progress::{Progress, Sink};
use crate::backend::mongo::transaction::{self, Decision, Failure};
use crate::backend::mongo::{Connection, Redactor};
use crate::backend::snapshot::{Position as SnapshotPosition, Read};
use crate::domain::checkpoint::{self, Mode};
use crate::domain::text::{escape_name, escape_untrusted};
use crate::error::{HandoffError, Result};
use crate::run::snapshot::{Fate, Snapshots};

/// Correction records per transaction.
pub const REPAIR_BATCH: usize = 100;
/// How long one reading of the stream (to the current position) may take.
const STREAM_WAIT: Duration = Duration::from_secs(120);
/// The await bound of the stream's reads.
const AWAIT: Duration = Duration::from_millis(100);
/// The longest key text printed.
const KEY_CHARS: usize = 200;

/// The `_id` type classes, each read on its own (`$gt` compares within a class only).
const CLASSES: &[&[&str]] = &[
    &["minKey"],
    &["null"],
    &["int", "long", "double", "decimal"],
    &["string", "symbol"],
    &["object"],
    &["binData"],
    &["objectId"],
    &["bool"],
    &["date"],
    &["timestamp"],
    &["regex"],
    &["javascript"],
    &["javascriptWithScope"],
    &["maxKey"],
];

/// What to compare and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub database: String,
    pub collection: String,
    pub consumer: String,
    pub checkpoints: String,
    pub outbox: String,
    pub audit: String,
    /// Keys listed per kind of difference.
    pub limit: usize,
    pub chunk_size: u32,
    pub max_in_flight: usize,
    /// Only keys whose latest record is at or after this cluster time.
    pub since: Option<Timestamp>,
    /// `--repair` with its reason.
    pub repair: Option<String>,
    /// The command as the operator would type it again (for the audit record).
    pub command: String,
    pub progress: Sink,
}

/// One kind of difference: how many, and the first keys (printable text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub count: u64,
    pub keys: Vec<String>,
}

/// What a repair wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Correction records inserted.
    pub written: u64,
    /// Keys the policy no longer hands off when their correction was decided (the document
    /// changed since the comparison): nothing written for them.
    pub held: u64,
    /// Correction records found already stored (a retried batch).
    pub already_present: u64,
    pub transactions: u64,
    /// The audit record's `_id` (hex), when one was written.
    pub audit_id: Option<String>,
}

/// What `reconcile` found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub consumer: String,
    pub source: String,
    /// Keys compared (in-flight ones left out).
    pub checked: u64,
    pub missing: Found,
    pub orphan: Found,
    pub stale: Found,
    /// Keys the outbox disagrees with that the consumer's policy would quarantine or skip as
    /// they are now: what the policy would have produced, so not differences.
    pub quarantined: Found,
    pub skipped: Found,
    pub in_flight: u64,
    pub checkpoint_cluster_time: Option<Timestamp>,
    pub outbox_records: u64,
    pub since: Option<Timestamp>,
    pub repair: Option<Repaired>,
}

/// A cluster time as `SECONDS.INCREMENT`.
pub fn time_text(time: Timestamp) -> String {
    format!("{}.{}", time.time, time.increment)
}

/// `SECONDS[.INCREMENT]` or an RFC 3339 date (its second, increment 0).
pub fn parse_since(text: &str) -> std::result::Result<Timestamp, String> {
    let text = text.trim();
    let (seconds, increment) = text.split_once('.').unwrap_or((text, "0"));
    if !seconds.is_empty() && seconds.bytes().all(|b| b.is_ascii_digit()) {
        let time = seconds
            .parse::<u32>()
            .map_err(|_| "the seconds are out of range".to_string())?;
        let increment = increment
            .parse::<u32>()
            .map_err(|_| "the increment must be a whole number".to_string())?;
        return Ok(Timestamp { time, increment });
    }
    let date = DateTime::parse_rfc3339_str(text)
        .map_err(|_| "expected SECONDS[.INCREMENT] or an RFC 3339 date".to_string())?;
    let seconds = date.timestamp_millis().div_euclid(1000);
    let time = u32::try_from(seconds).map_err(|_| "the date is out of range".to_string())?;
    Ok(Timestamp { time, increment: 0 })
}

impl Report {
    /// Missing, orphan and stale keys together.
    pub fn differences(&self) -> u64 {
        self.missing.count + self.orphan.count + self.stale.count
    }

    pub fn to_json(&self) -> Value {
        let found = |f: &Found| json!({ "count": f.count, "keys": f.keys });
        let mut out = json!({
            "consumer": escape_name(&self.consumer, 64),
            "source": self.source,
            "checked": self.checked,
            "missing": found(&self.missing),
            "orphan": found(&self.orphan),
            "stale": found(&self.stale),
            "held_by_policy": {
                "quarantined": found(&self.quarantined),
                "skipped": found(&self.skipped),
            },
            "in_flight": { "count": self.in_flight },
            "checkpoint_cluster_time": self.checkpoint_cluster_time.map(time_text),
            "outbox_records": self.outbox_records,
            "since": self.since.map(time_text),
            "differences": self.differences(),
        });
        if let Some(repair) = &self.repair {
            out["repair"] = json!({
                "written": repair.written,
                "held": repair.held,
                "already_present": repair.already_present,
                "transactions": repair.transactions,
                "audit_id": repair.audit_id,
            });
        }
        out
    }

    /// The human view.
    pub fn human(&self) -> String {
        let mut out = format!(
            "reconcile {} ({})\n",
            escape_name(&self.consumer, 64),
            self.source
        );
        out.push_str(&format!(
            "  checkpoint at  {}\n",
            self.checkpoint_cluster_time
                .map(time_text)
                .unwrap_or_else(|| "unknown".into())
        ));
        if let Some(since) = self.since {
            out.push_str(&format!(
                "  since          {} (keys with records at or after it)\n",
                time_text(since)
            ));
        }
        out.push_str(&format!(
            "  checked        {} keys ({} outbox records)\n",
            self.checked, self.outbox_records
        ));
        for (name, found) in [
            ("missing", &self.missing),
            ("orphan", &self.orphan),
            ("stale", &self.stale),
            ("quarantined", &self.quarantined),
            ("skipped", &self.skipped),
        ] {
            if matches!(name, "quarantined" | "skipped") && found.count == 0 {
                continue;
            }
            let name = match name {
                "quarantined" => "held: quarantined by the policy",
                "skipped" => "held: skipped by the policy",
                name => name,
            };
            out.push_str(&format!("  {name:<14} {}\n", found.count));
            for key in &found.keys {
                out.push_str(&format!("      {key}\n"));
            }
            if found.count > found.keys.len() as u64 {
                out.push_str(&format!(
                    "      … and {} more (--limit)\n",
                    found.count - found.keys.len() as u64
                ));
            }
        }
        out.push_str(&format!(
            "  in flight      {} (changed after the checkpoint: the next run hands them off)\n",
            self.in_flight
        ));
        if let Some(repair) = &self.repair {
            out.push_str(&format!(
                "  repaired       {} correction records written ({} already present, {} held by the policy) in {} transactions\n",
                repair.written, repair.already_present, repair.held, repair.transactions
            ));
        }
        out.push_str(&if self.differences() == 0 {
            "result: the outbox describes the source (0 missing, 0 orphan, 0 stale)\n".to_string()
        } else {
            format!(
                "result: {} differences ({} missing, {} orphan, {} stale)\n",
                self.differences(),
                self.missing.count,
                self.orphan.count,
                self.stale.count
            )
        });
        out
    }
}

/// Which kind of difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Missing,
    Orphan,
    Stale,
}

/// A difference found before the in-flight keys are all known.
struct Difference {
    kind: Kind,
    text: String,
    key: Bson,
    /// The position of the key's latest record, if any.
    latest: Option<Position>,
}

/// A difference as [`compare`] finds it.
type Compared = Option<(Kind, String, Bson, Option<Position>)>;

/// Driver errors in the command's failure classes, credentials removed.
struct Errors<'a> {
    redactor: &'a Redactor,
}

impl Errors<'_> {
    fn of(&self, what: &str, error: &DriverError) -> HandoffError {
        let (code, message) = match error.kind.as_ref() {
            ErrorKind::Command(e) => (Some(e.code), e.message.clone()),
            _ => (None, error.to_string()),
        };
        let message = escape_untrusted(&self.redactor.clean(&message), 500);
        match code {
            Some(286) => HandoffError::HistoryLost(format!(
                "{what}: the checkpoint's token fell off the oplog ({message}); the keys changed \
                 since cannot be known. See `handoff status`; once `handoff checkpoint reset` has \
                 moved the checkpoint, reconcile compares from there"
            )),
            Some(260) => HandoffError::InvalidToken(format!(
                "{what}: the checkpoint's token cannot resume ({message})"
            )),
            Some(280) => HandoffError::StreamFatal(format!("{what}: {message}")),
            Some(13) => HandoffError::unauthorized(&format!("{what}: {message}")),
            _ => HandoffError::Unavailable(format!("{what}: {message}")),
        }
    }
}

fn token_document(token: Option<ResumeToken>) -> Option<Document> {
    match bson::serialize_to_bson(&token?) {
        Ok(Bson::Document(doc)) => Some(doc),
        _ => None,
    }
}

fn resume_token(token: &Document) -> Result<ResumeToken> {
    bson::deserialize_from_bson(Bson::Document(token.clone())).map_err(|_| {
        HandoffError::MalformedCheckpoint(
            "Checkpoint is malformed; restore a verified token before retrying".into(),
        )
    })
}

/// The stream's current position: the post-batch resume token of a stream opened now.
async fn current_token(source: &Collection<Document>, errors: &Errors<'_>) -> Result<Document> {
    let what = "reading the stream's current position";
    let mut stream = source
        .watch()
        .max_await_time(AWAIT)
        .await
        .map_err(|e| errors.of(what, &e))?;
    if let Some(token) = token_document(stream.resume_token()) {
        return Ok(token);
    }
    let _ = stream
        .next_if_any()
        .await
        .map_err(|e| errors.of(what, &e))?;
    token_document(stream.resume_token()).ok_or_else(|| {
        HandoffError::Unavailable(format!("{what}: the server gave no resume token"))
    })
}

/// The keys changed in the stream from `from` (with its mode) up to `until`, added to `keys`;
/// returns the token the reading ended at.
async fn changed_keys(
    source: &Collection<Document>,
    from: (&Document, Mode),
    until: &Position,
    keys: &mut HashSet<String>,
    max: usize,
    errors: &Errors<'_>,
) -> Result<Document> {
    let what = "reading the change stream after the checkpoint";
    let watch = source
        .watch()
        .pipeline([doc! { "$project": { "documentKey": 1, "operationType": 1 } }])
        .max_await_time(AWAIT);
    let token = resume_token(from.0)?;
    let watch = match from.1 {
        Mode::ResumeAfter => watch.resume_after(token),
        Mode::StartAfter => watch.start_after(token),
    };
    let mut stream = watch
        .await
        .map_err(|e| errors.of(what, &e))?
        .with_type::<Document>();
    let started = Instant::now();
    let mut last = from.0.clone();
    loop {
        if let Some(token) = token_document(stream.resume_token()) {
            let reached = Position::of_token(&token).is_some_and(|p| p >= *until);
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
        match stream
            .next_if_any()
            .await
            .map_err(|e| errors.of(what, &e))?
        {
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

/// Reads the source in `_id` order, class by class, `chunk` documents at a time, calling
/// `each` with every chunk.
async fn read_source(
    source: &Collection<Document>,
    chunk: u32,
    errors: &Errors<'_>,
    mut each: impl FnMut(Vec<Document>) -> Result<()>,
) -> Result<()> {
    let what = "reading the watched collection";
    for class in CLASSES {
        let types: Vec<&str> = class.to_vec();
        let mut last: Option<Bson> = None;
        loop {
            let mut range = doc! { "$type": types.clone() };
            if let Some(last) = &last {
                range.insert("$gt", last.clone());
            }
            let documents: Vec<Document> = source
                .find(doc! { "_id": range })
                .sort(doc! { "_id": 1 })
                .limit(i64::from(chunk))
                .batch_size(chunk)
                .await
                .map_err(|e| errors.of(what, &e))?
                .try_collect()
                .await
                .map_err(|e| errors.of(what, &e))?;
            let full = documents.len() as u64 == u64::from(chunk);
            last = documents.last().and_then(|d| d.get("_id")).cloned();
            if !documents.is_empty() {
                each(documents)?;
            }
            if !full || last.is_none() {
                break;
            }
        }
    }
    Ok(())
}

/// The source documents of `keys` (by `_id`).
async fn read_keys(
    source: &Collection<Document>,
    keys: &[Bson],
    errors: &Errors<'_>,
) -> Result<Vec<Document>> {
    let what = "reading the watched collection";
    source
        .find(doc! { "_id": { "$in": keys.to_vec() } })
        .await
        .map_err(|e| errors.of(what, &e))?
        .try_collect()
        .await
        .map_err(|e| errors.of(what, &e))
}

/// Compares one source document with the view; the entry is taken out of the view.
fn compare(document: &Document, view: &mut OutboxView) -> Compared {
    let key = document.get("_id")?.clone();
    let text = key_text(&key);
    match view.take(&text) {
        None => Some((Kind::Missing, text, key, None)),
        Some(entry) => match entry.said {
            Said::Absent => Some((Kind::Missing, text, key, Some(entry.position))),
            Said::Present(digest) if digest != outbox_view::digest(document) => {
                Some((Kind::Stale, text, key, Some(entry.position)))
            }
            Said::Present(_) => None,
        },
    }
}

/// Runs the comparison (and the repair when asked) on `connection`.
pub fn reconcile(
    connection: &Connection,
    redactor: &Redactor,
    options: &Options,
    snapshots: &Snapshots<'_>,
) -> Result<Report> {
    connection.block_on(run(connection, redactor, options, snapshots))
}

async fn run(
    connection: &Connection,
    redactor: &Redactor,
    options: &Options,
    snapshots: &Snapshots<'_>,
) -> Result<Report> {
    let errors = Errors { redactor };
    let database = connection.database(&options.database);
    let source_name = format!("{}.{}", options.database, options.collection);
    let source = database.collection::<Document>(&options.collection);

    // The checkpoint: where the consumer stands.
    let stored = database
        .collection::<Document>(&options.checkpoints)
        .find_one(doc! { "_id": &options.consumer })
        .await
        .map_err(|e| errors.of("reading the checkpoint", &e))?
        .ok_or_else(|| {
            HandoffError::BadInput(format!(
                "Consumer {} has no checkpoint in {}: it never ran. Run the consumer first, then \
                 reconcile",
                escape_untrusted(&options.consumer, 64),
                options.checkpoints
            ))
        })?;
    let loaded = checkpoint::validate(
        &stored,
        &source_name,
        &connection.deployment().replica_set_id,
    )?;
    if let Some(partition) = loaded.config.as_ref().and_then(|c| c.partition) {
        return Err(HandoffError::BadInput(format!(
            "Consumer {} hands off one partition ({}/{}) of its source: its outbox describes only \
             that share, so a comparison with the whole collection would report the other \
             partitions' documents as missing. Reconcile is for consumers of a whole collection",
            escape_untrusted(&options.consumer, 64),
            partition.index,
            partition.count
        )));
    }
    if let Some(config) = &loaded.config
        && (!config.pipeline.is_empty() || config.scope != crate::domain::config::Scope::Collection)
    {
        return Err(HandoffError::BadInput(format!(
            "Consumer {} streams through a pipeline or a wider scope: its records may filter or \
             reshape the documents, so a comparison with the collection (and a repair writing \
             whole documents) would be wrong. Reconcile is for consumers of the plain \
             collection stream",
            escape_untrusted(&options.consumer, 64)
        )));
    }
    let Some(token) = loaded.token.clone() else {
        return Err(HandoffError::BadInput(format!(
            "Consumer {}'s checkpoint has no token: it never completed a run. Run the consumer \
             first, then reconcile",
            escape_untrusted(&options.consumer, 64)
        )));
    };
    let mut report = Report {
        consumer: options.consumer.clone(),
        source: source_name.clone(),
        checkpoint_cluster_time: crate::domain::token::cluster_time(&token),
        since: options.since,
        ..Report::default()
    };

    // Keys changed after the checkpoint, up to now.
    let mut in_flight = HashSet::new();
    let now = current_token(&source, &errors).await?;
    let until = Position::of_token(&now).ok_or_else(|| {
        HandoffError::Unavailable("the server's resume token has no cluster time".into())
    })?;
    let reached = changed_keys(
        &source,
        (&token, loaded.mode),
        &until,
        &mut in_flight,
        options.max_in_flight,
        &errors,
    )
    .await?;
    tracing::info!(
        in_flight = in_flight.len(),
        "keys changed after the checkpoint"
    );

    // What the outbox says.
    let mut view = outbox_view::read(
        &database,
        &options.outbox,
        &options.consumer,
        &source_name,
        options.chunk_size,
        || {},
    )
    .await
    .map_err(|e| errors.of("reading the outbox", &e))?;
    if let Some(error) = view.unusable.error(&options.consumer) {
        return Err(error);
    }
    report.outbox_records = view.records;
    if let Some(since) = options.since {
        let since = (since.time, since.increment);
        view.retain(|entry| entry.position.time >= since);
    }

    // The comparison.
    let mut differences: Vec<Difference> = Vec::new();
    let mut checked_keys: u64 = 0;
    let mut note = |found: Compared, in_flight: &HashSet<String>| {
        if let Some((kind, text, key, latest)) = found
            && !in_flight.contains(&text)
        {
            differences.push(Difference {
                kind,
                text,
                key,
                latest,
            });
        }
    };
    if options.since.is_none() {
        let total = source
            .estimated_document_count()
            .await
            .map_err(|e| errors.of("counting the watched collection", &e))?;
        let progress = Progress::to("reconcile", Some(total), options.progress);
        read_source(&source, options.chunk_size, &errors, |documents| {
            progress.add(documents.len() as u64);
            for document in &documents {
                checked_keys += 1;
                note(compare(document, &mut view), &in_flight);
            }
            Ok(())
        })
        .await?;
        progress.finish();
    } else {
        let keys: Vec<Bson> = view.entries().map(|(_, e)| e.key.clone()).collect();
        let progress = Progress::to("reconcile", Some(keys.len() as u64), options.progress);
        for chunk in keys.chunks(options.chunk_size.max(1) as usize) {
            for document in read_keys(&source, chunk, &errors).await? {
                checked_keys += 1;
                note(compare(&document, &mut view), &in_flight);
            }
            progress.add(chunk.len() as u64);
        }
        progress.finish();
    }
    // What the outbox says is present and the source does not hold.
    let orphans: Vec<&Entry> = view
        .entries()
        .map(|(_, e)| e)
        .filter(|e| matches!(e.said, Said::Present(_)))
        .collect();
    checked_keys += orphans.len() as u64;
    for entry in orphans {
        note(
            Some((
                Kind::Orphan,
                key_text(&entry.key),
                entry.key.clone(),
                Some(entry.position.clone()),
            )),
            &in_flight,
        );
    }
    drop(view);

    // Keys changed while the source was read.
    let now = current_token(&source, &errors).await?;
    let until = Position::of_token(&now).ok_or_else(|| {
        HandoffError::Unavailable("the server's resume token has no cluster time".into())
    })?;
    let from_mode = if reached == token {
        loaded.mode
    } else {
        Mode::ResumeAfter
    };
    changed_keys(
        &source,
        (&reached, from_mode),
        &until,
        &mut in_flight,
        options.max_in_flight,
        &errors,
    )
    .await?;
    differences.retain(|d| !in_flight.contains(&d.text));
    report.in_flight = in_flight.len() as u64;
    report.checked = checked_keys;
    differences.sort_by(|a, b| a.text.cmp(&b.text));
    // What the policy would make of each key as it is now: one it would quarantine or skip is
    // what the policy produced, not a difference.
    let fates = policy_fates(&source, snapshots, &differences, &errors).await?;
    let mut kept = Vec::with_capacity(differences.len());
    for (difference, fate) in differences.into_iter().zip(fates) {
        let held = match fate {
            Fate::HandedOff => {
                kept.push(difference);
                continue;
            }
            Fate::Quarantined => &mut report.quarantined,
            Fate::Skipped => &mut report.skipped,
        };
        held.count += 1;
        if held.keys.len() < options.limit {
            held.keys
                .push(escape_untrusted(&difference.text, KEY_CHARS));
        }
    }
    let differences = kept;
    for difference in &differences {
        let found = match difference.kind {
            Kind::Missing => &mut report.missing,
            Kind::Orphan => &mut report.orphan,
            Kind::Stale => &mut report.stale,
        };
        found.count += 1;
        if found.keys.len() < options.limit {
            found
                .keys
                .push(escape_untrusted(&difference.text, KEY_CHARS));
        }
    }
    tracing::info!(
        checked = report.checked,
        missing = report.missing.count,
        orphan = report.orphan.count,
        stale = report.stale.count,
        in_flight = report.in_flight,
        "reconciled"
    );

    if let Some(reason) = &options.repair
        && !differences.is_empty()
    {
        crate::backend::mongo::registry::register(
            connection,
            &options.database,
            &[&options.outbox, &options.audit],
        )
        .await?;
        report.repair = Some(
            repair(
                connection,
                &database,
                &source,
                options,
                reason,
                &report,
                &differences,
                snapshots,
                &errors,
            )
            .await?,
        );
    } else if options.repair.is_some() {
        report.repair = Some(Repaired::default());
    }
    Ok(report)
}

/// The documents of `batch` as they are now (`None`: gone), in its order.
async fn reads_of(
    source: &Collection<Document>,
    batch: &[Difference],
    errors: &Errors<'_>,
) -> Result<Vec<Read>> {
    let keys: Vec<Bson> = batch.iter().map(|d| d.key.clone()).collect();
    let mut by_key: std::collections::HashMap<String, Document> = read_keys(source, &keys, errors)
        .await?
        .into_iter()
        .filter_map(|d| Some((key_text(d.get("_id")?), d)))
        .collect();
    Ok(keys
        .into_iter()
        .map(|key| {
            let document = by_key.remove(&key_text(&key));
            Read { key, document }
        })
        .collect())
}

/// A snapshot position: a resume token and its cluster time.
fn snapshot_position(token: Document, at: &Position) -> SnapshotPosition {
    SnapshotPosition {
        token,
        cluster_time: at.cluster_time(),
    }
}

/// What the consumer's policy makes of each difference's document as it is now, in order.
async fn policy_fates(
    source: &Collection<Document>,
    snapshots: &Snapshots<'_>,
    differences: &[Difference],
    errors: &Errors<'_>,
) -> Result<Vec<Fate>> {
    let mut fates = Vec::with_capacity(differences.len());
    for batch in differences.chunks(REPAIR_BATCH) {
        let token = current_token(source, errors).await?;
        let at = Position::of_token(&token).ok_or_else(|| {
            HandoffError::Unavailable("the server's resume token has no cluster time".into())
        })?;
        let reads = reads_of(source, batch, errors).await?;
        let decided = snapshots.decide(&reads, &snapshot_position(token, &at))?;
        fates.extend(decided.fates);
    }
    Ok(fates)
}

/// Hands off correction records for `keys`, [`REPAIR_BATCH`] per transaction, the audit record
/// in the first.
#[allow(clippy::too_many_arguments)]
async fn repair(
    connection: &Connection,
    database: &Database,
    source: &Collection<Document>,
    options: &Options,
    reason: &str,
    report: &Report,
    differences: &[Difference],
    snapshots: &Snapshots<'_>,
    errors: &Errors<'_>,
) -> Result<Repaired> {
    let outbox = database.collection::<RawDocumentBuf>(&options.outbox);
    let audit_records = database.collection::<Document>(&options.audit);
    let evidence = doc! {
        "checked": report.checked as i64,
        "missing": report.missing.count as i64,
        "orphan": report.orphan.count as i64,
        "stale": report.stale.count as i64,
        "in_flight": report.in_flight as i64,
        "checkpoint_cluster_time": report.checkpoint_cluster_time.map(time_text),
        "since": report.since.map(time_text),
    };
    let entry = AuditEntry {
        consumer: options.consumer.clone(),
        source: report.source.clone(),
        command: options.command.clone(),
        from: Bson::Document(doc! {
            "missing": report.missing.count as i64,
            "orphan": report.orphan.count as i64,
            "stale": report.stale.count as i64,
            "held_by_policy": (report.quarantined.count + report.skipped.count) as i64,
        }),
        to: Bson::Document(doc! { "correction_records": differences.len() as i64 }),
        reason: reason.to_string(),
        evidence,
    };
    let mut audit = Some(entry.document());
    let mut repaired = Repaired {
        audit_id: audit
            .as_ref()
            .and_then(|a| a.get_object_id("_id").ok())
            .map(|id| id.to_hex()),
        ..Repaired::default()
    };
    let progress = Progress::to("repair", Some(differences.len() as u64), options.progress);
    for batch in differences.chunks(REPAIR_BATCH) {
        // The position first, then the documents: a change after it comes later in the stream.
        let (position, at) = position_after(source, batch, errors).await?;
        let reads = reads_of(source, batch, errors).await?;
        let decided = snapshots.decide(&reads, &snapshot_position(position, &at))?;
        repaired.held += (decided.fates.len() as u64) - decided.count(Fate::HandedOff);
        let records = decided.outbox;
        let (written, present) = commit_batch(
            connection,
            &outbox,
            &audit_records,
            &records,
            audit.as_ref(),
            errors,
        )
        .await?;
        audit = None;
        repaired.written += written;
        repaired.already_present += present;
        repaired.transactions += 1;
        progress.add(batch.len() as u64);
    }
    progress.finish();
    tracing::info!(
        written = repaired.written,
        already_present = repaired.already_present,
        "correction records handed off"
    );
    Ok(repaired)
}

/// A fresh position of the stream after every latest record of `batch` (the deployment's
/// clock moves with every write, and at least every 10 s on an idle replica set).
async fn position_after(
    source: &Collection<Document>,
    batch: &[Difference],
    errors: &Errors<'_>,
) -> Result<(Document, Position)> {
    let latest = batch.iter().filter_map(|d| d.latest.as_ref()).max();
    let mut tries = 0;
    loop {
        let token = current_token(source, errors).await?;
        let at = Position::of_token(&token).ok_or_else(|| {
            HandoffError::Unavailable("the server's resume token has no cluster time".into())
        })?;
        if latest.is_none_or(|latest| at > *latest) {
            return Ok((token, at));
        }
        tries += 1;
        if tries > 30 {
            return Err(HandoffError::Unavailable(
                "the stream's position did not move past the outbox's latest records within 30 s"
                    .into(),
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One transaction through the transaction runner: the records not yet stored (and the audit
/// record). Returns (written, already present).
async fn commit_batch(
    connection: &Connection,
    outbox: &Collection<RawDocumentBuf>,
    audit_records: &Collection<Document>,
    records: &[RawDocumentBuf],
    audit: Option<&Document>,
    errors: &Errors<'_>,
) -> Result<(u64, u64)> {
    let what = "handing off correction records";
    let retries = std::sync::atomic::AtomicU32::new(0);
    let abandon_on = outbox.clone_with_type::<Document>();
    let committed = transaction::run(connection, &abandon_on, &retries, async |session| {
        statements(session, outbox, audit_records, records, audit)
            .await
            .map(Decision::<_, std::convert::Infallible>::Commit)
    })
    .await;
    match committed {
        Ok(counts) => Ok(counts),
        Err(Failure::Refused(never)) => match never {},
        Err(Failure::Failed(error)) => Err(errors.of(what, &error)),
        Err(Failure::Unknown(error)) => Err(HandoffError::Unavailable(format!(
            "{what}: the commit's outcome is unknown ({}); running the repair again writes \
             only what is missing",
            escape_untrusted(&errors.redactor.clean(&error.to_string()), 500)
        ))),
    }
}

/// The statements of a repair transaction: the records whose `_id` the outbox does not hold yet
/// are inserted, the audit record once.
async fn statements(
    session: &mut ClientSession,
    outbox: &Collection<RawDocumentBuf>,
    audit_records: &Collection<Document>,
    records: &[RawDocumentBuf],
    audit: Option<&Document>,
) -> std::result::Result<(u64, u64), DriverError> {
    let ids: Vec<&str> = records
        .iter()
        .filter_map(|r| r.get_str("_id").ok())
        .collect();
    let mut stored = HashSet::new();
    let mut cursor = outbox
        .clone_with_type::<Document>()
        .find(doc! { "_id": { "$in": &ids } })
        .projection(doc! { "_id": 1 })
        .session(&mut *session)
        .await?;
    while let Some(found) = cursor.next(&mut *session).await {
        if let Some(Bson::String(id)) = found?.get("_id") {
            stored.insert(id.clone());
        }
    }
    drop(cursor);
    let fresh: Vec<&RawDocumentBuf> = records
        .iter()
        .filter(|r| !r.get_str("_id").is_ok_and(|id| stored.contains(id)))
        .collect();
    // A retried first transaction whose commit went through has its audit record already.
    if let Some(audit) = audit {
        let held = audit_records
            .find_one(doc! { "_id": audit.get("_id").cloned().unwrap_or(Bson::Null) })
            .projection(doc! { "_id": 1 })
            .session(&mut *session)
            .await?;
        if held.is_none() {
            audit_records
                .insert_one(audit)
                .session(&mut *session)
                .await?;
        }
    }
    if !fresh.is_empty() {
        outbox
            .insert_many(fresh.iter().copied())
            .ordered(true)
            .session(&mut *session)
            .await?;
    }
    Ok((fresh.len() as u64, stored.len() as u64))
}

impl Report {
    /// The report as a self-contained HTML page: the figures, then the keys of each kind.
    pub fn html(&self) -> super::report::Report {
        use super::report::{Report as Page, Section};
        let mut figures = vec![
            (
                "consumer".to_string(),
                format!("{} on {}", self.consumer, self.source),
            ),
            (
                "checkpoint at".to_string(),
                self.checkpoint_cluster_time
                    .map(time_text)
                    .unwrap_or_else(|| "unknown".into()),
            ),
            ("keys checked".to_string(), self.checked.to_string()),
            (
                "outbox records".to_string(),
                self.outbox_records.to_string(),
            ),
            ("in flight".to_string(), self.in_flight.to_string()),
        ];
        if let Some(since) = self.since {
            figures.push(("since".to_string(), time_text(since)));
        }
        let mut sections = Vec::new();
        for (name, found) in [
            ("missing", &self.missing),
            ("orphan", &self.orphan),
            ("stale", &self.stale),
        ] {
            figures.push((name.to_string(), found.count.to_string()));
            if found.count > 0 {
                let mut rows: Vec<(String, String)> = found
                    .keys
                    .iter()
                    .enumerate()
                    .map(|(i, key)| ((i + 1).to_string(), key.clone()))
                    .collect();
                if found.count > found.keys.len() as u64 {
                    rows.push((
                        "…".to_string(),
                        format!(
                            "{} more (raise --limit)",
                            found.count - found.keys.len() as u64
                        ),
                    ));
                }
                sections.push(Section {
                    heading: format!("{name} keys"),
                    rows,
                });
            }
        }
        if self.differences() > 0 && self.repair.is_none() {
            figures.push((
                "WARNING".to_string(),
                format!("{} keys differ; `handoff reconcile --repair --reason TEXT` hands off correction records", self.differences()),
            ));
        }
        sections.insert(
            0,
            Section {
                heading: "figures".to_string(),
                rows: figures,
            },
        );
        Page {
            title: format!("handoff reconcile: {}", self.consumer),
            sections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_cluster_time_or_a_date() {
        assert_eq!(
            parse_since("1700000000.7"),
            Ok(Timestamp {
                time: 1_700_000_000,
                increment: 7
            })
        );
        assert_eq!(
            parse_since("1700000000"),
            Ok(Timestamp {
                time: 1_700_000_000,
                increment: 0
            })
        );
        assert_eq!(
            parse_since("2023-11-14T22:13:20Z"),
            Ok(Timestamp {
                time: 1_700_000_000,
                increment: 0
            })
        );
        for bad in ["", "yesterday", "12.x", "-5", "99999999999", "1.2.3"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_snapshot_event_stands_at_its_position_in_the_outbox_view() {
        let time = Timestamp {
            time: 0x65A1B2C3,
            increment: 1,
        };
        let at = SnapshotPosition {
            token: doc! { "_data": "8265A1B2C3000000012B0429296E1404" },
            cluster_time: time,
        };
        let read = Read {
            key: Bson::Int32(7),
            document: None,
        };
        let event = crate::backend::snapshot::event("db", "orders", &read, &at);
        let position = Position::of_event(&event).unwrap();
        assert_eq!(position.cluster_time(), time);
        assert_eq!(position.data, "8265A1B2C3000000012B0429296E1404");
    }

    #[test]
    fn the_report_counts_and_bounds() {
        let report = Report {
            consumer: "c\u{1b}[2J".into(),
            source: "db.orders".into(),
            missing: Found {
                count: 3,
                keys: vec!["1".into()],
            },
            ..Report::default()
        };
        assert_eq!(report.differences(), 3);
        let json = report.to_json();
        assert_eq!(json["missing"]["count"], 3);
        assert_eq!(json["in_flight"]["count"], 0);
        assert!(!json["consumer"].as_str().unwrap().contains('\u{1b}'));
        let human = report.human();
        assert!(human.contains("and 2 more"), "{human}");
        assert!(!human.contains('\u{1b}'));
    }
}
