//! A reconcile's own reads and writes: a consumer's outbox records, one at a time, and a
//! repair's correction records committed through the transaction runner. The comparison itself
//! is the command's (`operate::reconcile`).

use std::collections::HashSet;
use std::convert::Infallible;

use bson::{Bson, Document, RawDocumentBuf, doc};
use futures_util::TryStreamExt;
use mongodb::error::Error as DriverError;
use mongodb::{ClientSession, Collection};

use super::Connection;
use super::errors::OperationError;
use super::transaction::{self, Decision, Failure};

/// The records of `outbox` that `filter` matches, with the fields of `projection`, read
/// `batch_size` to a reply and given to `each` one at a time.
pub async fn outbox_records(
    connection: &Connection,
    database: &str,
    outbox: &str,
    filter: Document,
    projection: Document,
    batch_size: u32,
    mut each: impl FnMut(Document),
) -> Result<(), OperationError> {
    let failed = connection.failed("reading the outbox");
    let mut cursor = connection
        .database(database)
        .collection::<Document>(outbox)
        .find(filter)
        .projection(projection)
        .batch_size(batch_size)
        .await
        .map_err(failed)?;
    while let Some(record) = cursor.try_next().await.map_err(failed)? {
        each(record);
    }
    Ok(())
}

/// Where a repair writes.
pub struct RepairNames<'a> {
    pub database: &'a str,
    pub outbox: &'a str,
    pub quarantine: &'a str,
    /// The audit collection.
    pub audit: &'a str,
}

/// A repair batch's records: what the policy handed off and what it quarantined.
pub struct Corrections<'a> {
    pub outbox: &'a [RawDocumentBuf],
    pub quarantine: &'a [RawDocumentBuf],
}

/// One repair transaction through the transaction runner: the records whose `_id` their
/// collection (outbox or quarantine) does not hold yet, and the audit record (once: a retried
/// first transaction whose commit went through has it already). Returns how many records were
/// written and how many were found already stored. A failure's `what` is `handing off
/// correction records`.
pub async fn commit_corrections(
    connection: &Connection,
    names: &RepairNames<'_>,
    corrections: &Corrections<'_>,
    audit: Option<&Document>,
) -> Result<(u64, u64), Failure<Infallible, OperationError>> {
    let db = connection.database(names.database);
    let outbox = db.collection::<RawDocumentBuf>(names.outbox);
    let quarantine = db.collection::<RawDocumentBuf>(names.quarantine);
    let audit_records = db.collection::<Document>(names.audit);
    let retries = std::sync::atomic::AtomicU32::new(0);
    let abandon_on = outbox.clone_with_type::<Document>();
    transaction::run(connection, &abandon_on, &retries, async |session| {
        if let Some(audit) = audit {
            insert_audit_once(session, &audit_records, audit).await?;
        }
        let (mut written, mut present) = (0, 0);
        for (collection, records) in [
            (&outbox, corrections.outbox),
            (&quarantine, corrections.quarantine),
        ] {
            let (w, p) = insert_fresh(session, collection, records).await?;
            written += w;
            present += p;
        }
        Ok(Decision::<_, Infallible>::Commit((written, present)))
    })
    .await
    .map_err(|failure| failure.described("handing off correction records", connection))
}

/// The audit record, unless a retried first transaction whose commit went through holds it.
async fn insert_audit_once(
    session: &mut ClientSession,
    audit_records: &Collection<Document>,
    audit: &Document,
) -> Result<(), DriverError> {
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
    Ok(())
}

/// The `records` whose `_id` `collection` does not hold yet, inserted. Returns (written,
/// already present).
async fn insert_fresh(
    session: &mut ClientSession,
    collection: &Collection<RawDocumentBuf>,
    records: &[RawDocumentBuf],
) -> Result<(u64, u64), DriverError> {
    if records.is_empty() {
        return Ok((0, 0));
    }
    let ids: Vec<&str> = records
        .iter()
        .filter_map(|r| r.get_str("_id").ok())
        .collect();
    let mut stored = HashSet::new();
    let mut cursor = collection
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
    if !fresh.is_empty() {
        collection
            .insert_many(fresh.iter().copied())
            .ordered(true)
            .session(&mut *session)
            .await?;
    }
    Ok((fresh.len() as u64, stored.len() as u64))
}
