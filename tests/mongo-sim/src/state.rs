//! Server-wide state shared by all connections.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc, oid::ObjectId};
use tokio::sync::Notify;

use crate::config::Config;
use crate::cursor::Cursor;
use crate::failpoints::FailPoints;
use crate::namespace::Namespace;
use crate::oplog::Oplog;
use crate::storage::{Store, Txn};

/// Idle cursors older than this are discarded.
pub const CURSOR_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a session's transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnStatus {
    None,
    InProgress,
    Committed,
    Aborted,
}

#[derive(Debug)]
pub struct Session {
    pub lsid: Document,
    /// Highest txnNumber seen on this session.
    pub txn_number: i64,
    pub status: TxnStatus,
    pub txn: Option<Txn>,
    pub txn_started: Instant,
    /// The reply of the last retryable write, by txnNumber.
    pub retry: Option<(i64, Document)>,
}

impl Session {
    fn new(lsid: Document) -> Self {
        Session {
            lsid,
            txn_number: -1,
            status: TxnStatus::None,
            txn: None,
            txn_started: Instant::now(),
            retry: None,
        }
    }
}

/// Everything guarded by the state lock.
#[derive(Debug)]
pub struct State {
    pub store: Store,
    pub oplog: Oplog,
    pub sessions: HashMap<Vec<u8>, Session>,
    /// Open transactions: id → snapshot.
    pub active: BTreeMap<u64, u64>,
    pub cursors: HashMap<i64, Cursor>,
    /// When each cursor was last handed back; idle ones are dropped like a real server does.
    cursor_used: HashMap<i64, Instant>,
    next_txn_id: u64,
    next_cursor_id: i64,
}

/// A borrowed view for executing one statement.
pub struct Parts<'a> {
    pub store: &'a mut Store,
    pub oplog: &'a mut Oplog,
    pub txn: Option<&'a mut Txn>,
    pub min_snapshot: u64,
}

impl State {
    /// State keeping `history_limit` change events and `snapshot_history` of committed states.
    pub fn new(history_limit: usize, snapshot_history: Duration) -> Self {
        Self::with_history(Oplog::new(history_limit), snapshot_history)
    }

    /// State over the given change history (a sharded cluster's, with its catalog).
    pub fn with_history(oplog: Oplog, snapshot_history: Duration) -> Self {
        State {
            store: Store::new(snapshot_history, oplog.cluster_time()),
            oplog,
            sessions: HashMap::new(),
            active: BTreeMap::new(),
            cursors: HashMap::new(),
            cursor_used: HashMap::new(),
            next_txn_id: 1,
            next_cursor_id: 0x1F00_0000_0000,
        }
    }

    pub fn min_snapshot(&self) -> u64 {
        self.active.values().copied().min().unwrap_or(u64::MAX)
    }

    /// The id of the open transaction of the session `key` names, if any.
    pub fn txn_id(&self, key: Option<&[u8]>) -> Option<u64> {
        self.sessions.get(key?)?.txn.as_ref().map(|t| t.id)
    }

    pub fn session(&mut self, key: &[u8], lsid: &Document) -> &mut Session {
        self.sessions
            .entry(key.to_vec())
            .or_insert_with(|| Session::new(lsid.clone()))
    }

    /// The store, history and (if `txn_key` names a session with an open transaction) its
    /// transaction.
    pub fn parts(&mut self, txn_key: Option<&[u8]>) -> Parts<'_> {
        let min_snapshot = self.min_snapshot();
        let txn = match txn_key {
            Some(k) => self.sessions.get_mut(k).and_then(|s| s.txn.as_mut()),
            None => None,
        };
        Parts {
            store: &mut self.store,
            oplog: &mut self.oplog,
            txn,
            min_snapshot,
        }
    }

    /// Starts a transaction on the session, aborting any older one still open (and any
    /// transaction of another session open longer than `lifetime`).
    pub fn begin_txn(&mut self, key: &[u8], lsid: &Document, txn_number: i64, lifetime: Duration) {
        self.end_open_txn(key);
        self.reap_expired(lifetime);
        let id = self.next_txn_id;
        self.next_txn_id += 1;
        let snapshot = self.store.seq;
        self.active.insert(id, snapshot);
        let s = self.session(key, lsid);
        s.txn_number = txn_number;
        s.status = TxnStatus::InProgress;
        s.txn_started = Instant::now();
        s.txn = Some(Txn {
            id,
            txn_number,
            snapshot,
            writes: HashMap::new(),
            events: Vec::new(),
        });
    }

    /// Aborts the session's open transaction, if any. Returns true if one was open.
    pub fn end_open_txn(&mut self, key: &[u8]) -> bool {
        let Some(s) = self.sessions.get_mut(key) else {
            return false;
        };
        let Some(txn) = s.txn.take() else {
            return false;
        };
        if s.status == TxnStatus::InProgress {
            s.status = TxnStatus::Aborted;
        }
        self.active.remove(&txn.id);
        let min = self.min_snapshot();
        self.store.abort(txn, min);
        true
    }

    /// Aborts transactions open longer than `lifetime`. Returns how many.
    pub fn reap_expired(&mut self, lifetime: Duration) -> usize {
        let expired: Vec<Vec<u8>> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.txn.is_some() && s.txn_started.elapsed() > lifetime)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expired {
            self.end_open_txn(k);
        }
        expired.len()
    }

    pub fn new_cursor_id(&mut self) -> i64 {
        self.next_cursor_id += 1;
        self.next_cursor_id
    }

    /// Stores (or puts back) a cursor, dropping cursors idle for longer than `CURSOR_TIMEOUT`.
    pub fn put_cursor(&mut self, id: i64, cursor: Cursor) {
        self.cursors.insert(id, cursor);
        let now = Instant::now();
        self.cursor_used.insert(id, now);
        if self.cursor_used.len() > 64 && id % 64 == 0 {
            let expired: Vec<i64> = self
                .cursor_used
                .iter()
                .filter(|(_, t)| now.duration_since(**t) > CURSOR_TIMEOUT)
                .map(|(id, _)| *id)
                .collect();
            for id in expired {
                self.cursor_used.remove(&id);
                self.cursors.remove(&id);
            }
            let cursors = &self.cursors;
            self.cursor_used.retain(|id, _| cursors.contains_key(id));
        }
    }

    pub fn touch_cursor(&mut self, id: i64) {
        self.cursor_used.insert(id, Instant::now());
    }

    /// Drops cursors on a namespace that no longer exists.
    pub fn forget_find_cursors(&mut self, ns: &Namespace) {
        let full = ns.to_string();
        self.cursors
            .retain(|_, c| !matches!(c, Cursor::Find(f) if f.ns == full));
    }
}

/// Immutable server facts plus the locked state and wake-ups.
#[derive(Debug)]
pub struct Shared {
    pub config: Config,
    pub port: u16,
    /// `host:port` advertised in `hello`.
    pub me: String,
    /// The shard listeners' `host:port`, by shard index (sharded mode only).
    pub shard_hosts: Vec<String>,
    pub replica_set_id: ObjectId,
    pub election_id: ObjectId,
    pub state: Mutex<State>,
    /// Woken whenever history grows.
    pub history_grew: Notify,
    /// Woken whenever a transaction ends.
    pub txn_ended: Notify,
    pub failpoints: Mutex<FailPoints>,
    /// Each shard listener's own fail points (sharded mode), by shard index.
    pub shard_failpoints: Vec<Mutex<FailPoints>>,
    pub next_connection_id: AtomicI64,
    pub commands_served: AtomicU64,
    /// What the last commands received asked for (see [`Shared::record_command`]).
    pub received: Mutex<VecDeque<Document>>,
    /// The feature compatibility version as (major, minor): the release's own until
    /// `setFeatureCompatibilityVersion` lowers it.
    pub feature_compatibility: Mutex<(i32, i32)>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn feature_compatibility(&self) -> (i32, i32) {
        *self
            .feature_compatibility
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn failpoints(&self) -> MutexGuard<'_, FailPoints> {
        self.failpoints.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fail points of a listener: shard `i`'s own, or (`None`) the server's.
    pub fn failpoints_of(&self, shard: Option<usize>) -> MutexGuard<'_, FailPoints> {
        match shard.and_then(|i| self.shard_failpoints.get(i)) {
            Some(points) => points.lock().unwrap_or_else(|p| p.into_inner()),
            None => self.failpoints(),
        }
    }

    pub fn is_replica_set(&self) -> bool {
        !self.config.standalone
    }

    /// True when the server answers as a `mongos` in front of `config.shards` shards.
    pub fn is_sharded(&self) -> bool {
        self.config.shards > 0 && !self.config.standalone
    }

    /// Notes what a command asked for, for tests: the application name its connection gave in
    /// its handshake, its name, database and collection, the concerns and read preference it
    /// carried, its transaction fields, for an insert how many documents it held and for a
    /// `bulkWrite` the namespaces it writes to (`namespaces`). Never the documents themselves. The last [`RECEIVED_KEPT`] are kept.
    pub fn record_command(&self, app: Option<&str>, db: &str, name: &str, body: &Document) {
        let mut seen = doc! {"command": name, "db": db};
        if let Some(app) = app {
            seen.insert("app", app);
        }
        if let Some(Bson::String(target)) = body.get(name) {
            seen.insert("collection", target.clone());
        }
        for key in [
            "writeConcern",
            "readConcern",
            "$readPreference",
            "startTransaction",
            "autocommit",
            "txnNumber",
        ] {
            if let Some(value) = body.get(key) {
                seen.insert(key, value.clone());
            }
        }
        if let Some(Bson::Array(documents)) = body.get("documents") {
            seen.insert("documents", documents.len() as i64);
        }
        if let Some(Bson::Array(ops)) = body.get("ops") {
            seen.insert("ops", ops.len() as i64);
        }
        if let Some(Bson::Array(namespaces)) = body.get("nsInfo") {
            let namespaces: Vec<Bson> = namespaces
                .iter()
                .filter_map(|n| n.as_document()?.get_str("ns").ok())
                .map(Bson::from)
                .collect();
            seen.insert("namespaces", namespaces);
        }
        let mut received = self.received.lock().unwrap_or_else(|p| p.into_inner());
        if received.len() == RECEIVED_KEPT {
            received.pop_front();
        }
        received.push_back(seen);
    }
}

/// How many received commands [`Shared::record_command`] keeps.
pub const RECEIVED_KEPT: usize = 10_000;

pub type SharedRef = Arc<Shared>;
