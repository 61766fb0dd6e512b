//! What the consumer's policy makes of each difference's document as it is now, and
//! `--repair`: the correction records it hands off, [`REPAIR_BATCH`] per transaction, the audit
//! record in the first.

use std::time::Duration;

use bson::{Bson, Document, doc};

use super::compare::{self, Difference};
use super::in_flight::now;
use super::{Options, REPAIR_BATCH, ReconcileReport, Repaired, server, time_text};
use crate::audit::AuditEntry;
use crate::outbox_view::{Said, StreamOrder, digest};
use crate::progress::Progress;
use handoff_backend::snapshot::{Read, SnapshotPosition};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;
use handoff_mongo::reconcile::{Corrections, RepairNames, commit_corrections};
use handoff_mongo::transaction::Failure;
use handoff_mongo::{Connection, registry};
use handoff_run::snapshot::{Fate, Snapshots};

/// The documents of `batch` as they are now (`None`: gone), in its order.
async fn reads_of(
    connection: &Connection,
    options: &Options,
    batch: &[Difference],
) -> Result<Vec<Read>> {
    let keys: Vec<Bson> = batch.iter().map(|d| d.key.clone()).collect();
    compare::reads_of(connection, (&options.database, &options.collection), &keys).await
}

/// A snapshot position: a resume token and its cluster time.
fn snapshot_position(token: Document, at: &StreamOrder) -> SnapshotPosition {
    SnapshotPosition {
        token,
        cluster_time: at.cluster_time(),
    }
}

/// What the consumer's policy makes of each difference's document as it is now, and what the
/// source holds for it, in order.
pub(super) async fn policy_fates(
    connection: &Connection,
    options: &Options,
    snapshots: &Snapshots<'_>,
    differences: &[Difference],
) -> Result<Vec<(Fate, Said)>> {
    let mut fates = Vec::with_capacity(differences.len());
    for batch in differences.chunks(REPAIR_BATCH) {
        let (token, at) = now(connection, options).await?;
        let reads = reads_of(connection, options, batch).await?;
        let decided = snapshots.decide(&reads, &snapshot_position(token, &at))?;
        let held = reads.iter().map(|read| match &read.document {
            Some(document) => Said::Present(digest(document)),
            None => Said::Absent,
        });
        fates.extend(decided.fates.into_iter().zip(held));
    }
    Ok(fates)
}

/// Hands off correction records for `differences`, [`REPAIR_BATCH`] per transaction, the audit
/// record in the first, once the outbox and audit collections are registered.
pub(super) async fn repair(
    connection: &Connection,
    options: &Options,
    reason: &str,
    report: &ReconcileReport,
    differences: &[Difference],
    snapshots: &Snapshots<'_>,
) -> Result<Repaired> {
    registry::register(
        connection,
        &options.database,
        &[&options.outbox, &options.quarantine, &options.audit],
    )
    .await?;
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
    let names = RepairNames {
        database: &options.database,
        outbox: &options.outbox,
        quarantine: &options.quarantine,
        audit: &options.audit,
    };
    let progress = Progress::to("repair", Some(differences.len() as u64), options.progress);
    for batch in differences.chunks(REPAIR_BATCH) {
        // The position first, then the documents: a change after it comes later in the stream.
        let (position, at) = position_after(connection, options, batch).await?;
        let reads = reads_of(connection, options, batch).await?;
        let decided = snapshots.decide(&reads, &snapshot_position(position, &at))?;
        repaired.held += decided.count(Fate::Skipped);
        let corrections = Corrections {
            outbox: &decided.outbox,
            quarantine: &decided.quarantine,
        };
        let (written, present) = commit(connection, &names, &corrections, audit.as_ref()).await?;
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
    connection: &Connection,
    options: &Options,
    batch: &[Difference],
) -> Result<(Document, StreamOrder)> {
    let latest = batch.iter().filter_map(|d| d.latest.as_ref()).max();
    let mut tries = 0;
    loop {
        let (token, at) = now(connection, options).await?;
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

/// One transaction: the records not yet stored (and the audit record). Returns (written,
/// already present).
async fn commit(
    connection: &Connection,
    names: &RepairNames<'_>,
    corrections: &Corrections<'_>,
    audit: Option<&Document>,
) -> Result<(u64, u64)> {
    match commit_corrections(connection, names, corrections, audit).await {
        Ok(counts) => Ok(counts),
        Err(Failure::Refused(never)) => match never {},
        Err(Failure::Failed(error)) => Err(server(error)),
        Err(Failure::Unknown(error)) => Err(HandoffError::Unavailable(format!(
            "{}: the commit's outcome is unknown ({}); running the repair again writes \
             only what is missing",
            error.what,
            escape_untrusted(&error.text, 500)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use bson::Timestamp;

    use super::*;

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
        let event = handoff_backend::snapshot::event("db", "orders", &read, &at);
        let position = StreamOrder::of_event(&event).unwrap();
        assert_eq!(position.cluster_time(), time);
        assert_eq!(position.data, "8265A1B2C3000000012B0429296E1404");
    }
}
