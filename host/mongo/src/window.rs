//! Reading where a consumer stands: the deployment's cluster time and the oplog window.
//!
//! The window is read as MongoDB's own tools read it, from `local.oplog.rs` in natural order
//! (oldest first, then newest), which needs the right to read the `local` database
//! (`clusterMonitor`, or `read` on `local`); without it the window is unknown and the figures that
//! need it say so. A sharded cluster's window is its shards' (each shard's oplog, read on the
//! shard, when `--shard-oplogs` allows it). Nothing here writes.

use std::time::Duration;

use bson::{Bson, Document, Timestamp, doc};
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::join_all;
use mongodb::options::{ClientOptions, DatabaseOptions, ReadConcern, ServerAddress, Tls};
use mongodb::{Client, Database};

use super::Connection;
use handoff_domain::Topology;
use handoff_domain::checkpoint;
use handoff_domain::position::{Position, Window};

/// How long reading one of the figures may take (the oplog's window, the cluster time, a
/// checkpoint's token): they describe a run, they never hold it up.
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

/// Whether a sharded cluster's window is read from its shards' own oplogs (off by default: it
/// connects to every host the cluster's `listShards` names, with the URI's user and options).
static SHARD_OPLOGS: AtomicBool = AtomicBool::new(false);

/// Lets the shards' oplogs be read (`--shard-oplogs`): the process trusts the hosts the cluster's
/// `listShards` names with the URI's credentials.
pub fn read_shard_oplogs(enabled: bool) {
    SHARD_OPLOGS.store(enabled, Ordering::Relaxed);
}

/// The oldest and newest entries' times, when the oplog can be read, and the cluster time the
/// server gossiped on its last reply. Read one after the other: on a run's single connection
/// they would wait for each other anyway, and a second connection costs more than a round trip.
/// At most [`READ_WAIT`]: a window that takes longer is unknown.
///
/// A sharded cluster's `mongos` has no oplog: each shard's own is read when allowed (see
/// [`shard_windows`]), else the window is unknown.
pub async fn oplog_window(connection: &Connection) -> (Option<Window>, Option<Timestamp>) {
    let read = async {
        match connection.deployment().topology {
            Topology::ReplicaSet => read_window(connection, &connection.client).await,
            Topology::ShardedCluster if SHARD_OPLOGS.load(Ordering::Relaxed) => {
                (shard_windows(connection).await, None)
            }
            Topology::ShardedCluster => (None, None),
        }
    };
    tokio::time::timeout(READ_WAIT, read)
        .await
        .unwrap_or((None, None))
}

/// Says, without values, why a cluster's window is unknown.
fn unknown(why: &str) -> Option<Window> {
    tracing::debug!(why, "the sharded cluster's oplog window is unknown");
    None
}

/// Says why `--shard-oplogs` reads no shard, as a warning: the user asked for it.
fn not_read(why: &str) -> Option<Window> {
    tracing::warn!(
        why,
        "--shard-oplogs: the shards' oplogs are not read, the oplog window is unknown"
    );
    None
}

/// Whether the URI's user and options may be taken to the hosts a cluster's metadata names: the
/// credentials go only where certificates prove the hosts' names, never in the clear and never
/// where any certificate is accepted. A URI without credentials may go anywhere its options do.
fn may_connect_to_shards(options: &ClientOptions) -> Result<(), &'static str> {
    match &options.tls {
        Some(Tls::Enabled(tls)) if tls.allow_invalid_certificates == Some(true) => {
            Err("the URI accepts invalid certificates")
        }
        Some(Tls::Enabled(_)) => Ok(()),
        _ if options.credential.is_some() => Err("the URI sends its credentials without TLS"),
        _ => Ok(()),
    }
}

/// A `listShards` host (`SET/HOST:PORT,HOST:PORT`, or `HOST:PORT` for a shard without a replica
/// set name): the set's name and its hosts, each a TCP address (a local socket is not a shard
/// another machine's metadata may send credentials to).
fn shard_hosts(host: &str) -> Result<(Option<String>, Vec<ServerAddress>), &'static str> {
    let (set_name, hosts) = match host.split_once('/') {
        Some((set_name, hosts)) => (Some(set_name.to_string()), hosts),
        None => (None, host),
    };
    if set_name.as_deref() == Some("") {
        return Err("a shard's replica set has no name");
    }
    let hosts = hosts
        .split(',')
        .map(ServerAddress::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "a shard's host cannot be read")?;
    if !hosts
        .iter()
        .all(|address| matches!(address, ServerAddress::Tcp { .. }))
    {
        return Err("a shard's host is not a TCP address");
    }
    Ok((set_name, hosts))
}

/// The window every shard of a cluster still covers, read from each shard's own oplog (the
/// shards `listShards` names, each as its own replica set, with the URI's user and options), all
/// at once: from the latest of the shards' oldest entries (history before it is lost on some
/// shard, so the smallest margin is taken) to the newest entry of any shard. Unknown unless every
/// shard answers: a window of some shards could be wrong.
pub async fn shard_windows(connection: &Connection) -> Option<Window> {
    if let Err(why) = may_connect_to_shards(&connection.options) {
        return not_read(why);
    }
    let reply = connection
        .database("admin")
        .run_command(doc! { "listShards": 1 })
        .await;
    let shards = match reply {
        Ok(reply) => match reply.get_array("shards") {
            Ok(shards) => shards.clone(),
            Err(_) => return unknown("listShards gave no shards"),
        },
        Err(error) => {
            let error = connection.redact(&error.to_string());
            tracing::debug!(
                error = %handoff_domain::text::escape_untrusted(&error, 500),
                "the cluster's shards cannot be listed: the oplog window is unknown"
            );
            return None;
        }
    };
    let mut sets = std::collections::BTreeSet::new();
    let mut clients = Vec::with_capacity(shards.len());
    for shard in &shards {
        let Some(host) = shard.as_document().and_then(|s| s.get_str("host").ok()) else {
            return unknown("a shard without a host");
        };
        let (set_name, hosts) = match shard_hosts(host) {
            Ok(shard) => shard,
            Err(why) => return not_read(why),
        };
        // Each shard once: two entries of one replica set would leave another shard unread.
        if !sets.insert(set_name.clone().unwrap_or_else(|| host.to_string())) {
            return unknown("listShards names a shard twice");
        }
        let mut options = connection.options.clone();
        options.hosts = hosts;
        options.repl_set_name = set_name;
        options.direct_connection = None;
        options.load_balanced = None;
        options.srv_max_hosts = None;
        options.min_pool_size = None;
        options.max_pool_size = Some(1);
        match Client::with_options(options) {
            Ok(client) => clients.push(client),
            Err(_) => return unknown("a shard's client cannot be made"),
        }
    }
    if clients.is_empty() {
        return unknown("listShards named no shard");
    }
    let windows = join_all(clients.iter().map(|client| read_window(connection, client))).await;
    for client in clients {
        client.shutdown().immediate(true).await;
    }
    let mut combined: Option<Window> = None;
    for (window, _) in windows {
        let Some(window) = window else {
            return unknown("a shard's oplog cannot be read");
        };
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

/// A consumer's checkpoint token, as stored (none: no checkpoint, no token yet, or a checkpoint
/// of another deployment, whose token has no figures here), within [`READ_WAIT`].
pub async fn checkpoint_token(
    connection: &Connection,
    database: &str,
    checkpoints: &str,
    consumer: &str,
) -> Option<Document> {
    let collection = connection
        .database(database)
        .collection::<Document>(checkpoints);
    let read = collection
        .find_one(doc! { "_id": consumer })
        .projection(doc! { "token": 1, "replicaSetId": 1, "clusterId": 1 });
    let found = tokio::time::timeout(READ_WAIT, read).await.ok()?.ok()??;
    checkpoint::token_on(&found, connection.deployment().pin())
        .ok()?
        .cloned()
}

/// The deployment's oplog window and cluster time, each within [`READ_WAIT`] (`hello` is asked
/// for the time only when the oplog's replies carry none, as when the oplog cannot be read): a
/// window that cannot be read leaves the cluster time known.
pub async fn figures(connection: &Connection) -> (Option<Window>, Option<Timestamp>) {
    let now = async {
        tokio::time::timeout(READ_WAIT, cluster_time(connection))
            .await
            .ok()
            .flatten()
    };
    match connection.deployment().topology {
        // The shards' windows carry no cluster time of the mongos: both are asked at once, so
        // that a shard that does not answer delays neither beyond the one bound.
        Topology::ShardedCluster => {
            // `hello` first: on a run's single connection it goes out before `listShards`.
            let (now, (window, _)) = tokio::join!(now, oplog_window(connection));
            (window, now)
        }
        Topology::ReplicaSet => match oplog_window(connection).await {
            (window, Some(gossiped)) => (window, Some(gossiped)),
            (window, None) => (window, now.await),
        },
    }
}

/// The figures of `token` against the deployment (see [`figures`]).
pub async fn position(connection: &Connection, token: Option<&Document>) -> Position {
    let (window, now) = figures(connection).await;
    Position::of(token, now, window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::options::{Credential, TlsOptions};

    fn options(credential: bool, tls: Option<Tls>) -> ClientOptions {
        let mut options = ClientOptions::default();
        if credential {
            options.credential = Some(Credential::builder().username("u".to_string()).build());
        }
        options.tls = tls;
        options
    }

    fn tls(allow_invalid: Option<bool>) -> Option<Tls> {
        let mut tls = TlsOptions::default();
        tls.allow_invalid_certificates = allow_invalid;
        Some(Tls::Enabled(tls))
    }

    #[test]
    fn credentials_go_to_the_shards_only_over_tls_that_checks_certificates() {
        assert_eq!(
            may_connect_to_shards(&options(true, tls(Some(true)))),
            Err("the URI accepts invalid certificates")
        );
        assert_eq!(
            may_connect_to_shards(&options(false, tls(Some(true)))),
            Err("the URI accepts invalid certificates")
        );
        assert_eq!(
            may_connect_to_shards(&options(true, None)),
            Err("the URI sends its credentials without TLS")
        );
        assert_eq!(
            may_connect_to_shards(&options(true, Some(Tls::Disabled))),
            Err("the URI sends its credentials without TLS")
        );
        assert_eq!(may_connect_to_shards(&options(true, tls(None))), Ok(()));
        assert_eq!(
            may_connect_to_shards(&options(true, tls(Some(false)))),
            Ok(())
        );
        assert_eq!(may_connect_to_shards(&options(false, None)), Ok(()));
    }

    #[test]
    fn a_shard_host_is_a_named_set_of_tcp_addresses() {
        let (set, hosts) = shard_hosts("shard0/a:27018,b:27018").expect("a shard");
        assert_eq!(set.as_deref(), Some("shard0"));
        assert_eq!(hosts.len(), 2);
        let (set, hosts) = shard_hosts("c:27018").expect("a shard without a set name");
        assert_eq!((set, hosts.len()), (None, 1));
        for bad in [
            "shard0/",
            "",
            "/a:1",
            "shard0/a:1,",
            "shard0/a:port",
            "s/a:1:2",
        ] {
            assert!(shard_hosts(bad).is_err(), "{bad:?}");
        }
        // A local socket named by the cluster's metadata would get the URI's credentials in
        // the clear, whatever the TLS options say.
        assert_eq!(
            shard_hosts("shard0//tmp/mongodb-27018.sock"),
            Err("a shard's host is not a TCP address")
        );
        assert_eq!(
            shard_hosts("shard0/a:1,/tmp/x.sock"),
            Err("a shard's host is not a TCP address")
        );
    }
}
