//! A delivery's reads and writes: its position, the admission of outbox records into its ledger,
//! the entries it works, their claims and settlements, a MongoDB projection's versioned writes,
//! and the audited changes of dead entries. Every write goes through the one transaction runner
//! ([`transaction::run`]); the vocabulary is [`handoff_domain::delivery`].

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bson::{Bson, DateTime, Document, doc};
use futures_util::TryStreamExt;
use mongodb::error::Error as DriverError;
use mongodb::options::{UpdateOneModel, WriteModel};
use mongodb::{ClientSession, Collection};

use super::Connection;
use super::errors::OperationError;
use super::events::Resume;
use super::store::no_bulk_write;
use super::transaction::{self, Decision, Failure};
use handoff_domain::checkpoint::Mode;
use handoff_domain::delivery::{
    Operation, Request, Status, entry_id, position_id, tombstone_id, version_number,
};
use handoff_domain::ledger::{Change, dead_change, settlement_change};
pub use handoff_domain::ledger::{DeadChange, Names, Settlement};

/// The delivery's ledger collection.
fn ledger_of(connection: &Connection, names: &Names) -> Collection<Document> {
    connection
        .database(&names.database)
        .collection::<Document>(&names.ledger)
}

/// The consumer's outbox collection.
fn outbox_of(connection: &Connection, names: &Names) -> Collection<Document> {
    connection
        .database(&names.database)
        .collection::<Document>(&names.outbox)
}

/// The filter of a delivery's entries.
fn entries_filter(names: &Names) -> Document {
    doc! { "delivery": &names.delivery, "consumer": &names.consumer }
}

/// A transaction that did not commit, told as the operator's commands tell it.
pub type Failed<E = Infallible> = Failure<E, OperationError>;

/// The statuses of open entries, as stored.
fn open_statuses() -> Bson {
    Bson::Array(
        [Status::Pending, Status::InProgress, Status::Failed]
            .into_iter()
            .map(|s| Bson::String(s.as_str().into()))
            .collect(),
    )
}

/// The indexes a delivery's reads use: its open entries by admission order, its dead lanes.
/// Creating an index that exists changes nothing.
pub async fn ensure_indexes(connection: &Connection, names: &Names) -> Result<(), OperationError> {
    let command = doc! {
        "createIndexes": &names.ledger,
        "indexes": [
            { "key": { "delivery": 1, "consumer": 1, "status": 1, "seq": 1 }, "name": "delivery_status_seq" },
        ],
        "writeConcern": { "w": "majority" },
    };
    connection
        .database(&names.database)
        .run_command(command)
        .await
        .map(|_| ())
        .map_err(connection.failed("creating the ledger's index"))
}

/// The delivery's position, created (token null, `seq` 0, pinned to `pin`) if missing, as
/// stored.
pub async fn ensure_position(
    connection: &Connection,
    names: &Names,
    pin: &str,
) -> Result<Document, OperationError> {
    let ledger = ledger_of(connection, names);
    let id = position_id(&names.delivery, &names.consumer);
    let now = DateTime::now();
    ledger
        .update_one(
            doc! { "_id": &id },
            doc! { "$setOnInsert": {
                "delivery": &names.delivery, "consumer": &names.consumer, "kind": "position",
                "sink": pin, "token": Bson::Null, "seq": 0_i64, "createdAt": now,
                "updatedAt": now,
            } },
        )
        .upsert(true)
        .await
        .map_err(connection.failed("creating the delivery's position"))?;
    ledger
        .find_one(doc! { "_id": &id })
        .await
        .map_err(connection.failed("reading the delivery's position"))?
        .ok_or_else(|| OperationError {
            what: "reading the delivery's position",
            command_code: None,
            code: None,
            message: "the position written was not found".into(),
            text: "the position written was not found".into(),
        })
}

/// The delivery's position as stored, if any.
pub async fn position(
    connection: &Connection,
    names: &Names,
) -> Result<Option<Document>, OperationError> {
    ledger_of(connection, names)
        .find_one(doc! { "_id": position_id(&names.delivery, &names.consumer) })
        .await
        .map_err(connection.failed("reading the delivery's position"))
}

/// The outbox stream a delivery admits records from: the consumer's records' inserts, in
/// commit order, each projected to what admission reads.
pub struct OutboxStream<'a> {
    events: super::events::Events<'a>,
}

impl<'a> OutboxStream<'a> {
    /// From `after` (a position's token) or from now, each read waiting at most `max_await`.
    pub async fn open(
        connection: &'a Connection,
        names: &Names,
        after: Option<&Document>,
        max_await: Duration,
    ) -> Result<OutboxStream<'a>, OperationError> {
        let pipeline = vec![
            doc! { "$match": { "operationType": "insert", "fullDocument.consumer": &names.consumer } },
            doc! { "$project": {
                "operationType": 1,
                "fullDocument._id": 1,
                "fullDocument.aggregateId": 1,
                "fullDocument.event.documentKey": 1,
            } },
        ];
        let from = match after {
            Some(token) => {
                Some(
                    Resume::of(token, Mode::ResumeAfter).ok_or_else(|| OperationError {
                        what: "opening the outbox stream",
                        command_code: None,
                        code: None,
                        message: "the delivery's position holds no usable token".into(),
                        text: "the delivery's position holds no usable token".into(),
                    })?,
                )
            }
            None => None,
        };
        let events = super::events::Events::of_collection(
            connection,
            &names.database,
            &names.outbox,
            pipeline,
            Some(max_await),
            from,
            "reading the outbox stream",
        )
        .await?;
        Ok(OutboxStream { events })
    }

    /// The next admitted record's projection (`{_id, aggregateId?, event: {documentKey}?}`), if
    /// one comes within the await bound.
    pub async fn next(&mut self) -> Result<Option<Document>, OperationError> {
        Ok(self.next_of_batch().await?.map(|(record, _)| record))
    }

    /// As [`OutboxStream::next`], and whether the batch the server sent holds more (the next
    /// read then needs no round trip). A batch is known to be over when the stream's token is no
    /// longer the record's event's own but the batch's post-batch token.
    pub async fn next_of_batch(&mut self) -> Result<Option<(Document, bool)>, OperationError> {
        loop {
            match self.events.next("reading the outbox stream").await? {
                None => return Ok(None),
                Some(event) => {
                    if let Ok(record) = event.get_document("fullDocument") {
                        let own = event.get("_id");
                        let more = own.is_some() && self.events.token().as_ref() == own;
                        return Ok(Some((record.clone(), more)));
                    }
                }
            }
        }
    }

    /// The post-batch token: every record before it was given by [`OutboxStream::next`].
    pub fn token(&self) -> Option<Document> {
        match self.events.token() {
            Some(Bson::Document(token)) => Some(token),
            _ => None,
        }
    }
}

/// The consumer's outbox records after `after` (by `_id`), at most `limit`, each projected to
/// what admission reads: a sweep of the whole outbox, for a delivery that starts or lost its
/// stream's history.
pub async fn outbox_page(
    connection: &Connection,
    names: &Names,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Document>, OperationError> {
    let mut filter = doc! { "consumer": &names.consumer };
    if let Some(after) = after {
        filter.insert("_id", doc! { "$gt": after });
    }
    outbox_of(connection, names)
        .find(filter)
        .sort(doc! { "_id": 1 })
        .projection(doc! {
            "_id": 1, "aggregateId": 1, "clusterTime": 1, "token": 1,
            "event._id": 1, "event.clusterTime": 1, "event.documentKey": 1,
        })
        .limit(limit)
        .await
        .map_err(connection.failed("reading the outbox"))?
        .try_collect()
        .await
        .map_err(connection.failed("reading the outbox"))
}

/// A record to admit: its `_id` and its lane.
#[derive(Clone, Debug)]
pub struct Admission {
    pub record: String,
    pub lane: String,
}

/// The position moved under an admission (another deliverer admitted first): nothing was
/// written.
#[derive(Debug, Clone, Copy)]
pub struct PositionMoved;

/// What an admission wrote.
#[derive(Debug, Clone, Copy, Default)]
pub struct Admitted {
    pub new: u64,
    pub present: u64,
}

/// One admission transaction: every record of `admissions` whose entry the ledger does not
/// hold gets one (status pending, the next `seq`s in this order), and the position moves to
/// `token` (when given) — if it is still at `expected` (the token this deliverer read).
pub async fn admit(
    connection: &Connection,
    names: &Names,
    admissions: &[Admission],
    expected: Option<&Document>,
    token: Option<&Document>,
) -> Result<Admitted, Failed<PositionMoved>> {
    let ledger = ledger_of(connection, names);
    let retries = std::sync::atomic::AtomicU32::new(0);
    let position = position_id(&names.delivery, &names.consumer);
    transaction::run(connection, &ledger, &retries, async |session| {
        let Some(stored) = ledger
            .find_one(doc! { "_id": &position })
            .session(&mut *session)
            .await?
        else {
            return Ok(Decision::Refuse(PositionMoved));
        };
        let stored_token = stored.get_document("token").ok();
        if stored_token != expected {
            return Ok(Decision::Refuse(PositionMoved));
        }
        let mut seq = match stored.get("seq") {
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Int32(n)) => i64::from(*n),
            _ => 0,
        };
        let ids: Vec<String> = admissions
            .iter()
            .map(|a| entry_id(&names.delivery, &a.record))
            .collect();
        let held = held_ids(session, &ledger, &ids).await?;
        let now = DateTime::now();
        let mut fresh = Vec::new();
        let mut seen = HashSet::new();
        for (admission, id) in admissions.iter().zip(&ids) {
            if held.contains(id) || !seen.insert(id.clone()) {
                continue;
            }
            fresh.push(doc! {
                "_id": id, "delivery": &names.delivery, "consumer": &names.consumer,
                "record": &admission.record, "seq": seq, "lane": &admission.lane,
                "status": Status::Pending.as_str(), "attempts": 0, "createdAt": now,
                "updatedAt": now,
            });
            seq += 1;
        }
        if !fresh.is_empty() {
            ledger
                .insert_many(&fresh)
                .ordered(true)
                .session(&mut *session)
                .await?;
        }
        let mut set = doc! { "seq": seq, "updatedAt": now };
        if let Some(token) = token {
            set.insert("token", token.clone());
        }
        ledger
            .update_one(doc! { "_id": &position }, doc! { "$set": set })
            .session(&mut *session)
            .await?;
        Ok(Decision::Commit(Admitted {
            new: fresh.len() as u64,
            present: (admissions.len() - fresh.len()) as u64,
        }))
    })
    .await
    .map_err(|failure| failure.described("admitting outbox records", connection))
}

/// The `_id`s of `ids` the collection holds, read in the transaction.
async fn held_ids(
    session: &mut ClientSession,
    collection: &Collection<Document>,
    ids: &[String],
) -> Result<HashSet<String>, DriverError> {
    let mut held = HashSet::new();
    if ids.is_empty() {
        return Ok(held);
    }
    let mut cursor = collection
        .find(doc! { "_id": { "$in": ids } })
        .projection(doc! { "_id": 1 })
        .session(&mut *session)
        .await?;
    while let Some(found) = cursor.next(&mut *session).await {
        if let Some(Bson::String(id)) = found?.get("_id") {
            held.insert(id.clone());
        }
    }
    Ok(held)
}

/// The delivery's open entries (pending, in progress, failed) in admission order, at most
/// `limit`.
pub async fn open_entries(
    connection: &Connection,
    names: &Names,
    limit: i64,
) -> Result<Vec<Document>, OperationError> {
    let mut filter = entries_filter(names);
    filter.insert("status", doc! { "$in": open_statuses() });
    ledger_of(connection, names)
        .find(filter)
        .sort(doc! { "seq": 1 })
        .limit(limit)
        .await
        .map_err(connection.failed("reading the ledger"))?
        .try_collect()
        .await
        .map_err(connection.failed("reading the ledger"))
}

/// The delivery's entries of `status` in admission order, at most `limit` (`after`: only those
/// of a greater `seq`).
pub async fn entries_of(
    connection: &Connection,
    names: &Names,
    status: Status,
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<Document>, OperationError> {
    let mut filter = entries_filter(names);
    filter.insert("status", status.as_str());
    if let Some(after) = after {
        filter.insert("seq", doc! { "$gt": after });
    }
    ledger_of(connection, names)
        .find(filter)
        .sort(doc! { "seq": 1 })
        .limit(limit)
        .await
        .map_err(connection.failed("reading the ledger"))?
        .try_collect()
        .await
        .map_err(connection.failed("reading the ledger"))
}

/// How many of the delivery's entries have `status`.
pub async fn count(
    connection: &Connection,
    names: &Names,
    status: Status,
) -> Result<u64, OperationError> {
    let mut filter = entries_filter(names);
    filter.insert("status", status.as_str());
    ledger_of(connection, names)
        .count_documents(filter)
        .await
        .map_err(connection.failed("counting the ledger's entries"))
}

/// The outbox records of `ids`, as stored.
pub async fn records(
    connection: &Connection,
    names: &Names,
    ids: &[&str],
) -> Result<Vec<Document>, OperationError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    outbox_of(connection, names)
        .find(doc! { "_id": { "$in": ids }, "consumer": &names.consumer })
        .await
        .map_err(connection.failed("reading outbox records"))?
        .try_collect()
        .await
        .map_err(connection.failed("reading outbox records"))
}

/// Claims `entries` for `owner` until `until` in one transaction: each that is still pending
/// or failed and due, or in progress under a lease that has ended, becomes in progress with one
/// attempt more (one statement for all). Returns the `_id`s claimed with their attempts before
/// this one.
pub async fn claim(
    connection: &Connection,
    names: &Names,
    entries: &[&str],
    owner: &str,
    until: DateTime,
) -> Result<Vec<(String, u32)>, Failed> {
    let ledger = ledger_of(connection, names);
    let retries = std::sync::atomic::AtomicU32::new(0);
    let ids = entries;
    transaction::run(connection, &ledger, &retries, async |session| {
        let now = DateTime::now();
        let filter = doc! {
            "_id": { "$in": &ids },
            "$and": [
                { "$or": [
                    { "status": { "$in": [Status::Pending.as_str(), Status::Failed.as_str()] } },
                    { "status": Status::InProgress.as_str(), "leaseUntil": { "$lte": now } },
                ] },
                { "$or": [
                    { "nextAttemptAt": { "$exists": false } },
                    { "nextAttemptAt": { "$lte": now } },
                ] },
            ],
        };
        let update = doc! {
            "$set": {
                "status": Status::InProgress.as_str(), "owner": owner, "leaseUntil": until,
                "updatedAt": now,
            },
            "$inc": { "attempts": 1 },
        };
        ledger
            .update_many(filter, update)
            .session(&mut *session)
            .await?;
        let mut claimed = Vec::new();
        let mut cursor = ledger
            .find(doc! {
                "_id": { "$in": &ids }, "status": Status::InProgress.as_str(), "owner": owner,
                "leaseUntil": until,
            })
            .projection(doc! { "_id": 1, "attempts": 1 })
            .session(&mut *session)
            .await?;
        while let Some(found) = cursor.next(&mut *session).await {
            let found = found?;
            let attempts = match found.get("attempts") {
                Some(Bson::Int32(n)) => u32::try_from(*n).ok(),
                Some(Bson::Int64(n)) => u32::try_from(*n).ok(),
                _ => None,
            };
            if let (Ok(id), Some(attempts)) = (found.get_str("_id"), attempts) {
                claimed.push((id.to_string(), attempts.saturating_sub(1)));
            }
        }
        Ok(Decision::<_, Infallible>::Commit(claimed))
    })
    .await
    .map_err(|failure| failure.described("claiming ledger entries", connection))
}

/// Whether settlements go to the server as one `bulkWrite` (8.0 and later; cleared the first
/// time the server has none).
static BULK_SETTLE: AtomicBool = AtomicBool::new(true);

/// Settles attempts in one transaction (one `bulkWrite` of their updates where the server has
/// it): each entry still claimed by `owner` (or, unclaimed,
/// still open at the attempts read) takes its new status. Returns how many were settled (an
/// entry whose lease another deliverer took over is not).
pub async fn settle(
    connection: &Connection,
    names: &Names,
    owner: &str,
    settlements: &[Settlement],
) -> Result<u64, Failed> {
    let ledger = ledger_of(connection, names);
    let retries = std::sync::atomic::AtomicU32::new(0);
    transaction::run(connection, &ledger, &retries, async |session| {
        let now = DateTime::now();
        let statements = settlements.iter().map(|settlement| {
            let (filter, inc) = match settlement.unclaimed_attempts {
                None => (
                    doc! { "_id": &settlement.entry, "status": Status::InProgress.as_str(), "owner": owner },
                    None,
                ),
                Some(attempts) => (
                    doc! {
                        "_id": &settlement.entry,
                        "status": { "$in": open_statuses() },
                        "attempts": i64::from(attempts),
                    },
                    Some(doc! { "attempts": 1 }),
                ),
            };
            (filter, settlement_update(settlement, now, inc))
        });
        if settlements.len() > 1 && BULK_SETTLE.load(Ordering::Relaxed) {
            let models: Vec<WriteModel> = statements
                .map(|(filter, update)| {
                    UpdateOneModel::builder()
                        .namespace(ledger.namespace())
                        .filter(filter)
                        .update(update)
                        .build()
                        .into()
                })
                .collect();
            return match connection
                .client
                .bulk_write(models)
                .ordered(true)
                .session(&mut *session)
                .await
            {
                Ok(result) => Ok(Decision::Commit(
                    u64::try_from(result.modified_count).unwrap_or(0),
                )),
                Err(error) if no_bulk_write(&error) => {
                    // Older than 8.0: separate updates from now on, this transaction again.
                    tracing::debug!("the server has no bulkWrite; settling with separate updates");
                    BULK_SETTLE.store(false, Ordering::Relaxed);
                    Ok(Decision::Again)
                }
                Err(error) => Err(error),
            };
        }
        let mut settled = 0;
        for (filter, update) in statements {
            let result = ledger
                .update_one(filter, update)
                .session(&mut *session)
                .await?;
            settled += result.modified_count;
        }
        Ok(Decision::<_, Infallible>::Commit(settled))
    })
    .await
    .map_err(|failure| failure.described("settling ledger entries", connection))
}

/// The update that gives an entry its settlement.
fn settlement_update(settlement: &Settlement, now: DateTime, inc: Option<Document>) -> Document {
    let mut update = update_of(&settlement_change(settlement, now));
    if let Some(inc) = inc {
        update.insert("$inc", inc);
    }
    update
}

/// A change of an entry as an update's `$set` and `$unset`.
fn update_of(change: &Change) -> Document {
    let unset: Document = change
        .unset
        .iter()
        .map(|key| (key.to_string(), Bson::from("")))
        .collect();
    doc! { "$set": change.set.clone(), "$unset": unset }
}

/// One projection write: the entry it settles, the attempts it had, and the request.
#[derive(Clone, Debug)]
pub struct Projected<'a> {
    pub entry: &'a str,
    pub attempts: u32,
    /// The target key's canonical text (the tombstone's name).
    pub key: &'a str,
    pub request: &'a Request,
}

/// What a projection write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projection {
    /// The document was written (or removed).
    Applied,
    /// The projection holds a newer version (or removed a newer one): left as it is.
    Superseded,
    /// The entry was settled already (another deliverer, a retried commit): nothing written.
    Settled,
}

impl Projection {
    pub fn as_str(self) -> &'static str {
        match self {
            Projection::Applied => "applied",
            Projection::Superseded => "superseded",
            Projection::Settled => "settled",
        }
    }
}

/// The projection document's version field.
pub const VERSION_FIELD: &str = "_handoffVersion";
/// The projection document's field naming the record that wrote it.
pub const RECORD_FIELD: &str = "_handoffRecord";

/// Projection writes and their entries' success in one transaction, in this order (exactly
/// once): for each entry still open at the attempts read, the projection's document of the
/// target key is written (upsert) or removed (delete) unless the projection, or its tombstone,
/// holds the same or a newer version; the entry becomes succeeded with what was done. A write
/// the server refuses fails the whole transaction: nothing is written. The entries, documents and
/// tombstones are read with one query each; each write is one statement.
pub async fn project(
    connection: &Connection,
    names: &Names,
    projection: (&str, &str),
    writes: &[Projected<'_>],
) -> Result<Vec<Projection>, Failed> {
    let ledger = ledger_of(connection, names);
    let target = connection
        .database(projection.0)
        .collection::<Document>(projection.1);
    let retries = std::sync::atomic::AtomicU32::new(0);
    transaction::run(connection, &ledger, &retries, async |session| {
        let now = DateTime::now();
        let ids: Vec<&str> = writes.iter().map(|w| w.entry).collect();
        let mut open = std::collections::HashMap::new();
        let mut cursor = ledger
            .find(doc! { "_id": { "$in": &ids }, "status": { "$in": open_statuses() } })
            .projection(doc! { "_id": 1, "attempts": 1 })
            .session(&mut *session)
            .await?;
        while let Some(found) = cursor.next(&mut *session).await {
            let found = found?;
            let attempts = match found.get("attempts") {
                Some(Bson::Int32(n)) => i64::from(*n),
                Some(Bson::Int64(n)) => *n,
                _ => continue,
            };
            if let Ok(id) = found.get_str("_id") {
                open.insert(id.to_string(), attempts);
            }
        }
        drop(cursor);
        let due: Vec<&Projected<'_>> = writes
            .iter()
            .filter(|w| open.get(w.entry) == Some(&i64::from(w.attempts)))
            .collect();
        let outcomes = apply_versioned(session, &ledger, &target, names, &due, now).await?;
        let mut by_outcome: [(Projection, Vec<&str>); 2] = [
            (Projection::Applied, Vec::new()),
            (Projection::Superseded, Vec::new()),
        ];
        for (write, outcome) in due.iter().zip(&outcomes) {
            for (kind, entries) in by_outcome.iter_mut() {
                if kind == outcome {
                    entries.push(write.entry);
                }
            }
        }
        for (kind, entries) in &by_outcome {
            if entries.is_empty() {
                continue;
            }
            let settlement = Settlement {
                entry: String::new(),
                status: Status::Succeeded,
                unclaimed_attempts: None,
                next_attempt: None,
                error_class: None,
                error: None,
                evidence: Some(doc! { "outcome": kind.as_str() }),
            };
            ledger
                .update_many(
                    doc! { "_id": { "$in": entries }, "status": { "$in": open_statuses() } },
                    settlement_update(&settlement, now, Some(doc! { "attempts": 1 })),
                )
                .session(&mut *session)
                .await?;
        }
        let mut outcomes = outcomes.into_iter();
        let done = writes
            .iter()
            .map(|w| {
                if open.get(w.entry) == Some(&i64::from(w.attempts)) {
                    outcomes.next().unwrap_or(Projection::Settled)
                } else {
                    Projection::Settled
                }
            })
            .collect();
        Ok(Decision::<_, Infallible>::Commit(done))
    })
    .await
    .map_err(|failure| failure.described("writing the projection", connection))
}

/// The versions a projection holds for `keys` (by `_id` value) and the delivery's tombstones
/// of them, by key text: the newest of each.
async fn versions(
    session: &mut ClientSession,
    ledger: &Collection<Document>,
    target: &Collection<Document>,
    names: &Names,
    writes: &[&Projected<'_>],
) -> Result<std::collections::HashMap<String, i64>, DriverError> {
    let mut newest: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    let mut keep = |key: String, version: i64| {
        let slot = newest.entry(key).or_insert(version);
        *slot = (*slot).max(version);
    };
    let targets: Vec<Bson> = writes.iter().map(|w| w.request.target.clone()).collect();
    let mut cursor = target
        .find(doc! { "_id": { "$in": &targets } })
        .projection(doc! { "_id": 1, VERSION_FIELD: 1 })
        .session(&mut *session)
        .await?;
    while let Some(found) = cursor.next(&mut *session).await {
        let found = found?;
        if let (Some(key), Ok(version)) = (found.get("_id"), found.get_i64(VERSION_FIELD)) {
            keep(
                handoff_domain::token::canonical_text(&doc! { "k": key.clone() }),
                version,
            );
        }
    }
    drop(cursor);
    let tombstones: Vec<String> = writes
        .iter()
        .map(|w| tombstone_id(&names.delivery, w.key))
        .collect();
    let mut cursor = ledger
        .find(doc! { "_id": { "$in": &tombstones } })
        .session(&mut *session)
        .await?;
    while let Some(found) = cursor.next(&mut *session).await {
        let found = found?;
        if let (Ok(key), Ok(version)) = (found.get_str("key"), found.get_i64("version")) {
            keep(key.to_string(), version);
        }
    }
    Ok(newest)
}

/// Versioned writes in the transaction, in order (a key written twice sees its first write).
async fn apply_versioned(
    session: &mut ClientSession,
    ledger: &Collection<Document>,
    target: &Collection<Document>,
    names: &Names,
    writes: &[&Projected<'_>],
    now: DateTime,
) -> Result<Vec<Projection>, DriverError> {
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    let mut newest = versions(session, ledger, target, names, writes).await?;
    let mut done = Vec::with_capacity(writes.len());
    for write in writes {
        let request = write.request;
        let version = request.version.map(version_number);
        if let (Some(version), Some(newest)) = (version, newest.get(write.key))
            && version <= *newest
        {
            done.push(Projection::Superseded);
            continue;
        }
        let key = doc! { "_id": request.target.clone() };
        match request.operation {
            Operation::Delete => {
                target.delete_one(key).session(&mut *session).await?;
                if let Some(version) = version {
                    ledger
                        .update_one(
                            doc! { "_id": tombstone_id(&names.delivery, write.key) },
                            doc! { "$set": {
                                "kind": "tombstone", "delivery": &names.delivery,
                                "consumer": &names.consumer, "key": write.key,
                                "version": version, "updatedAt": now,
                            } },
                        )
                        .upsert(true)
                        .session(&mut *session)
                        .await?;
                }
            }
            _ => {
                let mut document = request.body.clone();
                document.insert("_id", request.target.clone());
                match version {
                    Some(version) => document.insert(VERSION_FIELD, version),
                    None => document.remove(VERSION_FIELD),
                };
                document.insert(RECORD_FIELD, write.entry);
                target
                    .replace_one(key, document)
                    .upsert(true)
                    .session(&mut *session)
                    .await?;
            }
        }
        match version {
            Some(version) => {
                newest.insert(write.key.to_string(), version);
            }
            None => {
                newest.remove(write.key);
            }
        }
        done.push(Projection::Applied);
    }
    Ok(done)
}

/// Dead entries changed in one transaction with `audit` (the audit record, inserted once):
/// each entry still dead takes its new status (replayed: attempts 0, no next attempt, no lease),
/// its note appended to its `audit`. Returns the `_id`s of those changed.
pub async fn change_dead(
    connection: &Connection,
    names: &Names,
    changes: &[DeadChange<'_>],
    audit: &Document,
) -> Result<Vec<String>, Failed> {
    let ledger = ledger_of(connection, names);
    let audit_records = connection
        .database(&names.database)
        .collection::<Document>(&names.audit);
    let retries = std::sync::atomic::AtomicU32::new(0);
    transaction::run(connection, &ledger, &retries, async |session| {
        let now = DateTime::now();
        let mut changed = Vec::new();
        for change in changes {
            let mut update = update_of(&dead_change(change, now));
            update.insert("$push", doc! { "audit": change.note.clone() });
            let result = ledger
                .update_one(
                    doc! { "_id": change.entry, "status": Status::Dead.as_str() },
                    update,
                )
                .session(&mut *session)
                .await?;
            if result.modified_count == 1 {
                changed.push(change.entry.to_string());
            }
        }
        if !changed.is_empty() {
            audit_records
                .insert_one(audit)
                .session(&mut *session)
                .await?;
        }
        Ok(Decision::<_, Infallible>::Commit(changed))
    })
    .await
    .map_err(|failure| failure.described("changing dead entries", connection))
}

/// One correction of a projection: the target key's canonical text and the write that makes it
/// what the source holds now (an upsert of the document, or a delete).
#[derive(Clone, Debug)]
pub struct Correction<'a> {
    pub key: &'a str,
    pub request: &'a Request,
}

/// Corrections of a projection in one transaction with `audit` (inserted once), each guarded by
/// version as a delivery's writes are (one the projection holds a newer version of is left as
/// it is): `record` names the repair in the documents it writes. Returns what each did.
pub async fn correct(
    connection: &Connection,
    names: &Names,
    projection: (&str, &str),
    corrections: &[Correction<'_>],
    record: &str,
    audit: Option<&Document>,
) -> Result<Vec<Projection>, Failed> {
    let ledger = ledger_of(connection, names);
    let target = connection
        .database(projection.0)
        .collection::<Document>(projection.1);
    let audit_records = connection
        .database(&names.database)
        .collection::<Document>(&names.audit);
    let retries = std::sync::atomic::AtomicU32::new(0);
    transaction::run(connection, &ledger, &retries, async |session| {
        let now = DateTime::now();
        if let Some(audit) = audit {
            let held = audit_records
                .find_one(doc! { "_id": audit.get("_id").cloned().unwrap_or(Bson::Null) })
                .session(&mut *session)
                .await?;
            if held.is_none() {
                audit_records
                    .insert_one(audit)
                    .session(&mut *session)
                    .await?;
            }
        }
        let writes: Vec<Projected<'_>> = corrections
            .iter()
            .map(|correction| Projected {
                entry: record,
                attempts: 0,
                key: correction.key,
                request: correction.request,
            })
            .collect();
        let writes: Vec<&Projected<'_>> = writes.iter().collect();
        let done = apply_versioned(session, &ledger, &target, names, &writes, now).await?;
        Ok(Decision::<_, Infallible>::Commit(done))
    })
    .await
    .map_err(|failure| failure.described("correcting the projection", connection))
}

/// The positions of every delivery of `names.consumer` (at most `limit`), as stored.
pub async fn positions(
    connection: &Connection,
    names: &Names,
    limit: i64,
) -> Result<Vec<Document>, OperationError> {
    ledger_of(connection, names)
        .find(doc! { "kind": "position", "consumer": &names.consumer })
        .sort(doc! { "delivery": 1 })
        .limit(limit)
        .await
        .map_err(connection.failed("reading the deliveries"))?
        .try_collect()
        .await
        .map_err(connection.failed("reading the deliveries"))
}

/// Which of `lanes` hold a dead entry of the delivery.
pub async fn dead_lanes(
    connection: &Connection,
    names: &Names,
    lanes: &[&str],
) -> Result<HashSet<String>, OperationError> {
    if lanes.is_empty() {
        return Ok(HashSet::new());
    }
    let mut filter = entries_filter(names);
    filter.insert("status", Status::Dead.as_str());
    filter.insert("lane", doc! { "$in": lanes });
    let found: Vec<Document> = ledger_of(connection, names)
        .find(filter)
        .projection(doc! { "lane": 1 })
        .await
        .map_err(connection.failed("reading the ledger's dead lanes"))?
        .try_collect()
        .await
        .map_err(connection.failed("reading the ledger's dead lanes"))?;
    Ok(found
        .iter()
        .filter_map(|d| d.get_str("lane").ok().map(str::to_string))
        .collect())
}
