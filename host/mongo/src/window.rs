//! Reading where a consumer stands: the deployment's cluster time and the oplog window.
//!
//! The window is read as MongoDB's own tools read it, from `local.oplog.rs` in natural order
//! (oldest first, then newest), which needs the right to read the `local` database
//! (`clusterMonitor`, or `read` on `local`); without it the window is unknown and the figures that
//! need it say so. A sharded cluster's window is its shards' (each shard's oplog, read on the
//! shard). Nothing here writes.

use std::time::Duration;

use bson::{Bson, Document, Timestamp, doc};
use mongodb::options::{DatabaseOptions, ReadConcern, ServerAddress};
use mongodb::{Client, Database};

use super::Connection;
use handoff_domain::Topology;
use handoff_domain::position::{Position, Window};

/// How long reading the figures may take: they describe a run, they never hold it up.
pub const READ_WAIT: Duration = Duration::from_secs(2);

/// The `local` database, read with local read concern (the oplog refuses majority reads).
fn local(client: &Client) -> Database {
    client.database_with_options(
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
///
/// A sharded cluster's `mongos` has no oplog: each shard's own is read (see [`shard_windows`]).
pub async fn oplog_window(connection: &Connection) -> (Option<Window>, Option<Timestamp>) {
    match connection.deployment().topology {
        Topology::ReplicaSet => read_window(connection, &connection.client).await,
        Topology::ShardedCluster => (shard_windows(connection).await, None),
    }
}

/// The window every shard of a cluster still covers, read from each shard's own oplog (the
/// shards `listShards` names, each as its own replica set, with the URI's user and options):
/// from the latest of the shards' oldest entries (history before it is lost on some shard, so
/// the smallest margin is taken) to the newest entry of any shard. Unknown unless every shard
/// answers: a window of some shards could be wrong.
pub async fn shard_windows(connection: &Connection) -> Option<Window> {
    let reply = connection
        .database("admin")
        .run_command(doc! { "listShards": 1 })
        .await;
    let shards = match reply {
        Ok(reply) => reply.get_array("shards").ok()?.clone(),
        Err(error) => {
            let error = connection.redact(&error.to_string());
            tracing::debug!(
                error = %handoff_domain::text::escape_untrusted(&error, 500),
                "the cluster's shards cannot be listed: the oplog window is unknown"
            );
            return None;
        }
    };
    let mut combined: Option<Window> = None;
    for shard in &shards {
        let host = shard.as_document()?.get_str("host").ok()?;
        let (set_name, hosts) = match host.split_once('/') {
            Some((set_name, hosts)) => (Some(set_name.to_string()), hosts),
            None => (None, host),
        };
        let mut options = connection.options.clone();
        options.hosts = hosts
            .split(',')
            .map(ServerAddress::parse)
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        options.repl_set_name = set_name;
        options.direct_connection = None;
        options.app_name = Some("handoff".into());
        options.max_pool_size = Some(1);
        let client = Client::with_options(options).ok()?;
        let window = read_window(connection, &client).await.0;
        client.shutdown().immediate(true).await;
        let window = window?;
        combined = Some(match combined {
            None => window,
            Some(c) => Window {
                oldest: later(c.oldest, window.oldest),
                newest: later(c.newest, window.newest),
            },
        });
    }
    combined
}

fn later(a: Timestamp, b: Timestamp) -> Timestamp {
    if (a.time, a.increment) >= (b.time, b.increment) {
        a
    } else {
        b
    }
}

/// The oplog window of the replica set `client` reaches, and the cluster time it gossiped.
async fn read_window(
    connection: &Connection,
    client: &Client,
) -> (Option<Window>, Option<Timestamp>) {
    let local = local(client);
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
