//! In-memory, single-node MongoDB test server.
//!
//! It speaks the wire protocol (OP_MSG, and OP_QUERY for the legacy handshake) well enough for
//! the official drivers to treat it as a replica-set primary with sessions, snapshot-isolated
//! transactions, change streams (resume tokens, post-batch tokens, invalidation, bounded
//! history) and `failCommand` fault injection. With `Config { shards: K, .. }` it answers as
//! a `mongos` in front of K shards instead, each shard with its own history (see
//! [`cluster`] and the README's sharded-cluster section).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let server = mongo_sim::Server::start(mongo_sim::Config::default()).await?;
//! println!("{}", server.uri()); // mongodb://127.0.0.1:PORT/?replicaSet=rs0
//! server.shutdown().await;
//! # Ok(()) }
//! ```

pub mod cluster;
pub mod commands;
pub mod config;
pub mod cursor;
pub mod error;
pub mod expression;
pub mod failpoints;
pub mod lookup;
pub mod matcher;
pub mod namespace;
pub mod oplog;
pub mod paths;
pub mod projection;
pub mod server;
pub mod stages;
pub mod state;
pub mod storage;
pub mod update;
pub mod values;
pub mod wire;

pub use server::{Config, Server, ServerHandle, ShardHistory};
