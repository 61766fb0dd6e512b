//! Server configuration.

use std::time::Duration;

use bson::oid::ObjectId;

/// How the server presents itself and its limits.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to bind.
    pub host: String,
    /// Port to bind; 0 picks an ephemeral one.
    pub port: u16,
    /// Answer as a standalone server (no replica set, no transactions, no change streams).
    pub standalone: bool,
    pub set_name: String,
    /// `settings.replicaSetId`; a new one per server when `None`.
    pub replica_set_id: Option<ObjectId>,
    /// How many change events the history retains (and `local.oplog.rs` shows).
    pub history_limit: usize,
    /// How long committed states stay readable with `readConcern: {level: "snapshot",
    /// atClusterTime}` (MongoDB's `minSnapshotHistoryWindowInSeconds`); zero keeps only the
    /// current state.
    pub snapshot_history: Duration,
    /// `host:port` to advertise in `hello`; `127.0.0.1:<port>` when `None`.
    pub advertised_host: Option<String>,
    /// Larger messages close the connection.
    pub max_message_bytes: usize,
    /// The wire version `hello` reports: 25 is MongoDB 8.0 (`bulkWrite`), 21 is 7.0.
    pub max_wire_version: i32,
    /// Open transactions older than this are aborted when they block other writes.
    pub transaction_lifetime: Duration,
    /// Answer as a `mongos` in front of this many shards (0: a replica set). Each shard keeps
    /// its own history of `history_limit` events and listens on its own port as the primary
    /// of a replica set named `shardN`.
    pub shards: usize,
    /// `config.version`'s `clusterId` (sharded mode); a new one per server when `None`.
    pub cluster_id: Option<ObjectId>,
    /// How often an idle shard writes a no-op to advance its applied time (MongoDB's
    /// `periodicNoopIntervalSecs`, 10 s by default).
    pub noop_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: "127.0.0.1".to_string(),
            port: 0,
            standalone: false,
            set_name: "rs0".to_string(),
            replica_set_id: None,
            history_limit: 100_000,
            snapshot_history: Duration::from_secs(300),
            advertised_host: None,
            max_message_bytes: 48_000_000,
            max_wire_version: 25,
            transaction_lifetime: Duration::from_secs(60),
            shards: 0,
            cluster_id: None,
            noop_interval: Duration::from_secs(10),
        }
    }
}
