//! Reading where a consumer stands: the deployment's cluster time and the oplog window.
//!
//! The window is read as MongoDB's own tools read it, from `local.oplog.rs` in natural order
//! (oldest first, then newest), which needs the right to read the `local` database
//! (`clusterMonitor`, or `read` on `local`); without it the window is unknown and the figures that
//! need it say so. Nothing here writes.

use std::time::Duration;

use bson::{Bson, Document, Timestamp, doc};
use mongodb::Database;
use mongodb::options::{DatabaseOptions, ReadConcern};

use super::Connection;
use handoff_domain::position::{Position, Window};

/// How long reading the figures may take: they describe a run, they never hold it up.
pub const READ_WAIT: Duration = Duration::from_secs(2);

/// The `local` database, read with local read concern (the oplog refuses majority reads).
fn local(connection: &Connection) -> Database {
    connection.client.database_with_options(
        "local",
        DatabaseOptions::builder()
            .selection_criteria(super::primary())
            .read_concern(ReadConcern::local())
            .build(),
    )
}

/// The oldest and newest entries' times, when the oplog can be read, and the cluster time the
/// server gossiped on its last reply. Read one after the other: on a run's single connection
/// they would wait for each other anyway, and a second connection costs more than a round trip.
pub async fn oplog_window(connection: &Connection) -> (Option<Window>, Option<Timestamp>) {
    let local = local(connection);
    let edge = |direction: i32| {
        let local = local.clone();
        async move {
            let reply = local
                .run_command(doc! {
                    "find": "oplog.rs",
                    "filter": {},
                    "sort": { "$natural": direction },
                    "limit": 1,
                    "projection": { "ts": 1 },
                    "singleBatch": true,
                })
                .await;
            match reply {
                Ok(reply) => Some(reply),
                Err(error) => {
                    let error = connection.redact(&error.to_string());
                    tracing::debug!(
                        error = %handoff_domain::text::escape_untrusted(&error, 500),
                        "the oplog window cannot be read"
                    );
                    None
                }
            }
        }
    };
    let Some(oldest) = edge(1).await else {
        return (None, None);
    };
    let newest = edge(-1).await;
    let gossiped = newest.as_ref().and_then(gossiped_cluster_time);
    let window = match (first_ts(&oldest), newest.as_ref().and_then(first_ts)) {
        (Some(oldest), Some(newest)) => Some(Window { oldest, newest }),
        _ => None,
    };
    (window, gossiped.or_else(|| gossiped_cluster_time(&oldest)))
}

/// The cluster time a reply carries (`$clusterTime`, which every replica-set member adds).
fn gossiped_cluster_time(reply: &Document) -> Option<Timestamp> {
    reply
        .get_document("$clusterTime")
        .ok()
        .and_then(|c| c.get_timestamp("clusterTime").ok())
}

fn first_ts(reply: &Document) -> Option<Timestamp> {
    let batch = reply
        .get_document("cursor")
        .ok()?
        .get_array("firstBatch")
        .ok()?;
    match batch.first()? {
        Bson::Document(entry) => entry.get_timestamp("ts").ok(),
        _ => None,
    }
}

/// The deployment's current cluster time: what `hello` gossips (`$clusterTime`), else the time of
/// its last write.
pub async fn cluster_time(connection: &Connection) -> Option<Timestamp> {
    let reply = connection
        .database("admin")
        .run_command(doc! { "hello": 1 })
        .await
        .ok()?;
    let gossiped = gossiped_cluster_time(&reply);
    let operation = reply.get_timestamp("operationTime").ok();
    let last_write = reply
        .get_document("lastWrite")
        .ok()
        .and_then(|w| w.get_document("opTime").ok())
        .and_then(|o| o.get_timestamp("ts").ok());
    gossiped.or(operation).or(last_write)
}

/// A consumer's checkpoint token, as stored (none: no checkpoint, or no token yet).
pub async fn checkpoint_token(
    connection: &Connection,
    database: &str,
    checkpoints: &str,
    consumer: &str,
) -> Option<Document> {
    let found = connection
        .database(database)
        .collection::<Document>(checkpoints)
        .find_one(doc! { "_id": consumer })
        .projection(doc! { "token": 1 })
        .await
        .ok()??;
    found.get_document("token").ok().cloned()
}

/// The figures of `token` against the deployment, within [`READ_WAIT`]: the oplog's window, and
/// the cluster time its replies carry (`hello` is asked only when they carry none, as when the
/// oplog cannot be read).
pub async fn position(connection: &Connection, token: Option<&Document>) -> Position {
    let read = async {
        let (window, gossiped) = oplog_window(connection).await;
        let now = match gossiped {
            Some(now) => Some(now),
            None => cluster_time(connection).await,
        };
        (now, window)
    };
    match tokio::time::timeout(READ_WAIT, read).await {
        Ok((now, window)) => Position::of(token, now, window),
        Err(_) => Position::of(token, None, None),
    }
}
