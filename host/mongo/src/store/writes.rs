//! A commit's statements inside its transaction: the checkpoint's compare-and-set and the record
//! inserts, as one `bulkWrite` where the server has it and it is cheaper, else an `update` and an
//! `insertMany` per collection; and what a failed write means for the attempt.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bson::{Bson, Document, RawDocument, RawDocumentBuf, doc};
use mongodb::ClientSession;
use mongodb::error::PartialBulkWriteResult;
use mongodb::error::{Error as DriverError, ErrorKind, TRANSIENT_TRANSACTION_ERROR, WriteFailure};
use mongodb::options::{InsertOneModel, UpdateOneModel, WriteModel};

use crate::MAX_DOCUMENT_BYTES;
use handoff_domain::store::{SPLIT_EVENTS_WRITTEN, decode_record};
use handoff_domain::stream::BSON_OBJECT_TOO_LARGE;
use handoff_domain::{Applied, Commit, CommitError};

use super::MongoStore;

/// What decoding a record into the driver's document and encoding it again costs, per byte of
/// the record (measured on change events of a few hundred bytes; a record's field names and
/// nesting cost more than its length, so this leans high for large flat values).
const DECODE_NANOS_PER_BYTE: u64 = 15;

impl MongoStore {
    /// The compare-and-set and the record inserts, inside the session's transaction: one
    /// `bulkWrite` on MongoDB 8.0 and later unless the records are cheaper written apart (see
    /// [`MongoStore::cheaper_apart`]), else an `update` and an `insertMany` per collection.
    pub(super) async fn statements(
        &self,
        session: &mut ClientSession,
        commit: &Commit<'_>,
        look_first: bool,
    ) -> std::result::Result<Applied, Attempt> {
        let mut applied = Applied::default();
        let mut writes: [Vec<&RawDocumentBuf>; 2] = [Vec::new(), Vec::new()];
        for (collection, records, insert) in [
            (&self.outbox, &commit.outbox, 0),
            (&self.quarantine, &commit.quarantine, 1),
        ] {
            if records.is_empty() {
                continue;
            }
            if let Some(id) = oversized(records) {
                return Err(Attempt::Final(CommitError::TooLarge(id)));
            }
            writes[insert] = if look_first {
                self.not_yet_stored(session, collection, records, &mut applied.duplicates)
                    .await?
            } else {
                records.iter().collect()
            };
        }
        let expected = commit
            .expected
            .map_or(Bson::Null, |t| Bson::Document(t.clone()));
        let mut filter = doc! { "_id": &commit.consumer.consumer, "token": expected, "source": &commit.consumer.source };
        let mut set = doc! { "token": commit.next.clone(), "mode": commit.mode.as_str() };
        if let Some(policy) = commit.policy {
            set.insert("policy", policy.document());
        }
        if commit.holds_fragments() {
            set.insert(SPLIT_EVENTS_WRITTEN, true);
        }
        if let Some(lease) = commit.lease {
            filter.insert("owner", &lease.owner);
            set.insert("leaseUntil", lease.until(bson::DateTime::now()));
        }
        let update = doc! { "$set": set, "$inc": { "revision": 1_i64 } };
        if self.bulk_write.load(Ordering::Relaxed) && !self.cheaper_apart(&writes) {
            return match self.bulk(session, &filter, &update, &writes).await {
                Err(Attempt::Driver(e)) if no_bulk_write(&e) => {
                    // Older than 8.0 (the driver refuses before sending anything, but counts the
                    // transaction as started), or 8.0 at an older feature compatibility version
                    // (the server refuses): this transaction is abandoned and the commit starts
                    // again with separate writes, once per process.
                    tracing::debug!("the server has no bulkWrite; separate writes from now on");
                    self.bulk_write.store(false, Ordering::Relaxed);
                    Err(Attempt::Again)
                }
                done => done.map(|()| applied),
            };
        }
        let changed = self
            .checkpoints
            .update_one(filter, update)
            .session(&mut *session)
            .await
            .map_err(Attempt::from)?;
        if changed.matched_count != 1 {
            return Err(Attempt::Final(CommitError::Conflict));
        }
        for (collection, insert) in [(&self.outbox, &writes[0]), (&self.quarantine, &writes[1])] {
            if insert.is_empty() {
                continue;
            }
            // The records as encoded: the driver sends their bytes without decoding them.
            if let Err(e) = collection
                .clone_with_type::<RawDocumentBuf>()
                .insert_many(insert.iter().copied())
                .ordered(true)
                .session(&mut *session)
                .await
            {
                return Err(insert_failure(e, insert));
            }
        }
        Ok(applied)
    }

    /// Whether `writes` cost less written apart from the compare-and-set (an `update`, then one
    /// `insert` per collection, each record sent as it is) than in one `bulkWrite`, whose driver
    /// model holds each record decoded and encodes it again: so when decoding the records would
    /// take longer than the round trips the separate writes add. A commit of one event is always
    /// one `bulkWrite`; a large batch on a nearby server is written apart, and the same batch
    /// across a slow network in one `bulkWrite`.
    fn cheaper_apart(&self, writes: &[Vec<&RawDocumentBuf>; 2]) -> bool {
        let bytes: usize = writes.iter().flatten().map(|r| r.as_bytes().len()).sum();
        let decoding = Duration::from_nanos((bytes as u64).saturating_mul(DECODE_NANOS_PER_BYTE));
        let added = writes.iter().filter(|records| !records.is_empty()).count() as u32;
        decoding > self.connection.round_trip.saturating_mul(added)
    }

    /// The compare-and-set and the inserts as one ordered `bulkWrite`: the update first, then
    /// the outbox records, then the quarantine records.
    async fn bulk(
        &self,
        session: &mut ClientSession,
        filter: &Document,
        update: &Document,
        writes: &[Vec<&RawDocumentBuf>; 2],
    ) -> std::result::Result<(), Attempt> {
        let mut models: Vec<WriteModel> = Vec::with_capacity(1 + writes[0].len() + writes[1].len());
        models.push(
            UpdateOneModel::builder()
                .namespace(self.checkpoints.namespace())
                .filter(filter.clone())
                .update(update.clone())
                .build()
                .into(),
        );
        for (collection, insert) in [(&self.outbox, &writes[0]), (&self.quarantine, &writes[1])] {
            let namespace = collection.namespace();
            for record in insert {
                // The driver's model holds a document: the record is decoded once, here.
                let document = decode_record(record).map_err(Attempt::Final)?;
                models.push(
                    InsertOneModel::builder()
                        .namespace(namespace.clone())
                        .document(document)
                        .build()
                        .into(),
                );
            }
        }
        let records: Vec<&RawDocumentBuf> = writes.iter().flatten().copied().collect();
        match self
            .connection
            .client
            .bulk_write(models)
            .ordered(true)
            .session(&mut *session)
            .await
        {
            Ok(result) if result.matched_count != 1 => Err(Attempt::Final(CommitError::Conflict)),
            // Every record acknowledged, or nothing is committed.
            Ok(result) if result.inserted_count != records.len() as i64 => {
                Err(Attempt::Final(CommitError::Unavailable(format!(
                    "the server acknowledged {} of the commit's {} records; nothing was committed",
                    result.inserted_count,
                    records.len()
                ))))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(bulk_failure(e, &records)),
        }
    }
}

/// Whether a failed `bulkWrite` says the server has none: the driver's refusal of a server older
/// than 8.0, or the server's own (`CommandNotSupported` at a feature compatibility version before
/// 8.0, `CommandNotFound`).
pub(crate) fn no_bulk_write(error: &DriverError) -> bool {
    match error.kind.as_ref() {
        ErrorKind::IncompatibleServer { .. } => true,
        ErrorKind::Command(e) => matches!(e.code, 59 | 115),
        _ => false,
    }
}

/// Classifies a failed `bulkWrite` whose first operation is the compare-and-set and whose others
/// insert `records` in order: a missed compare-and-set is a conflict whatever failed after it,
/// else as [`insert_failure`] for the first failed insert.
fn bulk_failure(error: DriverError, records: &[&RawDocumentBuf]) -> Attempt {
    if error.contains_label(TRANSIENT_TRANSACTION_ERROR) {
        return Attempt::Transient(error);
    }
    let ErrorKind::BulkWrite(failure) = error.kind.as_ref() else {
        return Attempt::Driver(error);
    };
    let Some(first) = failure.write_errors.keys().min().copied() else {
        return Attempt::Driver(error);
    };
    if first == 0 {
        return Attempt::Driver(error);
    }
    let matched = match &failure.partial_result {
        Some(PartialBulkWriteResult::Summary(summary)) => summary.matched_count,
        Some(PartialBulkWriteResult::Verbose(verbose)) => verbose.summary.matched_count,
        None => 0,
    };
    if matched != 1 {
        return Attempt::Final(CommitError::Conflict);
    }
    let Some(write) = failure.write_errors.get(&first) else {
        return Attempt::Driver(error);
    };
    let id = records
        .get(first - 1)
        .map(|record| record_id(record))
        .unwrap_or_default();
    match write.code {
        11000 => Attempt::Final(CommitError::Duplicate(id)),
        code if code == BSON_OBJECT_TOO_LARGE
            || write.code_name.as_deref() == Some("BSONObjectTooLarge") =>
        {
            Attempt::Final(CommitError::TooLarge(id))
        }
        _ => Attempt::Driver(error),
    }
}

/// The `_id` of the first record over the document limit, if any.
fn oversized<'a>(records: impl IntoIterator<Item = &'a RawDocumentBuf>) -> Option<String> {
    records
        .into_iter()
        .find(|record| record.as_bytes().len() > MAX_DOCUMENT_BYTES)
        .map(|record| record_id(record))
}

fn record_id(record: &RawDocument) -> String {
    record.get_str("_id").unwrap_or("").to_string()
}

/// Classifies a failed `insertMany`: the failing record's `_id` for a duplicate key (11000) or a
/// record over the document limit (10334), a transient error to retry, or a driver error.
fn insert_failure(error: DriverError, records: &[&RawDocumentBuf]) -> Attempt {
    if error.contains_label(TRANSIENT_TRANSACTION_ERROR) {
        return Attempt::Transient(error);
    }
    let failed = match error.kind.as_ref() {
        ErrorKind::InsertMany(e) => e
            .write_errors
            .as_ref()
            .and_then(|errors| errors.first())
            .map(|w| (w.code, w.code_name.clone(), Some(w.index))),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some((w.code, w.code_name.clone(), None)),
        ErrorKind::Command(c) => Some((c.code, Some(c.code_name.clone()), None)),
        _ => None,
    };
    let id_at = |index: Option<usize>| {
        index
            .and_then(|i| records.get(i))
            .map(|record| record_id(record))
            .unwrap_or_default()
    };
    match failed {
        Some((11000, _, index)) => Attempt::Final(CommitError::Duplicate(id_at(index))),
        Some((code, name, index))
            if code == BSON_OBJECT_TOO_LARGE || name.as_deref() == Some("BSONObjectTooLarge") =>
        {
            let id = match index {
                Some(_) => id_at(index),
                None => oversized(records.iter().copied()).unwrap_or_default(),
            };
            Attempt::Final(CommitError::TooLarge(id))
        }
        _ => Attempt::Driver(error),
    }
}

pub(super) enum Attempt {
    /// Nothing was written and the reason is gone: start the commit again, not counted as a
    /// retry.
    Again,
    Transient(DriverError),
    Driver(DriverError),
    Final(CommitError),
}

impl From<DriverError> for Attempt {
    fn from(e: DriverError) -> Attempt {
        if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
            Attempt::Transient(e)
        } else {
            Attempt::Driver(e)
        }
    }
}
