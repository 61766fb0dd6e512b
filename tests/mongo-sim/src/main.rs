//! `mongo-sim`: run the in-memory MongoDB test server, or send one command to a running one.

use std::io::Write;

use anyhow::Context;
use bson::oid::ObjectId;
use clap::{Parser, Subcommand};
use mongo_sim::{Config, Server};

#[derive(Debug, Parser)]
#[command(
    name = "mongo-sim",
    about = "In-memory single-node MongoDB replica-set test server",
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    client: Option<Client>,
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
    /// Answer as a `mongos` in front of this many shards (0: a replica set). Each shard keeps
    /// its own history (`--history-limit` each) and listens on its own port.
    #[arg(long, default_value_t = 0, conflicts_with = "standalone", value_parser = clap::value_parser!(u16).range(0..=64))]
    shards: u16,
    /// How often an idle shard writes a no-op advancing its applied time, in milliseconds
    /// (MongoDB's `periodicNoopIntervalSecs`).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    noop_interval_ms: u64,
    /// `config.version`'s `clusterId` as 24 hex digits (random when omitted; sharded mode).
    #[arg(long)]
    cluster_id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Client {
    /// Send one command to a running test server and print its reply (relaxed Extended JSON).
    ///
    /// Waits up to 5 s for the server to answer (one started a moment ago).
    ///
    /// Example: mongo-sim command --port 27018 change_demo '{"insert": "orders", "documents": [{"_id": 1}]}'
    Command {
        /// Port of the running server.
        #[arg(long, default_value_t = 27017)]
        port: u16,
        /// Address of the running server.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// The database the command runs on.
        database: String,
        /// The command, a document in Extended JSON.
        command: String,
    },
}

/// Sends `command` on `database` to the server at `host:port` as one OP_MSG and prints the reply;
/// fails when the reply's `ok` is not 1.
fn send_command(host: &str, port: u16, database: &str, command: &str) -> anyhow::Result<()> {
    use std::io::Read;
    let json: serde_json::Value =
        serde_json::from_str(command).context("the command must be a JSON document")?;
    let mut body = match bson::Bson::try_from(json).context("the command must be Extended JSON")? {
        bson::Bson::Document(body) => body,
        other => anyhow::bail!("the command must be a document, not {other}"),
    };
    body.insert("$db", database);
    let request = mongo_sim::wire::encode_op_msg_request(1, 0, &body, &[])?;
    // A server started a moment ago may not listen yet: it gets five seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut stream = loop {
        match std::net::TcpStream::connect((host, port)) {
            Ok(stream) => break stream,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(error) => {
                return Err(error)
                    .with_context(|| format!("no test server answers on {host}:{port}"));
            }
        }
    };
    stream.write_all(&request)?;
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix)?;
    let length = usize::try_from(i32::from_le_bytes(prefix)).context("a negative reply length")?;
    anyhow::ensure!(length >= 4, "a reply shorter than its length field");
    let mut reply = prefix.to_vec();
    reply.resize(length, 0);
    stream.read_exact(&mut reply[4..])?;
    let (_, reply) = mongo_sim::wire::decode_op_msg_reply(&reply)?;
    let ok = reply.get("ok").and_then(bson::Bson::as_f64) == Some(1.0)
        || reply.get("ok").and_then(bson::Bson::as_i32) == Some(1);
    let text = bson::Bson::Document(reply)
        .into_relaxed_extjson()
        .to_string();
    anyhow::ensure!(ok, "the command failed: {text}");
    writeln!(std::io::stdout().lock(), "{text}")?;
    Ok(())
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
    if let Some(Client::Command {
        port,
        host,
        database,
        command,
    }) = &args.client
    {
        return send_command(host, *port, database, command);
    }
    let replica_set_id = args
        .replica_set_id
        .as_deref()
        .map(ObjectId::parse_str)
        .transpose()
        .context("--replica-set-id must be 24 hex digits")?;
    let cluster_id = args
        .cluster_id
        .as_deref()
        .map(ObjectId::parse_str)
        .transpose()
        .context("--cluster-id must be 24 hex digits")?;
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
        shards: usize::from(args.shards),
        noop_interval: std::time::Duration::from_millis(args.noop_interval_ms),
        cluster_id,
        ..Config::default()
    };
    let server = Server::start(config).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {}", server.addr())?;
        for i in 0..server.shard_count() {
            if let Some(host) = server.shard_host(i) {
                writeln!(out, "shard{i} {host}")?;
            }
        }
        out.flush()?;
    }
    tokio::signal::ctrl_c().await.ok();
    server.shutdown().await;
    Ok(())
}
