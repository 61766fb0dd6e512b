//! The checkpoint, outbox and quarantine collections, written in one transaction per commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bson::{Bson, Document, RawDocumentBuf, doc};
use mongodb::error::Error as DriverError;
use mongodb::options::ReturnDocument;
use mongodb::{ClientSession, Collection};

use super::connection::Connection;
use super::errors::server_error;
use super::transaction::{self, Decision, Failure};

mod release;
mod writes;
use handoff_domain::checkpoint::{self, CONFIG_CHANGES_KEPT};
use handoff_domain::store::{SPLIT_EVENTS_WRITTEN, admit_events, lookups};
use handoff_domain::{Applied, CheckpointStore, Claim, Collections, Commit, CommitError, Dump};
use writes::Attempt;
pub(crate) use writes::no_bulk_write;

/// How long past the run's deadline giving the lease back may take.
const RELEASE_GRACE: Duration = Duration::from_secs(1);

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
    /// The checkpoint's token as this store last read or committed it (`Some(None)`: a
    /// checkpoint without a token); unset before the checkpoint is read, and again after a
    /// commit whose outcome is unknown.
    known: std::sync::Mutex<Option<Option<Document>>>,
    /// The run history's collection and how many records a consumer keeps there.
    runs: Option<(Collection<Document>, u32)>,
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
            known: std::sync::Mutex::new(None),
            runs: None,
        }
    }

    /// Keeps each run's record in `collection` of the same database, `keep` records per
    /// consumer (see [`handoff_domain::history`]).
    pub fn keeping_runs(mut self, database: &str, collection: &str, keep: u32) -> MongoStore {
        let db = self.connection.database(database);
        self.runs = Some((db.collection(collection), keep));
        self
    }

    /// The checkpoint's token as this store last read or committed it; `None` when unknown (no
    /// checkpoint read yet, or a commit whose outcome is unknown since). A run holding the
    /// lease is the only writer of its checkpoint, so this is the stored token.
    pub fn known_token(&self) -> Option<Option<Document>> {
        self.known.lock().ok()?.clone()
    }

    fn know(&self, token: Option<Option<Document>>) {
        if let Ok(mut known) = self.known.lock() {
            *known = token;
        }
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
        // A checkpoint of another deployment (which the run refuses) has no token here: its
        // figures against this deployment would mean nothing.
        let token = checkpoint::token_on(&checkpoint, self.connection.deployment().pin());
        self.know(Some(token.ok().flatten().cloned()));
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
            match &committed {
                Ok(_) => self.know(Some(Some(commit.next.clone()))),
                // Another writer moved the checkpoint: its token is no longer the one known.
                Err(Failure::Refused(CommitError::Conflict) | Failure::Unknown(_)) => {
                    self.know(None)
                }
                Err(Failure::Refused(_) | Failure::Failed(_)) => {}
            }
            committed.map_err(|failure| match failure {
                Failure::Refused(e) => e,
                Failure::Failed(e) | Failure::Unknown(e) => self.unavailable(&e),
            })
        };
        let committed = self.connection.bounded(retried);
        if committed.is_err() {
            // Interrupted in flight: the commit may or may not have happened.
            self.know(None);
        }
        committed.map_err(|_| CommitError::Unavailable(DEADLINE_IN_COMMIT.into()))?
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
            // Another run took it: the token read before may be moving.
            self.know(None);
            Err(CommitError::Conflict)
        }
    }

    fn release(
        &self,
        consumer: &str,
        owner: &str,
        at: bson::DateTime,
    ) -> std::result::Result<(), CommitError> {
        self.end_lease(consumer, owner, at, None)
    }

    fn release_recording(
        &self,
        consumer: &str,
        owner: &str,
        at: bson::DateTime,
        record: &handoff_domain::history::RunRecord,
    ) -> std::result::Result<(), CommitError> {
        self.end_lease(consumer, owner, at, Some(record))
    }

    fn renew(
        &self,
        consumer: &str,
        owner: &str,
        until: bson::DateTime,
    ) -> std::result::Result<(), CommitError> {
        let (filter, update) = MongoStore::lease_end(consumer, owner, until);
        let renew = self.checkpoints.update_one(filter, update);
        let renewed = self
            .connection
            .bounded_past_deadline(async { renew.await }, RELEASE_GRACE)
            .map_err(|_| CommitError::Unavailable("extending the lease took too long".into()))?
            .map_err(|e| self.unavailable(&e))?;
        // Another owner holds the lease now (it ran out and was taken over).
        if renewed.matched_count == 0 {
            return Err(CommitError::Conflict);
        }
        Ok(())
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
