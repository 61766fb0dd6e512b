//! The checkpoint, outbox and quarantine collections, written in one transaction per commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bson::{Bson, Document, RawDocument, RawDocumentBuf, doc};
use mongodb::error::PartialBulkWriteResult;
use mongodb::error::{Error as DriverError, ErrorKind, TRANSIENT_TRANSACTION_ERROR, WriteFailure};
use mongodb::options::{InsertOneModel, ReturnDocument, UpdateOneModel, WriteModel};
use mongodb::{ClientSession, Collection};

use super::MAX_DOCUMENT_BYTES;
use super::connection::Connection;
use super::errors::server_error;
use super::transaction::{self, Decision, Failure};
use crate::domain::checkpoint::CONFIG_CHANGES_KEPT;
use crate::domain::store::{SPLIT_EVENTS_WRITTEN, admit_events, decode_record, lookups};
use crate::domain::stream::BSON_OBJECT_TOO_LARGE;
use crate::domain::{Applied, CheckpointStore, Claim, Collections, Commit, CommitError, Dump};

/// How long past the run's deadline giving the lease back may take.
const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// What decoding a record into the driver's document and encoding it again costs, per byte of
/// the record (measured on change events of a few hundred bytes; a record's field names and
/// nesting cost more than its length, so this leans high for large flat values).
const DECODE_NANOS_PER_BYTE: u64 = 15;

/// What an interrupted transaction means for the operator.
const DEADLINE_IN_COMMIT: &str = "the run deadline passed while a transaction was in flight; its outcome is unknown, \
     and the next run resumes from whatever was committed";

/// The checkpoint, outbox and quarantine collections.
pub struct MongoStore {
    connection: Arc<Connection>,
    checkpoints: Collection<Document>,
    outbox: Collection<Document>,
    quarantine: Collection<Document>,
    /// Transactions and commits retried, over the store's lifetime.
    retries: AtomicU32,
    /// Whether commits use `bulkWrite` (MongoDB 8.0 and later); cleared once the driver finds
    /// the server older.
    bulk_write: AtomicBool,
    /// Whether the consumer has written a split event's records (its checkpoint's
    /// `splitEventsWritten`): an event may then be held in fragments under other `_id`s than its
    /// records', which a duplicate key would not reveal, so every commit looks first.
    split_events: AtomicBool,
    /// The checkpoint's token as the lease's release left it (`Some(None)`: a checkpoint without
    /// a token); unset until a release found the lease.
    released: std::sync::Mutex<Option<Option<Document>>>,
}

impl MongoStore {
    pub fn new(
        connection: Arc<Connection>,
        database: &str,
        collections: &Collections,
    ) -> MongoStore {
        let db = connection.database(database);
        MongoStore {
            checkpoints: db.collection(&collections.checkpoints),
            outbox: db.collection(&collections.outbox),
            quarantine: db.collection(&collections.quarantine),
            connection,
            retries: AtomicU32::new(0),
            bulk_write: AtomicBool::new(true),
            split_events: AtomicBool::new(false),
            released: std::sync::Mutex::new(None),
        }
    }

    /// The checkpoint's token as the lease's release left it, read in the same command; `None`
    /// when no release found the lease (a run that never held it, or lost it, or could not reach
    /// the server to give it back).
    pub fn released_token(&self) -> Option<Option<Document>> {
        self.released.lock().ok()?.clone()
    }

    /// The filter and update that end `owner`'s lease at `at`, if it still holds it.
    fn lease_end(consumer: &str, owner: &str, at: bson::DateTime) -> (Document, Document) {
        (
            doc! { "_id": consumer, "owner": owner },
            doc! { "$set": { "leaseUntil": at }, "$inc": { "revision": 1_i64 } },
        )
    }

    /// A failed store operation: a missing privilege (`Unauthorized`, code 13), else an outage.
    fn unavailable(&self, error: &DriverError) -> CommitError {
        let detail = server_error(error, &self.connection.redactor);
        if detail.code == Some(13) {
            CommitError::Unauthorized(detail.to_string())
        } else {
            CommitError::Unavailable(detail.to_string())
        }
    }

    /// The records of `records` to insert, leaving out those of events the collection holds
    /// under their IDs, whole or in fragments (their IDs added to `duplicates`); a record held
    /// there for another event is a conflict.
    async fn not_yet_stored<'r>(
        &self,
        session: &mut ClientSession,
        collection: &Collection<Document>,
        records: &'r [RawDocumentBuf],
        duplicates: &mut Vec<String>,
    ) -> std::result::Result<Vec<&'r RawDocumentBuf>, Attempt> {
        let lookups = lookups(records).map_err(Attempt::Final)?;
        let keys: Vec<Bson> = lookups
            .iter()
            .map(|l| Bson::String(l.key.clone()))
            .collect();
        let mut clauses = vec![Bson::Document(doc! { "_id": { "$in": keys } })];
        clauses.extend(lookups.into_iter().map(|l| {
            Bson::Document(doc! { "_id": { "$gte": l.fragments.start, "$lt": l.fragments.end } })
        }));
        let mut cursor = collection
            .find(doc! { "$or": clauses })
            .projection(doc! {
                "_id": 1, "consumer": 1, "source": 1, "token": 1,
                "event._id": 1, "event.splitEvent": 1,
            })
            .session(&mut *session)
            .await
            .map_err(Attempt::from)?;
        let mut stored = Vec::new();
        while let Some(found) = cursor.next(&mut *session).await {
            stored.push(found.map_err(Attempt::from)?);
        }
        let admitted = admit_events(records, &stored, duplicates).map_err(Attempt::Final)?;
        Ok(records
            .iter()
            .zip(admitted)
            .filter_map(|(record, insert)| insert.then_some(record))
            .collect())
    }

    /// The compare-and-set and the record inserts, inside the session's transaction: one
    /// `bulkWrite` on MongoDB 8.0 and later unless the records are cheaper written apart (see
    /// [`MongoStore::cheaper_apart`]), else an `update` and an `insertMany` per collection.
    async fn statements(
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
fn no_bulk_write(error: &DriverError) -> bool {
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

enum Attempt {
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

impl CheckpointStore for MongoStore {
    fn ensure_checkpoint(
        &self,
        consumer: &str,
        initial: Document,
    ) -> std::result::Result<Document, CommitError> {
        let mut on_insert = initial;
        on_insert.remove("_id");
        // One round trip: the upsert returns the checkpoint as it now stands (acknowledged by a
        // majority, like every write here).
        let checkpoint = self
            .connection
            .bounded(async {
                self.checkpoints
                    .find_one_and_update(
                        doc! { "_id": consumer },
                        doc! { "$setOnInsert": on_insert },
                    )
                    .upsert(true)
                    .return_document(ReturnDocument::After)
                    .await
                    .map_err(|e| self.unavailable(&e))?
                    .ok_or_else(|| {
                        CommitError::Unavailable("the checkpoint vanished after its upsert".into())
                    })
            })
            .map_err(|_| {
                CommitError::Unavailable(
                    "the run deadline passed while loading the checkpoint".into(),
                )
            })??;
        if checkpoint.get_bool(SPLIT_EVENTS_WRITTEN).unwrap_or(false) {
            self.split_events.store(true, Ordering::Relaxed);
        }
        Ok(checkpoint)
    }

    /// One transaction through the transaction runner. With `look_first` (the attempt after a
    /// record's `_id` was found taken, or any attempt once split events are about), what the
    /// collections hold under the IDs of the commit's events (whole or in fragments) is looked
    /// up in the transaction before the inserts, so that events already stored are left out;
    /// the common case costs no extra round trip.
    fn commit(&self, commit: &Commit<'_>) -> std::result::Result<Applied, CommitError> {
        let retried = async {
            // A split event may be held under other `_id`s than its records' (another split, or
            // none): a duplicate key would not show it.
            let split_events = commit.holds_fragments();
            let mut look_first = split_events || self.split_events.load(Ordering::Relaxed);
            let committed = transaction::run(
                &self.connection,
                &self.checkpoints,
                &self.retries,
                async |session| match self.statements(session, commit, look_first).await {
                    Ok(applied) => Ok(Decision::Commit(applied)),
                    Err(Attempt::Final(CommitError::Duplicate(_))) if !look_first => {
                        look_first = true;
                        Ok(Decision::Again)
                    }
                    Err(Attempt::Again) => Ok(Decision::Again),
                    Err(Attempt::Final(e)) => Ok(Decision::Refuse(e)),
                    Err(Attempt::Transient(e) | Attempt::Driver(e)) => Err(e),
                },
            )
            .await;
            if committed.is_ok() && split_events {
                self.split_events.store(true, Ordering::Relaxed);
            }
            committed.map_err(|failure| match failure {
                Failure::Refused(e) => e,
                Failure::Failed(e) | Failure::Unknown(e) => self.unavailable(&e),
            })
        };
        self.connection
            .bounded(retried)
            .map_err(|_| CommitError::Unavailable(DEADLINE_IN_COMMIT.into()))?
    }

    fn claim(&self, consumer: &str, claim: &Claim) -> std::result::Result<(), CommitError> {
        let revision = claim
            .seen_revision
            .map_or(Bson::Document(doc! { "$exists": false }), Bson::Int64);
        let mut update = doc! { "$set": claim.set.clone(), "$inc": { "revision": 1_i64 } };
        if let Some(change) = &claim.change {
            update.insert(
                "$push",
                doc! { "configChanges": { "$each": [change.clone()], "$slice": -CONFIG_CHANGES_KEPT } },
            );
        }
        let changed = self
            .connection
            .bounded(async {
                self.checkpoints
                    .update_one(doc! { "_id": consumer, "revision": revision }, update)
                    .await
                    .map_err(|e| self.unavailable(&e))
            })
            .map_err(|_| {
                CommitError::Unavailable("the run deadline passed while taking the lease".into())
            })??;
        if changed.matched_count == 1 {
            Ok(())
        } else {
            Err(CommitError::Conflict)
        }
    }

    fn release(
        &self,
        consumer: &str,
        owner: &str,
        at: bson::DateTime,
    ) -> std::result::Result<(), CommitError> {
        // A run stopped by its deadline still gives its lease back, if it can within a second
        // (a transaction its deadline interrupted may hold the checkpoint longer: then the lease
        // expires by itself). The same command returns the checkpoint's token, which the
        // figures read at the end need.
        if let Ok(mut released) = self.released.lock() {
            *released = None;
        }
        let (filter, update) = MongoStore::lease_end(consumer, owner, at);
        let release = self
            .checkpoints
            .find_one_and_update(filter, update)
            .projection(doc! { "token": 1 })
            .return_document(ReturnDocument::After);
        let found = self
            .connection
            .bounded_past_deadline(async { release.await }, RELEASE_GRACE)
            .map_err(|_| CommitError::Unavailable("ending the lease took too long".into()))?
            .map_err(|e| self.unavailable(&e))?;
        if let (Some(checkpoint), Ok(mut released)) = (found, self.released.lock()) {
            *released = Some(checkpoint.get_document("token").ok().cloned());
        }
        Ok(())
    }

    fn renew(
        &self,
        consumer: &str,
        owner: &str,
        until: bson::DateTime,
    ) -> std::result::Result<(), CommitError> {
        let (filter, update) = MongoStore::lease_end(consumer, owner, until);
        let renew = self.checkpoints.update_one(filter, update);
        self.connection
            .bounded_past_deadline(async { renew.await }, RELEASE_GRACE)
            .map_err(|_| CommitError::Unavailable("extending the lease took too long".into()))?
            .map(|_| ())
            .map_err(|e| self.unavailable(&e))
    }

    fn transaction_retries(&self) -> u32 {
        self.retries.load(Ordering::Relaxed)
    }

    fn dump(&self, consumer: &str) -> std::result::Result<Dump, CommitError> {
        use futures_util::TryStreamExt;
        self.connection.block_on(async {
            let checkpoint = self
                .checkpoints
                .find_one(doc! { "_id": consumer })
                .await
                .map_err(|e| self.unavailable(&e))?;
            let mut records = Vec::new();
            for collection in [&self.outbox, &self.quarantine] {
                let found: Vec<Document> = collection
                    .find(doc! { "consumer": consumer })
                    .await
                    .map_err(|e| self.unavailable(&e))?
                    .try_collect()
                    .await
                    .map_err(|e| self.unavailable(&e))?;
                records.push(found);
            }
            let quarantine = records.pop().unwrap_or_default();
            let outbox = records.pop().unwrap_or_default();
            Ok(Dump {
                checkpoint,
                outbox,
                quarantine,
            })
        })
    }
}
