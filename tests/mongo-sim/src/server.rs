//! Starting and stopping the server, the accept loop and per-connection request handling.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bson::oid::ObjectId;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::cluster::Catalog;
use crate::commands::{self, ConnInfo, Listener, Outcome};
use crate::failpoints::FailPoints;
use crate::oplog::Oplog;
use crate::state::{Shared, State};
use crate::wire;

pub use crate::config::Config;

/// Entry point: `Server::start(config)`.
pub struct Server;

impl Server {
    /// Binds and starts serving on the current tokio runtime.
    pub async fn start(config: Config) -> anyhow::Result<ServerHandle> {
        let listener = TcpListener::bind((config.host.as_str(), config.port))
            .await
            .with_context(|| format!("binding {}:{}", config.host, config.port))?;
        let addr = listener.local_addr()?;
        let me = config
            .advertised_host
            .clone()
            .unwrap_or_else(|| format!("127.0.0.1:{}", addr.port()));
        let sharded = config.shards > 0 && !config.standalone;
        let mut shard_listeners = Vec::new();
        let mut shard_hosts = Vec::new();
        if sharded {
            for i in 0..config.shards {
                let l = TcpListener::bind((config.host.as_str(), 0))
                    .await
                    .with_context(|| format!("binding shard {i} on {}", config.host))?;
                shard_hosts.push(format!("127.0.0.1:{}", l.local_addr()?.port()));
                shard_listeners.push(l);
            }
        }
        let replica_set_id = config.replica_set_id.unwrap_or_default();
        let catalog = Catalog::new(
            if sharded { config.shards } else { 0 },
            config.cluster_id.unwrap_or_default(),
        );
        let oplog = Oplog::with_catalog(config.history_limit, catalog);
        let shared = Arc::new(Shared {
            port: addr.port(),
            me,
            shard_hosts,
            replica_set_id,
            election_id: ObjectId::from_bytes([0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1]),
            state: Mutex::new(State::with_history(oplog, config.snapshot_history)),
            history_grew: Default::default(),
            txn_ended: Default::default(),
            failpoints: Mutex::new(FailPoints::default()),
            shard_failpoints: (0..config.shards)
                .map(|_| Mutex::new(FailPoints::default()))
                .collect(),
            next_connection_id: AtomicI64::new(1),
            commands_served: AtomicU64::new(0),
            received: Default::default(),
            feature_compatibility: Mutex::new(crate::commands::admin::release(&config)),
            config,
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        info!(address = %addr, set_name = %shared.config.set_name, standalone = shared.config.standalone, shards = shared.config.shards, "mongo-sim listening");
        for (i, l) in shard_listeners.into_iter().enumerate() {
            tokio::spawn(accept_loop(
                l,
                shared.clone(),
                stop_rx.clone(),
                Listener::Shard(i),
            ));
        }
        if sharded {
            tokio::spawn(noop_writer(shared.clone(), stop_rx.clone()));
        }
        let task = tokio::spawn(accept_loop(
            listener,
            shared.clone(),
            stop_rx,
            Listener::Main,
        ));
        Ok(ServerHandle {
            addr,
            shared,
            stop: Some(stop_tx),
            task: Some(task),
            thread: None,
        })
    }
}

/// Every `noop_interval`, each shard that applied nothing since the last round writes a
/// no-op (advancing its applied time), waking change streams held back by it.
async fn noop_writer(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let interval = shared.config.noop_interval.max(Duration::from_millis(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => break,
        }
        let advanced = shared.lock().oplog.write_noops();
        if advanced {
            shared.history_grew.notify_waiters();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    role: Listener,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let shared = shared.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move { serve_connection(shared, stream, peer, stop, role).await });
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
    debug!("accept loop stopped");
}

async fn serve_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    mut stop: watch::Receiver<bool>,
    listener: Listener,
) {
    let _ = stream.set_nodelay(true);
    let conn = ConnInfo {
        listener,
        id: shared.next_connection_id.fetch_add(1, Ordering::Relaxed),
        peer: peer.to_string(),
        app_name: Default::default(),
    };
    debug!(connection_id = conn.id, peer = %conn.peer, "connection accepted");
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let max = shared.config.max_message_bytes;
    loop {
        let read = tokio::select! {
            r = wire::read_message(&mut rd, max) => r,
            _ = stop.changed() => break,
        };
        let msg = match read {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(wire::WireError::Io(e)) => {
                debug!(connection_id = conn.id, error = %e, "connection read ended");
                break;
            }
            Err(e) => {
                warn!(connection_id = conn.id, peer = %conn.peer, error = %e, "closing connection after a bad message");
                break;
            }
        };
        shared.commands_served.fetch_add(1, Ordering::Relaxed);
        match commands::handle_message(&shared, &conn, msg).await {
            Outcome::Reply(bytes) => {
                if let Err(e) = wr.write_all(&bytes).await {
                    debug!(connection_id = conn.id, error = %e, "write failed");
                    break;
                }
            }
            Outcome::NoReply => {}
            Outcome::Close => {
                debug!(connection_id = conn.id, "closing connection on request");
                break;
            }
        }
    }
    debug!(connection_id = conn.id, "connection closed");
}

/// One shard's history as [`ServerHandle::shard_history`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHistory {
    /// Cluster time of the oldest retained event (`None` while nothing is retained).
    pub first: Option<bson::Timestamp>,
    /// Cluster time of the newest retained event.
    pub last: Option<bson::Timestamp>,
    /// Retained events.
    pub len: usize,
    /// The time the shard has applied up to: its last write or periodic no-op.
    pub applied: bson::Timestamp,
}

/// A running server. Dropping it stops the server.
pub struct ServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<watch::Sender<bool>>,
    task: Option<JoinHandle<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("addr", &self.addr)
            .finish()
    }
}

impl ServerHandle {
    /// Starts a server on its own runtime thread, for tests without an async runtime.
    pub fn start_blocking(config: Config) -> anyhow::Result<ServerHandle> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("mongo-sim".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::Error::from(e)));
                        return;
                    }
                };
                rt.block_on(async move {
                    match Server::start(config).await {
                        Ok(mut handle) => {
                            let task = handle.task.take();
                            let (addr, shared, stop) =
                                (handle.addr, handle.shared.clone(), handle.stop.take());
                            let mut stopped = stop.as_ref().map(|s| s.subscribe());
                            let _ = tx.send(Ok((addr, shared, stop)));
                            if let Some(rx) = stopped.as_mut() {
                                let _ = rx.wait_for(|v| *v).await;
                            }
                            if let Some(t) = task {
                                let _ = t.await;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
                rt.shutdown_timeout(Duration::from_millis(200));
            })?;
        let (addr, shared, stop) = rx.recv().context("server thread exited")??;
        Ok(ServerHandle {
            addr,
            shared,
            stop,
            task: None,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The `host:port` the server advertises.
    pub fn host_port(&self) -> String {
        self.shared.me.clone()
    }

    /// A connection string for drivers: `mongodb://HOST:PORT/` for a sharded cluster's
    /// `mongos`, `?replicaSet=NAME` for a replica set, `?directConnection=true` standalone.
    pub fn uri(&self) -> String {
        if self.shared.is_sharded() {
            format!("mongodb://{}/", self.shared.me)
        } else if self.shared.config.standalone {
            format!("mongodb://{}/?directConnection=true", self.shared.me)
        } else {
            format!(
                "mongodb://{}/?replicaSet={}",
                self.shared.me, self.shared.config.set_name
            )
        }
    }

    /// A connection string that bypasses replica-set discovery.
    pub fn direct_uri(&self) -> String {
        format!("mongodb://{}/?directConnection=true", self.shared.me)
    }

    pub fn replica_set_id(&self) -> ObjectId {
        self.shared.replica_set_id
    }

    pub fn set_name(&self) -> &str {
        &self.shared.config.set_name
    }

    /// What the last commands received asked for, oldest first: `{command, db, app?, collection?,
    /// writeConcern?, readConcern?, $readPreference?, startTransaction?, autocommit?, txnNumber?,
    /// documents?, ops?, namespaces?}` (`app` is the handshake's `client.application.name` on the
    /// command's connection, `documents` an insert's document count, `ops` a bulkWrite's operation
    /// count, `namespaces` the namespaces of its `nsInfo`). Handshakes and monitoring
    /// (`hello`, `isMaster`) are included like any other command.
    pub fn received_commands(&self) -> Vec<bson::Document> {
        let received = self
            .shared
            .received
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        received.iter().cloned().collect()
    }

    /// Forgets the commands received so far.
    pub fn clear_received_commands(&self) {
        self.shared
            .received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Number of change events currently retained (over all shards in sharded mode; an
    /// event recorded on several shards counts on each).
    pub fn history_len(&self) -> usize {
        self.shared.lock().oplog.len()
    }

    /// `config.version`'s `clusterId` (sharded mode).
    pub fn cluster_id(&self) -> ObjectId {
        self.shared.lock().oplog.catalog.cluster_id
    }

    /// How many shards the `mongos` fronts (0 for a replica set).
    pub fn shard_count(&self) -> usize {
        self.shared.lock().oplog.catalog.shard_count()
    }

    /// The shard owning `doc` of collection `ns` (`db.coll`): by the collection's shard key,
    /// or its database's primary shard when it is not sharded. 0 on a replica set (or for a
    /// namespace without a dot).
    pub fn shard_of(&self, ns: &str, doc: &bson::Document) -> usize {
        let Some(ns) = crate::namespace::Namespace::parse(ns) else {
            return 0;
        };
        self.shared.lock().oplog.catalog.shard_of(&ns, doc)
    }

    /// Shard `i`'s history (the replica set's for 0 in replica-set mode): its retained
    /// window and applied time; `None` past the last shard.
    pub fn shard_history(&self, i: usize) -> Option<ShardHistory> {
        let st = self.shared.lock();
        let log = st.oplog.shard(i)?;
        let window = log.window();
        Some(ShardHistory {
            first: window.map(|w| w.0),
            last: window.map(|w| w.1),
            len: log.len(),
            applied: log.applied(),
        })
    }

    /// Shard `i`'s own listener, `host:port` (sharded mode).
    pub fn shard_host(&self, i: usize) -> Option<String> {
        self.shared.shard_hosts.get(i).cloned()
    }

    /// A connection string for shard `i`'s listener, a replica-set primary named `shardN`
    /// serving `hello`, `replSetGetStatus` and `find` on `local.oplog.rs`.
    pub fn shard_uri(&self, i: usize) -> Option<String> {
        self.shard_host(i)
            .map(|h| format!("mongodb://{h}/?directConnection=true"))
    }

    fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }

    /// Stops accepting, closes connections and waits for the accept loop to end.
    pub async fn shutdown(mut self) {
        self.signal_stop();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.signal_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
