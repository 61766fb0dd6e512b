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
//!
//! - `compare`: the source read and compared with the outbox's view;
//! - `in_flight`: the stream's current position and the keys changed after the checkpoint;
//! - `repair`: what the policy makes of each difference, and the correction records;
//! - `report`: the report as JSON, lines and an HTML page.

mod compare;
pub(crate) use compare::{read_collection, reads_of};
pub(crate) mod in_flight;
mod repair;
mod report;

use std::collections::HashSet;

use bson::{DateTime, Document, Timestamp};

use crate::outbox_view;
use crate::progress::Sink;
use compare::Kind;
use handoff_domain::checkpoint::{self, Checkpoint, Mode};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;
use handoff_mongo::{Connection, OperationError, operator};
use handoff_run::snapshot::{Fate, Snapshots};

/// Correction records per transaction.
pub const REPAIR_BATCH: usize = 100;
/// The longest key text printed.
const KEY_CHARS: usize = 200;

/// What to compare and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub database: String,
    pub collection: String,
    pub consumer: String,
    pub checkpoints: String,
    pub outbox: String,
    pub quarantine: String,
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
pub struct ReconcileReport {
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

impl Found {
    /// Counts one more key, listing its text while fewer than `limit` are listed.
    fn add(&mut self, text: &str, limit: usize) {
        self.count += 1;
        if self.keys.len() < limit {
            self.keys.push(escape_untrusted(text, KEY_CHARS));
        }
    }
}

impl ReconcileReport {
    /// Missing, orphan and stale keys together.
    pub fn differences(&self) -> u64 {
        self.missing.count + self.orphan.count + self.stale.count
    }
}

/// Why a consumer's outbox cannot be compared with its collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unfit {
    /// It hands off one partition (index, count) of the collection.
    Partition(u32, u32),
    /// It streams through a pipeline or a wider scope.
    Reshaped,
}

impl Unfit {
    /// Whether (and why) `loaded`'s consumer is not one reconcile can compare.
    pub(crate) fn of(loaded: &Checkpoint) -> Option<Unfit> {
        let config = loaded.config.as_ref()?;
        if let Some(partition) = config.partition {
            return Some(Unfit::Partition(partition.index, partition.count));
        }
        (!config.pipeline.is_empty() || config.scope != handoff_domain::config::Scope::Collection)
            .then_some(Unfit::Reshaped)
    }

    /// What the consumer does that a comparison cannot follow, after its name.
    pub(crate) fn why(self) -> String {
        match self {
            Unfit::Partition(index, count) => format!(
                "hands off one partition ({index}/{count}) of its source: its outbox describes \
                 only that share, so a comparison with the whole collection would report the \
                 other partitions' documents as missing"
            ),
            Unfit::Reshaped => "streams through a pipeline or a wider scope: its records may \
                 filter or reshape the documents, so a comparison with the collection (and a \
                 repair writing whole documents) would be wrong"
                .into(),
        }
    }
}

/// A server failure in the command's failure classes (credentials already removed).
pub(crate) fn server(error: OperationError) -> HandoffError {
    let what = error.what;
    let message = escape_untrusted(&error.message, 500);
    match error.command_code {
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

/// Runs the comparison (and the repair when asked) on `connection`.
pub fn reconcile(
    connection: &Connection,
    options: &Options,
    snapshots: &Snapshots<'_>,
) -> Result<ReconcileReport> {
    connection.block_on(run(connection, options, snapshots))
}

/// The consumer's checkpoint and its token, refused unless it is one of this source and replica
/// set, of a whole collection streamed plainly, and holds a token.
pub(crate) async fn checkpoint(
    connection: &Connection,
    (database, checkpoints, consumer): (&str, &str, &str),
    source_name: &str,
) -> Result<(Checkpoint, Document)> {
    let stored = operator::consumer_document(
        connection,
        database,
        checkpoints,
        consumer,
        "reading the checkpoint",
    )
    .await
    .map_err(server)?
    .ok_or_else(|| {
        HandoffError::BadInput(format!(
            "Consumer {} has no checkpoint in {}: it never ran. Run the consumer first, then \
             reconcile",
            escape_untrusted(consumer, 64),
            checkpoints
        ))
    })?;
    let loaded = checkpoint::validate(&stored, source_name, connection.deployment().pin())?;
    if let Some(unfit) = Unfit::of(&loaded) {
        return Err(HandoffError::BadInput(format!(
            "Consumer {} {}. Reconcile is for consumers of the plain collection stream (a whole \
             collection, no pipeline)",
            escape_untrusted(consumer, 64),
            unfit.why()
        )));
    }
    let Some(token) = loaded.token.clone() else {
        return Err(HandoffError::BadInput(format!(
            "Consumer {}'s checkpoint has no token: it never completed a run. Run the consumer \
             first, then reconcile",
            escape_untrusted(consumer, 64)
        )));
    };
    Ok((loaded, token))
}

async fn run(
    connection: &Connection,
    options: &Options,
    snapshots: &Snapshots<'_>,
) -> Result<ReconcileReport> {
    let source_name = format!("{}.{}", options.database, options.collection);
    // The checkpoint: where the consumer stands.
    let (loaded, token) = checkpoint(
        connection,
        (&options.database, &options.checkpoints, &options.consumer),
        &source_name,
    )
    .await?;
    checkpoint::check_policy(&loaded, &snapshots.binding(), "reconcile")?;
    let mut report = ReconcileReport {
        consumer: options.consumer.clone(),
        source: source_name.clone(),
        checkpoint_cluster_time: handoff_domain::token::cluster_time(&token),
        since: options.since,
        ..ReconcileReport::default()
    };

    // Keys changed after the checkpoint, up to now.
    let mut in_flight = HashSet::new();
    let (_, until) = in_flight::now(connection, options).await?;
    let reached = in_flight::changed_keys(
        connection,
        options,
        (&token, loaded.mode),
        &until,
        &mut in_flight,
    )
    .await?;
    tracing::info!(
        in_flight = in_flight.len(),
        "keys changed after the checkpoint"
    );

    // What the outbox says.
    let view_of = async |collection: &str| {
        outbox_view::read(
            connection,
            &options.database,
            collection,
            &options.consumer,
            &source_name,
            options.chunk_size,
            || {},
        )
        .await
        .map_err(server)
    };
    let mut view = view_of(&options.outbox).await?;
    if let Some(error) = view.unusable.error(&options.consumer) {
        return Err(error);
    }
    report.outbox_records = view.records;
    if let Some(since) = options.since {
        let since = (since.time, since.increment);
        view.retain(|entry| entry.position.time >= since);
    }

    // What the quarantine holds: a key whose document the policy quarantines is as it should
    // be when the quarantine holds that document.
    let quarantined = view_of(&options.quarantine).await?;

    // The comparison.
    let (mut differences, checked_keys) =
        compare::differences(connection, options, view, &in_flight).await?;

    // Keys changed while the source was read.
    let (_, until) = in_flight::now(connection, options).await?;
    let from_mode = if reached == token {
        loaded.mode
    } else {
        Mode::ResumeAfter
    };
    in_flight::changed_keys(
        connection,
        options,
        (&reached, from_mode),
        &until,
        &mut in_flight,
    )
    .await?;
    differences.retain(|d| !in_flight.contains(&d.text));
    report.in_flight = in_flight.len() as u64;
    report.checked = checked_keys;
    differences.sort_by(|a, b| a.text.cmp(&b.text));
    // What the policy would make of each key as it is now: one it would skip is what the policy
    // produced, and so is one it would quarantine that the quarantine holds as it is now.
    let fates = repair::policy_fates(connection, options, snapshots, &differences).await?;
    let mut kept = Vec::with_capacity(differences.len());
    for (difference, (fate, now)) in differences.into_iter().zip(fates) {
        let held = match fate {
            Fate::Quarantined
                if quarantined
                    .get(&difference.text)
                    .is_some_and(|entry| entry.said == now) =>
            {
                &mut report.quarantined
            }
            Fate::Skipped => &mut report.skipped,
            Fate::HandedOff | Fate::Quarantined => {
                kept.push(difference);
                continue;
            }
        };
        held.add(&difference.text, options.limit);
    }
    let differences = kept;
    for difference in &differences {
        let found = match difference.kind {
            Kind::Missing => &mut report.missing,
            Kind::Orphan => &mut report.orphan,
            Kind::Stale => &mut report.stale,
        };
        found.add(&difference.text, options.limit);
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
        report.repair = Some(
            repair::repair(
                connection,
                options,
                reason,
                &report,
                &differences,
                snapshots,
            )
            .await?,
        );
    } else if options.repair.is_some() {
        report.repair = Some(Repaired::default());
    }
    Ok(report)
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
}
