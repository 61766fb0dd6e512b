//! `mongo-sim`: run the in-memory MongoDB test server.

use std::io::Write;

use anyhow::Context;
use bson::oid::ObjectId;
use clap::Parser;
use mongo_sim::{Config, Server};

#[derive(Debug, Parser)]
#[command(
    name = "mongo-sim",
    about = "In-memory single-node MongoDB replica-set test server"
)]
struct Args {
    /// Port to listen on; 0 picks an ephemeral port.
    #[arg(long, default_value_t = 27017)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Replica-set name reported by `hello`.
    #[arg(long, default_value = "rs0")]
    set_name: String,
    /// `settings.replicaSetId` as 24 hex digits (random when omitted).
    #[arg(long)]
    replica_set_id: Option<String>,
    /// How many change events the history retains (and `local.oplog.rs` shows).
    #[arg(long, default_value_t = 100_000)]
    history_limit: usize,
    /// Seconds of committed states kept for snapshot reads at an earlier cluster time
    /// (`readConcern: {level: "snapshot", atClusterTime}`); 0 keeps only the current state.
    #[arg(long, default_value_t = 300)]
    snapshot_history_seconds: u64,
    /// Answer as a standalone server instead of a replica-set primary.
    #[arg(long)]
    standalone: bool,
    /// `host:port` to advertise in `hello` (default `127.0.0.1:<port>`).
    #[arg(long)]
    advertise: Option<String>,
    /// Largest accepted message in bytes.
    #[arg(long, default_value_t = 48_000_000)]
    max_message_bytes: usize,
    /// The wire version `hello` reports: 25 answers as MongoDB 8.0 (with `bulkWrite`), 21 as 7.0,
    /// 17 as 6.0.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(i32).range(17..=25))]
    max_wire_version: i32,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let replica_set_id = args
        .replica_set_id
        .as_deref()
        .map(ObjectId::parse_str)
        .transpose()
        .context("--replica-set-id must be 24 hex digits")?;
    let config = Config {
        host: args.host,
        port: args.port,
        standalone: args.standalone,
        set_name: args.set_name,
        replica_set_id,
        history_limit: args.history_limit,
        snapshot_history: std::time::Duration::from_secs(args.snapshot_history_seconds),
        advertised_host: args.advertise,
        max_message_bytes: args.max_message_bytes,
        max_wire_version: args.max_wire_version,
        ..Config::default()
    };
    let server = Server::start(config).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {}", server.addr())?;
        out.flush()?;
    }
    tokio::signal::ctrl_c().await.ok();
    server.shutdown().await;
    Ok(())
}
