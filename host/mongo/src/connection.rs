//! The connection: a client on its own small runtime, the deployment checked exactly as the
//! baseline checks it, and the run's deadline over every later call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use mongodb::error::{Error as DriverError, ErrorKind};
use mongodb::options::{ClientOptions, ConnectionString, ReadConcern, ReadPreference};
use mongodb::{Client, Database};

use super::errors::classify_connect;
use super::redaction::Redactor;
use super::{
    CLOSE_WAIT, DEFAULT_TRANSACTION_LIFETIME, SERVER_SELECTION_TIMEOUT, TRANSIENT_RETRY_MARGIN,
    guarded_database, majority_writes, primary,
};
use handoff_domain::Deployment;
use handoff_domain::error::{HandoffError, Result};

/// A client, its runtime, and the deployment identity checked at connection.
pub struct Connection {
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) client: Client,
    pub(super) deployment: Deployment,
    pub(super) redactor: Redactor,
    /// No call to the server outlives this instant (the run's deadline).
    pub(super) deadline: std::sync::OnceLock<Instant>,
    /// The server's `transactionLifetimeLimitSeconds`, asked the first time a commit meets a
    /// transient error (a routine run never needs it).
    pub(super) transaction_lifetime: tokio::sync::OnceCell<Duration>,
    /// How long `replSetGetConfig` took to answer, on the connection `hello` opened: what one more
    /// round trip to the server costs.
    pub(super) round_trip: Duration,
    /// The client's options, for a client of the same user on one shard of a sharded cluster
    /// (the shards' own oplogs).
    pub(super) options: ClientOptions,
}

/// How many connections a client may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// The driver's default: commands that overlap (an operator's stream read beside its chunk
    /// reads) each get a connection.
    Shared,
    /// One connection, unless the URI sizes the pool: a run sends one command at a time, and a
    /// command that would overlap another (the cursor closed as the stream is dropped, the
    /// figures read at the end) waits for it instead of opening a connection of its own, which
    /// costs a TCP (and TLS) handshake and the driver's `hello` exchange.
    Single,
}

/// The run's deadline passed while a call to the server was under way.
#[derive(Debug)]
pub struct DeadlinePassed;

/// A replica set (`hello.setName`), pinned by `settings.replicaSetId`, as the baseline checks it.
fn replica_set(
    runtime: &tokio::runtime::Runtime,
    hello: &Document,
    admin: &Database,
    redactor: &Redactor,
) -> Result<Deployment> {
    let set_name = match hello.get_str("setName") {
        Ok(name) if !name.is_empty() => name.to_string(),
        _ => {
            return Err(HandoffError::BadInput(
                "This blueprint requires a MongoDB replica set or a sharded cluster's mongos, not \
                 a standalone server"
                    .into(),
            ));
        }
    };
    let config = runtime
        .block_on(async { admin.run_command(doc! { "replSetGetConfig": 1 }).await })
        .map_err(|e| classify_connect(&e, redactor))?;
    let replica_set_id = config
        .get_document("config")
        .ok()
        .and_then(|c| c.get_document("settings").ok())
        .and_then(|s| s.get("replicaSetId"))
        .map(hex_id)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            HandoffError::Mismatch(
                "The replica set did not return replicaSetId; cannot pin the checkpoint to this deployment".into(),
            )
        })?;
    // The name is the server's: escaped like any text from it (a text log prints it raw).
    tracing::info!(
        set_name = %handoff_domain::text::escape_untrusted(&set_name, 128),
        "connected to the replica set"
    );
    Ok(Deployment::replica_set(set_name, replica_set_id))
}

/// A sharded cluster through `mongos` (`hello.msg` is `isdbgrid`), pinned by the `clusterId` of
/// `config.version`, which every shard and router of the cluster shares and no other cluster has.
fn cluster(
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    redactor: &Redactor,
) -> Result<Deployment> {
    let config = guarded_database(client, "config");
    let version = runtime
        .block_on(async {
            config
                .collection::<Document>("version")
                .find_one(doc! {})
                .await
        })
        .map_err(|e| classify_connect(&e, redactor))?;
    let cluster_id = version
        .as_ref()
        .and_then(|v| v.get("clusterId"))
        .map(hex_id)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            HandoffError::Mismatch(
                "The sharded cluster did not return its clusterId (config.version); cannot pin \
                 the checkpoint to this deployment"
                    .into(),
            )
        })?;
    tracing::info!("connected to the sharded cluster through mongos");
    Ok(Deployment::sharded_cluster(cluster_id))
}

/// An ID as the checkpoint stores it: an ObjectId as hex, a string as it is; anything else names
/// no deployment.
fn hex_id(id: &Bson) -> String {
    match id {
        Bson::ObjectId(oid) => oid.to_hex(),
        Bson::String(s) => s.clone(),
        _ => String::new(),
    }
}

/// Says (once, without values) which of the URI's concerns are overridden.
fn warn_about_overridden_concerns(parsed: &ConnectionString) {
    let mut ignored = Vec::new();
    if parsed
        .write_concern
        .as_ref()
        .is_some_and(|w| *w != majority_writes())
    {
        ignored.push("write concern");
    }
    if parsed
        .read_concern
        .as_ref()
        .is_some_and(|r| *r != ReadConcern::majority())
    {
        ignored.push("read concern");
    }
    if parsed
        .read_preference
        .as_ref()
        .is_some_and(|p| !matches!(p, ReadPreference::Primary))
    {
        ignored.push("read preference");
    }
    if !ignored.is_empty() {
        tracing::warn!(
            ignored = %ignored.join(", "),
            "the URI's concerns are ignored: checkpoint and outbox work always uses majority writes, \
             majority or snapshot reads and the primary"
        );
    }
}

/// A fixed message for a URI the driver parsed but cannot use: nothing of the URI is echoed.
fn unusable_uri(error: &DriverError) -> &'static str {
    match error.kind.as_ref() {
        ErrorKind::DnsResolve { .. } => {
            "MONGODB_URI cannot be used: the DNS records of its mongodb+srv host cannot be resolved"
        }
        _ => {
            "MONGODB_URI cannot be used: check its options (TLS files, authentication mechanism, option values)"
        }
    }
}

/// The server's `transactionLifetimeLimitSeconds` (`getParameter`); `None` when the server does
/// not allow or answer the question.
async fn transaction_lifetime(admin: &Database) -> Option<Duration> {
    let reply = admin
        .run_command(doc! { "getParameter": 1, "transactionLifetimeLimitSeconds": 1 })
        .await
        .ok()?;
    let seconds = match reply.get("transactionLifetimeLimitSeconds") {
        Some(Bson::Int32(n)) => u64::try_from(*n).ok(),
        Some(Bson::Int64(n)) => u64::try_from(*n).ok(),
        Some(Bson::Double(n)) if n.is_finite() && *n >= 0.0 => Some(*n as u64),
        _ => None,
    };
    seconds
        .filter(|s| *s > 0)
        .map(|seconds| Duration::from_secs(seconds.min(24 * 3600)))
}

impl Connection {
    /// Connects and checks the deployment exactly as the baseline does. Nothing is written.
    pub fn connect(uri: &str) -> Result<Arc<Connection>> {
        Connection::connect_with(uri, Pool::Shared)
    }

    /// As [`Connection::connect`], with the pool shaped by `pool`.
    pub fn connect_with(uri: &str, pool: Pool) -> Result<Arc<Connection>> {
        if !(uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://")) {
            return Err(HandoffError::BadInput(
                "MONGODB_URI must be a MongoDB connection URI".into(),
            ));
        }
        // Options the Python task takes that change nothing here are set aside, with one warning.
        let prepared = super::uri::prepare(uri);
        if !prepared.set_aside.is_empty() {
            tracing::warn!(
                options = %prepared.set_aside.join(", "),
                "MONGODB_URI options that have no effect here are set aside: handoff decodes \
                 values, connects and times out on its own terms, and writes with majority"
            );
        }
        // The driver's own parse (no DNS): a URI it refuses is not echoed, not even in part; a
        // known option it refuses is named.
        let parsed = ConnectionString::parse(&prepared.uri)
            .map_err(|_| HandoffError::BadInput(super::uri::refusal(&prepared.uri)))?;
        let redactor = Redactor::for_connection_string(&parsed, uri);
        warn_about_overridden_concerns(&parsed);
        // The calling thread drives the driver itself: a worker thread would cost two thread
        // wake-ups per round trip, which on a small virtual machine outweigh the round trip.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| HandoffError::Internal(e.into()))?;
        let mut options = runtime
            .block_on(async { ClientOptions::parse(parsed).await })
            .map_err(|e| HandoffError::BadInput(unusable_uri(&e).into()))?;
        options.server_selection_timeout = Some(SERVER_SELECTION_TIMEOUT);
        options.retry_writes = Some(true);
        options.app_name = Some("handoff".into());
        if pool == Pool::Single
            && options.max_pool_size.is_none()
            && options.min_pool_size.is_none()
        {
            options.max_pool_size = Some(1);
        }
        // The URI's concerns never apply: every handle below also sets its own.
        options.write_concern = Some(majority_writes());
        options.read_concern = Some(ReadConcern::majority());
        options.selection_criteria = Some(primary());
        // The driver spawns its monitors on the runtime it is created in.
        let _context = runtime.enter();
        let client = Client::with_options(options.clone())
            .map_err(|e| HandoffError::BadInput(unusable_uri(&e).into()))?;
        let admin = guarded_database(&client, "admin");
        let hello = runtime
            .block_on(async { admin.run_command(doc! { "hello": 1 }).await })
            .map_err(|e| classify_connect(&e, &redactor))?;
        let asked = Instant::now();
        let deployment = if hello.get_str("msg").ok() == Some("isdbgrid") {
            cluster(&runtime, &client, &redactor)?
        } else {
            replica_set(&runtime, &hello, &admin, &redactor)?
        };
        let round_trip = asked.elapsed();
        tracing::debug!(
            round_trip_us = round_trip.as_micros() as u64,
            "round trip to the deployment"
        );
        Ok(Arc::new(Connection {
            runtime,
            client,
            deployment,
            redactor,
            deadline: std::sync::OnceLock::new(),
            transaction_lifetime: tokio::sync::OnceCell::new(),
            round_trip,
            options,
        }))
    }

    /// A database whose every operation goes to the primary with majority writes and majority
    /// reads, whatever the URI says.
    pub fn database(&self, name: &str) -> Database {
        guarded_database(&self.client, name)
    }

    /// How long a commit is retried on `TransientTransactionError`: long enough for the server to
    /// expire a transaction a killed run left open (the run's deadline still bounds it). The
    /// server is asked the first time this is needed, and again until it answers.
    pub async fn transient_retry_window(&self) -> Duration {
        let admin = guarded_database(&self.client, "admin");
        // Only an answer is kept: a server failing now may answer the next time.
        let asked = self
            .transaction_lifetime
            .get_or_try_init(|| async {
                let lifetime = transaction_lifetime(&admin).await.ok_or(())?;
                tracing::debug!(
                    transaction_lifetime_s = lifetime.as_secs(),
                    "transaction lifetime"
                );
                Ok::<_, ()>(lifetime)
            })
            .await;
        let lifetime = asked.copied().unwrap_or_else(|()| {
            tracing::debug!("transactionLifetimeLimitSeconds unknown for now; assuming 60 s");
            DEFAULT_TRANSACTION_LIFETIME
        });
        lifetime + TRANSIENT_RETRY_MARGIN
    }

    /// Ends the client's sessions on the server (`endSessions`, which also aborts any
    /// transaction one of them still holds) and closes its connections. Called at the end of
    /// every run, success or failure, once the stream and the store are dropped; it waits at
    /// most [`CLOSE_WAIT`].
    pub fn close(&self) {
        let client = self.client.clone();
        let closed = self
            .runtime
            .block_on(async move { tokio::time::timeout(CLOSE_WAIT, client.shutdown()).await });
        match closed {
            Ok(()) => tracing::debug!("MongoDB sessions ended and connections closed"),
            Err(_) => tracing::warn!(
                wait_s = CLOSE_WAIT.as_secs(),
                "closing the MongoDB connection took too long; the server expires what was not ended"
            ),
        }
    }

    /// `text` (a driver error, say) with the URI's credentials removed.
    pub fn redact(&self, text: &str) -> String {
        self.redactor.clean(text)
    }

    pub fn deployment(&self) -> &Deployment {
        &self.deployment
    }

    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Bounds every later call to the server by `deadline` (set once, by the run).
    pub fn limit_to(&self, deadline: Instant) {
        let _ = self.deadline.set(deadline);
    }

    /// Runs `future`, giving up `grace` after the run's deadline (or after `grace` when no
    /// deadline is set): for what a run does on its way out, like giving its lease back.
    pub fn bounded_past_deadline<F: std::future::Future>(
        &self,
        future: F,
        grace: std::time::Duration,
    ) -> std::result::Result<F::Output, DeadlinePassed> {
        let now = Instant::now();
        let until = self.deadline.get().copied().unwrap_or(now).max(now) + grace;
        let until = tokio::time::Instant::from_std(until);
        self.runtime
            .block_on(async move { tokio::time::timeout_at(until, future).await })
            .map_err(|_| DeadlinePassed)
    }

    /// Runs `future`, giving up when the run's deadline passes.
    pub fn bounded<F: std::future::Future>(
        &self,
        future: F,
    ) -> std::result::Result<F::Output, DeadlinePassed> {
        match self.deadline.get() {
            None => Ok(self.runtime.block_on(future)),
            Some(deadline) => {
                let deadline = tokio::time::Instant::from_std(*deadline);
                // The timer needs the runtime's context, so it is made inside it.
                self.runtime
                    .block_on(async move { tokio::time::timeout_at(deadline, future).await })
                    .map_err(|_| DeadlinePassed)
            }
        }
    }
}
