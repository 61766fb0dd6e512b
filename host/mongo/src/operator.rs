//! What the operator's commands read and write besides a backfill's or a reconcile's own work:
//! a consumer's checkpoint or backfill state as stored, a collection's documents and size, the outbox figures of
//! `status`, the position a stream opens at and the checkpoint's audited compare-and-set of
//! `checkpoint reset`. Every failure is an [`OperationError`] saying what was being done.

use std::time::Duration;

use bson::{Document, Timestamp, doc};
use futures_util::TryStreamExt;
use mongodb::error::{Error as DriverError, ErrorKind};

use super::Connection;
use super::errors::{OperationError, duplicate_key};
use super::transaction::{self, Decision, Failure};

/// A consumer's document in one of its state collections (its checkpoint, its backfill state)
/// as stored: `None` when there is none (a checkpoint's consumer never ran); `what` names the
/// reading in its failure.
pub async fn consumer_document(
    connection: &Connection,
    database: &str,
    collection: &str,
    consumer: &str,
    what: &'static str,
) -> Result<Option<Document>, OperationError> {
    connection
        .database(database)
        .collection::<Document>(collection)
        .find_one(doc! { "_id": consumer })
        .await
        .map_err(connection.failed(what))
}

/// The consumers a state collection holds (their `_id`s, at most `limit`): what a refusal of an
/// unknown consumer compares its name with.
pub async fn consumer_ids(
    connection: &Connection,
    database: &str,
    collection: &str,
    limit: i64,
) -> Result<Vec<String>, OperationError> {
    use futures_util::TryStreamExt;
    let documents: Vec<Document> = connection
        .database(database)
        .collection::<Document>(collection)
        .find(doc! {})
        .projection(doc! { "_id": 1 })
        .limit(limit)
        .await
        .map_err(connection.failed("the consumers"))?
        .try_collect()
        .await
        .map_err(connection.failed("the consumers"))?;
    Ok(documents
        .iter()
        .filter_map(|d| d.get_str("_id").ok().map(str::to_string))
        .collect())
}

/// A consumer's most recent run records (at most `limit`, newest first as read), as stored.
pub async fn run_history(
    connection: &Connection,
    database: &str,
    runs: &str,
    consumer: &str,
    limit: i64,
) -> Result<Vec<Document>, OperationError> {
    connection
        .database(database)
        .collection::<Document>(runs)
        .find(doc! { "consumer": consumer })
        .sort(doc! { "endedAt": -1 })
        // Only what a record is read for: a large document planted there is not fetched whole.
        .projection(doc! {
            "consumer": 1, "source": 1, "run": 1, "moves": 1, "startedAt": 1, "endedAt": 1, "status": 1,
            "errorClass": 1, "exitCode": 1, "events": 1, "follow": 1, "checkpointTime": 1,
            "clusterTime": 1, "oplogOldest": 1, "oplogNewest": 1, "figuresAt": 1,
        })
        .limit(limit)
        .await
        .map_err(connection.failed("the run history"))?
        .try_collect()
        .await
        .map_err(connection.failed("the run history"))
}

/// Every checkpoint of a collection (at most `limit`), as stored: the consumers `status --all`
/// lists.
pub async fn checkpoints(
    connection: &Connection,
    database: &str,
    collection: &str,
    limit: i64,
) -> Result<Vec<Document>, OperationError> {
    connection
        .database(database)
        .collection::<Document>(collection)
        .find(doc! {})
        .limit(limit)
        .await
        .map_err(connection.failed("the checkpoints"))?
        .try_collect()
        .await
        .map_err(connection.failed("the checkpoints"))
}

/// The names of the deployment's databases the user may see (`None` when it may not list them).
pub async fn database_names(connection: &Connection) -> Option<Vec<String>> {
    connection
        .client
        .list_database_names()
        .authorized_databases(true)
        .await
        .ok()
}

/// The server's estimate of how many documents `collection` holds (its metadata, no scan).
pub async fn estimated_count(
    connection: &Connection,
    database: &str,
    collection: &str,
    what: &'static str,
) -> Result<u64, OperationError> {
    connection
        .database(database)
        .collection::<Document>(collection)
        .estimated_document_count()
        .await
        .map_err(connection.failed(what))
}

/// The first documents of a collection in `_id` order.
#[derive(Debug, Clone, Copy)]
pub struct First {
    /// How many at most.
    pub limit: u32,
    /// How many a reply holds, when not the server's default.
    pub batch: Option<u32>,
}

/// The documents of `collection` that `filter` matches, all of them or the [`First`].
pub async fn documents(
    connection: &Connection,
    database: &str,
    collection: &str,
    filter: Document,
    first: Option<First>,
    what: &'static str,
) -> Result<Vec<Document>, OperationError> {
    let failed = connection.failed(what);
    let source = connection
        .database(database)
        .collection::<Document>(collection);
    let find = source.find(filter);
    let find = match first {
        None => find,
        Some(First { limit, batch }) => {
            let find = find.sort(doc! { "_id": 1 }).limit(i64::from(limit));
            match batch {
                Some(batch) => find.batch_size(batch),
                None => find,
            }
        }
    };
    find.await
        .map_err(failed)?
        .try_collect()
        .await
        .map_err(failed)
}

/// A consumer's outbox records of change events, as stored, in the order they were committed
/// (the stream's): the `limit` most recent, or with `since` the first `limit` from that cluster
/// time on. Records of snapshot runs (`snapshot`) and invalidation markers (`marker`) are left
/// out. Reads only.
pub async fn outbox_events(
    connection: &Connection,
    database: &str,
    outbox: &str,
    consumer: &str,
    since: Option<Timestamp>,
    limit: u32,
) -> Result<Vec<Document>, OperationError> {
    let failed = connection.failed("the outbox records");
    let mut filter = doc! {
        "consumer": consumer,
        "snapshot": { "$exists": false },
        "marker": { "$exists": false },
    };
    // A shaped record holds its cluster time at its top level, a raw one in its event.
    if let Some(since) = since {
        filter.insert(
            "$or",
            vec![
                doc! { "event.clusterTime": { "$gte": since } },
                doc! { "clusterTime": { "$gte": since } },
            ],
        );
    }
    let order = if since.is_some() { 1 } else { -1 };
    let mut records: Vec<Document> = connection
        .database(database)
        .collection::<Document>(outbox)
        .find(filter)
        .sort(doc! { "$natural": order })
        .limit(i64::from(limit))
        .await
        .map_err(failed)?
        .try_collect()
        .await
        .map_err(failed)?;
    if since.is_none() {
        records.reverse();
    }
    Ok(records)
}

/// Whether the server gave up an operation at its time limit (`MaxTimeMSExpired`, 50).
fn time_limit(error: &DriverError) -> bool {
    matches!(error.kind.as_ref(), ErrorKind::Command(c) if c.code == 50)
}

/// A consumer's outbox figures: how many records it has in `outbox`, and the cluster time of
/// the one inserted last (natural order). Each is `None` when reading it takes longer than
/// `wait` (the server gives up); the time is `None` too when there is no record, or it has none.
pub async fn outbox_figures(
    connection: &Connection,
    database: &str,
    outbox: &str,
    consumer: &str,
    wait: Duration,
    what: &'static str,
) -> Result<(Option<u64>, Option<Timestamp>), OperationError> {
    let outbox = connection.database(database).collection::<Document>(outbox);
    let failed = connection.failed(what);
    let counted = outbox
        .count_documents(doc! { "consumer": consumer })
        .max_time(wait)
        .await;
    let records = match counted {
        Ok(n) => Some(n),
        Err(e) if time_limit(&e) => None,
        Err(e) => return Err(failed(e)),
    };
    let last = outbox
        .find_one(doc! { "consumer": consumer })
        .sort(doc! { "$natural": -1 })
        .projection(doc! { "event.clusterTime": 1 })
        .max_time(wait)
        .await;
    let last = match last {
        Ok(last) => last,
        Err(e) if time_limit(&e) => None,
        Err(e) => return Err(failed(e)),
    };
    let last_time = last
        .as_ref()
        .and_then(|r| r.get_document("event").ok())
        .and_then(|e| e.get_timestamp("clusterTime").ok());
    Ok((records, last_time))
}

/// The `postBatchResumeToken` a change stream of `collection` reports before its first event:
/// opened now, or just before `at` (`startAtOperationTime`). The stream's cursor is closed
/// again; `None` when the server gave no token.
pub async fn opening_token(
    connection: &Connection,
    database: &str,
    collection: &str,
    at: Option<Timestamp>,
    what: &'static str,
) -> Result<Option<Document>, OperationError> {
    let stage = match at {
        None => doc! {},
        Some(t) => doc! { "startAtOperationTime": t },
    };
    let db = connection.database(database);
    let reply = db
        .run_command(doc! {
            "aggregate": collection,
            "pipeline": [{ "$changeStream": stage }],
            "cursor": { "batchSize": 0 },
        })
        .await
        .map_err(connection.failed(what))?;
    let cursor = reply.get_document("cursor").ok();
    if let Some(id) = cursor
        .and_then(|c| c.get_i64("id").ok())
        .filter(|id| *id != 0)
    {
        let _ = db
            .run_command(doc! { "killCursors": collection, "cursors": [id] })
            .await;
    }
    Ok(cursor
        .and_then(|c| c.get_document("postBatchResumeToken").ok())
        .cloned())
}

/// A compare-and-set of a consumer's checkpoint with its audit record.
pub struct CheckpointMove<'a> {
    pub database: &'a str,
    pub checkpoints: &'a str,
    /// The audit collection.
    pub audit: &'a str,
    /// Matches the checkpoint as it was read, and no other.
    pub filter: Document,
    pub update: Document,
    /// The audit record.
    pub record: &'a Document,
}

/// Applies `change` in one transaction through the transaction runner: the checkpoint updated
/// and the audit record inserted. Refused, writing nothing, when the filter matches no
/// checkpoint or the audit record is stored already (a commit that went through unseen: the
/// checkpoint moved since). A failure's `what` is `the reset was not written`.
pub async fn move_checkpoint(
    connection: &Connection,
    change: &CheckpointMove<'_>,
) -> Result<(), Failure<(), OperationError>> {
    let db = connection.database(change.database);
    let checkpoints = db.collection::<Document>(change.checkpoints);
    let audit = db.collection::<Document>(change.audit);
    let retries = std::sync::atomic::AtomicU32::new(0);
    transaction::run(connection, &checkpoints, &retries, async |session| {
        let updated = checkpoints
            .update_one(change.filter.clone(), change.update.clone())
            .session(&mut *session)
            .await?;
        if updated.matched_count != 1 {
            return Ok(Decision::Refuse(()));
        }
        match audit.insert_one(change.record).session(&mut *session).await {
            Ok(_) => Ok(Decision::Commit(())),
            Err(error) if duplicate_key(&error) => Ok(Decision::Refuse(())),
            Err(error) => Err(error),
        }
    })
    .await
    .map_err(|failure| failure.described("the reset was not written", connection))
}
