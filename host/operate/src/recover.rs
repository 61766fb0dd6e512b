//! `recover`: a consumer whose saved position can no longer be read from (history lost, a token
//! that cannot resume, a stream the server ends) brought back in one audited command.
//!
//! 1. The checkpoint is read and the stream resumed from it, as a run would: a consumer the
//!    stream still resumes, with no recovery in progress, has nothing to recover (refused,
//!    nothing written); so has one without a checkpoint (a mistyped consumer) or without a
//!    token. Consumers reconcile cannot compare (a partition, a pipeline, a wider scope) are
//!    refused, naming the commands that serve them.
//! 2. The checkpoint moves to the stream's current position with `checkpoint reset`'s
//!    compare-and-set (refused while a run holds the lease), and the same update sets the
//!    recovery marker ([`Marker`]: when, why, the lost window, the new position); its audit
//!    record is in the same transaction.
//! 3. `reconcile --repair` compares the collection with the outbox from the new position on
//!    (keys changed after it are in flight: the next run hands them off) and hands off, through
//!    the consumer's policy, a correction record for every document the outbox no longer
//!    describes.
//! 4. The marker is cleared, with an audit record of what was repaired, in one transaction,
//!    once the stream still resumes from the checkpoint (a repair whose own writes outran the
//!    oplog fails with the class of a run that lost its position, the recovery still recorded).
//!
//! A recovery killed or failed between 2 and 4 leaves the marker: `recover` again completes the
//! repair without moving the checkpoint again (the keys already repaired are no longer
//! differences: nothing is written twice), and `status` shows the recovery in progress.

mod marker;
mod report;

use bson::{Bson, Document, doc};
use std::time::Duration;

use crate::audit::AuditEntry;
use crate::reconcile::{self, ReconcileReport, Unfit};
use crate::reset::{self, Ahead, As, To};
use handoff_domain::checkpoint::{self, Checkpoint};
use handoff_domain::config::Scope;
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;
use handoff_mongo::events::{Events, Resume};
use handoff_mongo::operator::{self, CheckpointMove};
use handoff_mongo::{Connection, registry, window};
use handoff_run::snapshot::Snapshots;
pub use marker::{Cause, FIELD, Marker};
pub use report::Recovery;

/// How long the stream resumed from the checkpoint is waited for.
const PROBE_AWAIT: Duration = Duration::from_millis(100);

/// What to recover and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The repair, as `reconcile --repair` takes it (`repair: None` in a dry run).
    pub reconcile: reconcile::Options,
    /// Why (empty in a dry run without one).
    pub reason: String,
    pub dry_run: bool,
    /// The consumer's flags, as the commands named in refusals take them.
    pub flags: String,
    /// The command to run next: after a recovery, the consumer's run (after a dry run, the
    /// recovery).
    pub next: String,
}

/// The commands that serve a consumer recover cannot repair: the move and the run, by hand.
pub fn by_hand(flags: &str) -> String {
    format!(
        "move its checkpoint with `handoff checkpoint reset {flags} --to now --reason '<why>'` \
         (look first with --dry-run), then `handoff run {flags}`; the changes of the lost \
         window are not handed off"
    )
}

/// How this invocation starts.
enum Start {
    /// Move the checkpoint (the plan of the move), setting this marker.
    Move(Box<reset::Plan>, Marker),
    /// A recovery already moved it: complete its repair.
    Resume(Marker),
}

/// Recovers the consumer `options` names (see the module's text); a dry run reads and writes
/// nothing.
pub fn recover(
    connection: &Connection,
    options: &Options,
    snapshots: &Snapshots<'_>,
) -> Result<Recovery> {
    let o = &options.reconcile;
    let target = reset::Target {
        scope: Scope::Collection,
        database: &o.database,
        collection: &o.collection,
        consumer: &o.consumer,
        checkpoints: &o.checkpoints,
        audit: &o.audit,
    };
    let (stored, loaded) = connection.block_on(checkpoint_of(connection, options))?;
    checkpoint::check_policy(&loaded, &snapshots.binding(), "recover")?;
    let start = match (cause(connection, options, &loaded)?, Marker::of(&stored)) {
        (Some(cause), earlier) => {
            let plan = reset::plan(connection, &target, To::Now, Ahead::Refuse)?;
            let mut marker = marker_of(&plan, cause, &options.reason);
            // Moved again (the repair outran the oplog): the recovery is the same one, and the
            // window it lost first is still the one to tell.
            if let Some(earlier) = earlier {
                marker.id = earlier.id;
                marker.since = earlier.since;
                marker.lost_from = earlier.lost_from.or(marker.lost_from);
                marker.gap_seconds = match (marker.lost_from, marker.lost_to) {
                    (Some(from), Some(to)) => Some(i64::from(to.time) - i64::from(from.time)),
                    _ => marker.gap_seconds,
                };
            }
            Start::Move(Box::new(plan), marker)
        }
        (None, Some(marker)) => Start::Resume(marker),
        (None, None) => return Err(nothing_to_recover(connection, options, &loaded)),
    };
    let mut recovery = Recovery {
        consumer: o.consumer.clone(),
        source: format!("{}.{}", o.database, o.collection),
        dry_run: options.dry_run,
        resumed: matches!(start, Start::Resume(_)),
        marker: match &start {
            Start::Move(_, marker) | Start::Resume(marker) => marker.clone(),
        },
        refused: match &start {
            Start::Move(plan, _) => plan
                .current
                .as_ref()
                .and_then(|current| reset::held_by_run(current, "recovering")),
            Start::Resume(_) => None,
        },
        report: None,
        audit_id: None,
        next: options.next.clone(),
    };
    if options.dry_run {
        // A recovery in progress shows what its repair would write; before a move, the
        // comparison cannot be made (the stream cannot be read from the checkpoint).
        if recovery.resumed {
            let reading = reconcile::Options {
                repair: None,
                ..o.clone()
            };
            recovery.report = Some(reconcile::reconcile(connection, &reading, snapshots)?);
        }
        return Ok(recovery);
    }
    let marker = match start {
        Start::Move(plan, mut marker) => {
            if let Some(refusal) = &recovery.refused {
                return Err(HandoffError::Conflict(format!(
                    "{refusal}; nothing was written"
                )));
            }
            connection.block_on(registry::register(
                connection,
                &o.database,
                &[&o.checkpoints, &o.audit],
            ))?;
            let stored = marker.document();
            let how = As {
                command: command(options),
                set: doc! { FIELD: stored.clone() },
                evidence: doc! { FIELD: stored.clone() },
            };
            reset::apply_as(connection, &target, &plan, &options.reason, &how)?;
            tracing::warn!(
                consumer = %o.consumer,
                cause = marker.cause.map(Cause::as_str),
                gap_seconds = marker.gap_seconds,
                "checkpoint moved for a recovery; repairing"
            );
            marker.stored = Some(stored);
            marker
        }
        Start::Resume(marker) => {
            tracing::warn!(consumer = %o.consumer, "completing the repair of a recovery in progress");
            marker
        }
    };
    let report = reconcile::reconcile(connection, o, snapshots).map_err(|error| {
        error.with_detail(&format!(
            "The checkpoint was moved and the recovery is recorded in it: `handoff recover {} \
             --reason '<why>'` completes the repair",
            options.flags
        ))
    })?;
    // The repair's own writes are in the oplog too: ones that outran it left the consumer where
    // it started. The recovery stays recorded; run again, it moves the checkpoint again and
    // repairs what changed since, which is less.
    let (_, now) = connection.block_on(checkpoint_of(connection, options))?;
    if let Some(cause) = cause(connection, options, &now)? {
        let written = report.repair.as_ref().map_or(0, |r| r.written);
        let message = format!(
            "the repair wrote {written} correction records, and the stream no longer resumes \
             from the new position ({}): the repair's writes outran the oplog. The recovery is \
             still recorded: `handoff recover {} --reason '<why>'` moves the checkpoint again \
             and repairs what changed since; a larger oplog keeps this from recurring",
            cause.as_str(),
            options.flags
        );
        return Err(match cause {
            Cause::HistoryLost => HandoffError::HistoryLost(message),
            Cause::InvalidToken => HandoffError::InvalidToken(message),
            Cause::StreamFatal => HandoffError::StreamFatal(message),
        });
    }
    recovery.audit_id = Some(complete(
        connection,
        options,
        &marker,
        &report,
        recovery.resumed,
    )?);
    recovery.report = Some(report);
    Ok(recovery)
}

/// The command as the audit records name it.
fn command(options: &Options) -> String {
    format!("recover --consumer-id {}", options.reconcile.consumer)
}

/// The consumer's checkpoint, as stored and as loaded, refused unless it is one of this source
/// and replica set that recover can repair.
async fn checkpoint_of(
    connection: &Connection,
    options: &Options,
) -> Result<(Document, Checkpoint)> {
    let o = &options.reconcile;
    let stored = operator::consumer_document(
        connection,
        &o.database,
        &o.checkpoints,
        &o.consumer,
        "reading the checkpoint",
    )
    .await
    .map_err(reconcile::server)?;
    let Some(stored) = stored else {
        return Err(crate::status::unknown_consumer(
            connection,
            &o.database,
            &o.checkpoints,
            &o.consumer,
        )
        .await);
    };
    let source = format!("{}.{}", o.database, o.collection);
    let loaded = checkpoint::validate(&stored, &source, connection.deployment().pin())?;
    if let Some(unfit) = Unfit::of(&loaded) {
        return Err(HandoffError::BadInput(format!(
            "Consumer {} {}. Recover repairs as reconcile does, and cannot repair it: {}",
            escape_untrusted(&o.consumer, 64),
            unfit.why(),
            by_hand(&options.flags)
        )));
    }
    Ok((stored, loaded))
}

/// Why the stream cannot resume from the checkpoint (`None`: it resumes, or there is no token):
/// the stream is opened from it and read once, as a run would.
fn cause(connection: &Connection, options: &Options, loaded: &Checkpoint) -> Result<Option<Cause>> {
    let Some(token) = &loaded.token else {
        return Ok(None);
    };
    let Some(resume) = Resume::of(token, loaded.mode) else {
        return Ok(Some(Cause::InvalidToken));
    };
    let o = &options.reconcile;
    let what = "resuming the stream from the checkpoint";
    let read = connection.block_on(async {
        let mut stream = Events::keys_after(
            connection,
            &o.database,
            &o.collection,
            resume,
            PROBE_AWAIT,
            what,
        )
        .await?;
        stream.next(what).await.map(|_| ())
    });
    match read {
        Ok(()) => Ok(None),
        Err(error) => match error.command_code {
            Some(286) => Ok(Some(Cause::HistoryLost)),
            Some(260) => Ok(Some(Cause::InvalidToken)),
            Some(280) => Ok(Some(Cause::StreamFatal)),
            _ => Err(reconcile::server(error)),
        },
    }
}

/// The marker a move by `plan` sets.
fn marker_of(plan: &reset::Plan, cause: Cause, reason: &str) -> Marker {
    let mut marker = Marker::new(reason, cause);
    marker.lost_from = plan.before.checkpoint;
    marker.to = plan.to_time;
    match (cause, plan.before.window) {
        (Cause::HistoryLost, Some(window)) => {
            marker.lost_to = Some(window.oldest);
            marker.gap_seconds = plan.before.estimated_gap_seconds();
        }
        _ => {
            marker.lost_to = plan.to_time;
            marker.gap_seconds = plan.gap_seconds();
        }
    }
    marker
}

/// The refusal of a consumer the stream still resumes, with no recovery in progress.
fn nothing_to_recover(
    connection: &Connection,
    options: &Options,
    loaded: &Checkpoint,
) -> HandoffError {
    let consumer = escape_untrusted(&options.reconcile.consumer, 64);
    let Some(token) = &loaded.token else {
        return HandoffError::BadInput(format!(
            "Nothing to recover: consumer {consumer}'s checkpoint has no token yet (it never \
             completed a run); `handoff run {}` starts it. Nothing was written",
            options.flags
        ));
    };
    let position = connection.block_on(window::position(connection, Some(token)));
    let margin = position
        .oplog_margin_seconds()
        .map_or_else(String::new, |m| format!(" (oplog margin {m} s)"));
    HandoffError::BadInput(format!(
        "Nothing to recover: the stream still resumes from consumer {consumer}'s checkpoint{margin} \
         and no recovery is in progress, so `handoff run {}` resumes it without loss (to look for \
         documents the outbox got wrong: `handoff reconcile {}`). Nothing was written",
        options.flags, options.flags
    ))
}

/// Clears the marker, with the audit record of what the recovery did, in one transaction;
/// returns the record's `_id` (hex).
fn complete(
    connection: &Connection,
    options: &Options,
    marker: &Marker,
    report: &ReconcileReport,
    resumed: bool,
) -> Result<String> {
    let o = &options.reconcile;
    let repair = report.repair.clone().unwrap_or_default();
    let entry = AuditEntry {
        consumer: o.consumer.clone(),
        source: report.source.clone(),
        command: command(options),
        from: Bson::Document(doc! { FIELD: marker.stored.clone() }),
        to: Bson::Document(doc! { FIELD: Bson::Null }),
        reason: options.reason.clone(),
        evidence: doc! {
            "resumed": resumed,
            "checked": report.checked as i64,
            "missing": report.missing.count as i64,
            "orphan": report.orphan.count as i64,
            "stale": report.stale.count as i64,
            "held_by_policy": {
                "quarantined": report.quarantined.count as i64,
                "skipped": report.skipped.count as i64,
            },
            "in_flight": report.in_flight as i64,
            "correction_records": repair.written as i64,
            "already_present": repair.already_present as i64,
            "repair_audit_id": repair.audit_id,
            "next": &options.next,
        },
    };
    let record = entry.document();
    let mut filter = doc! { "_id": &o.consumer };
    filter.insert(
        FIELD,
        marker.stored.clone().map_or(Bson::Null, Bson::Document),
    );
    let change = CheckpointMove {
        database: &o.database,
        checkpoints: &o.checkpoints,
        audit: &o.audit,
        filter,
        update: doc! { "$unset": { FIELD: "" }, "$inc": { "revision": 1_i64 } },
        record: &record,
    };
    reset::apply_move(connection, &change, "recovery's completion")?;
    tracing::info!(consumer = %o.consumer, written = repair.written, "recovery complete");
    Ok(record
        .get_object_id("_id")
        .map(|id| id.to_hex())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_by_hand_name_the_consumer() {
        let text = by_hand("--consumer-id x");
        assert!(text.contains("handoff checkpoint reset --consumer-id x --to now"));
        assert!(text.contains("handoff run --consumer-id x"));
    }

    #[test]
    fn the_marker_of_a_move_holds_the_lost_window() {
        use bson::Timestamp;
        use handoff_domain::position::{Position, Window};
        let at = |time| Timestamp { time, increment: 1 };
        let plan = reset::Plan {
            consumer: "c".into(),
            source: "db.orders".into(),
            current: None,
            to_token: doc! { "_data": "00" },
            to_mode: handoff_domain::checkpoint::Mode::ResumeAfter,
            before: Position {
                checkpoint: Some(at(1_000)),
                cluster_now: Some(at(1_500)),
                window: Some(Window {
                    oldest: at(1_060),
                    newest: at(1_500),
                }),
                wall_now: 1_500,
            },
            to_time: Some(at(1_500)),
            to: To::Now,
        };
        let lost = marker_of(&plan, Cause::HistoryLost, "INC-42");
        assert_eq!(lost.lost_from, Some(at(1_000)));
        assert_eq!(lost.lost_to, Some(at(1_060)));
        assert_eq!(lost.gap_seconds, Some(60));
        assert_eq!(lost.to, Some(at(1_500)));
        assert_eq!(lost.reason, "INC-42");
        // A token that cannot resume: everything up to the new position went unread.
        let invalid = marker_of(&plan, Cause::InvalidToken, "INC-43");
        assert_eq!(invalid.lost_to, Some(at(1_500)));
        assert_eq!(invalid.gap_seconds, Some(500));
    }
}
