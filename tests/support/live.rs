//! A replica set for one test and a driver client on it, and the checkpoint and outbox read back.
//!
//! By default every test starts its own test server in the test process (it outlives every
//! `handoff run` the test starts or kills). With `MONGODB_URI` set and non-empty, [`Live::start`]
//! uses that deployment instead, each test in a database of its own; tests that need a server
//! configured for them ([`Live::with_config`]) keep their own test server either way.

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use bson::{Bson, Document, doc};
use futures_util::TryStreamExt;
use mongo_sim::{Config, ServerHandle};
use mongodb::Client;
use mongodb::options::ClientOptions;
use sha2::Digest;

/// The database of a test on its own test server.
pub const DB: &str = "change_demo";
pub const CONSUMER: &str = "orders-to-outbox";
pub const CHECKPOINTS: &str = "kestra_change_checkpoints";
pub const OUTBOX: &str = "kestra_change_outbox";

/// The deployment `MONGODB_URI` names, when it is set and not empty.
pub fn shared_uri() -> Option<String> {
    std::env::var("MONGODB_URI")
        .ok()
        .filter(|uri| !uri.is_empty())
}

/// A database name no other test uses, on a deployment other runs may share:
/// `handoff_<test>_<process id>_<counter>`, within the 63 characters `handoff` accepts.
pub fn database_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let thread = std::thread::current();
    let test: String = match thread.name() {
        Some(name) if name != "main" => name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(32)
            .collect(),
        _ => "test".into(),
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("handoff_{test}_{}_{n}", std::process::id())
}

/// Who uses the shared deployment now: the thread of one test, as often as it asks.
static TURN: Mutex<(Option<ThreadId>, usize)> = Mutex::new((None, 0));
static TURN_FREED: Condvar = Condvar::new();

/// A test's turn on the shared deployment. The tests of a suite take turns there: a fail point
/// one of them sets applies to every client of the server, whatever the database.
pub struct Turn(());

impl Turn {
    /// Waits until no other test holds a turn (the same thread may hold several).
    pub fn take() -> Turn {
        let me = std::thread::current().id();
        let mut turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        while turn.0.is_some_and(|holder| holder != me) {
            turn = TURN_FREED.wait(turn).unwrap_or_else(|p| p.into_inner());
        }
        turn.0 = Some(me);
        turn.1 += 1;
        Turn(())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        turn.1 -= 1;
        if turn.1 == 0 {
            turn.0 = None;
            TURN_FREED.notify_all();
        }
    }
}

/// The commands a handoff transaction writes with on this deployment, as `(compare-and-set,
/// record inserts)`: one `bulkWrite` for both on MongoDB 8.0 (wire version 25) and later, else
/// `update` and `insert`.
pub async fn transaction_writes(client: &Client) -> (&'static str, &'static str) {
    let hello = client
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .expect("hello");
    let wire = hello
        .get("maxWireVersion")
        .and_then(|v| match v {
            Bson::Int32(n) => Some(i64::from(*n)),
            Bson::Int64(n) => Some(*n),
            _ => None,
        })
        .expect("hello gives maxWireVersion");
    if wire >= 25 {
        ("bulkWrite", "bulkWrite")
    } else {
        ("update", "insert")
    }
}

pub struct Live {
    /// The test's own test server; `None` on the deployment `MONGODB_URI` names.
    server: Option<ServerHandle>,
    uri: String,
    /// The database of the watched collection, the checkpoint and the outbox.
    pub db: String,
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
    /// Set once a fail point was configured on the shared deployment: it is turned off when the
    /// test ends, however it ends.
    fail_point_set: AtomicBool,
    _turn: Option<Turn>,
}

impl Live {
    /// A replica set: the deployment `MONGODB_URI` names, else a test server of its own.
    pub fn start() -> Live {
        match shared_uri() {
            Some(uri) => {
                let turn = Turn::take();
                Live::connect(None, uri, database_name(), Some(turn))
            }
            None => Live::with_config(Config::default()),
        }
    }

    /// A test server of its own for runs killed mid-transaction: their open transaction is
    /// reaped after a second, as a real server does after its lifetime limit (a minute by
    /// default), so that the next run does not wait for it.
    pub fn for_kills() -> Live {
        Live::with_config(Config {
            transaction_lifetime: std::time::Duration::from_secs(1),
            ..Config::default()
        })
    }

    /// A sharded cluster of `shards` shards behind one `mongos`, of its own, with the watched
    /// collection sharded by a hashed `_id` (its documents spread over every shard). Each shard's
    /// no-op writer runs every 20 ms (MongoDB's runs every 10 s), so that an idle shard holds the
    /// merged stream back briefly; a killed run's transaction is reaped after a second.
    pub fn sharded(shards: usize) -> Live {
        Live::sharded_with(Config {
            shards,
            transaction_lifetime: Duration::from_secs(1),
            ..Config::default()
        })
    }

    /// A test server of its own, configured for the test, whatever `MONGODB_URI` says. With
    /// `HANDOFF_TEST_SHARDS=K` (K > 0) a replica set becomes a sharded cluster of K shards (see
    /// [`Live::sharded`]): the suites that kill, race, fault and stop runs run on one so.
    pub fn with_config(config: Config) -> Live {
        let shards = std::env::var("HANDOFF_TEST_SHARDS")
            .ok()
            .map(|k| {
                k.trim()
                    .parse::<usize>()
                    .expect("HANDOFF_TEST_SHARDS is a number")
            })
            .unwrap_or(0);
        if shards > 0 && config.shards == 0 && !config.standalone {
            return Live::sharded_with(Config { shards, ..config });
        }
        let server = ServerHandle::start_blocking(config).expect("test server starts");
        let uri = server.uri();
        Live::connect(Some(server), uri, DB.into(), None)
    }

    /// A sharded cluster as `config` says, the watched collection sharded by a hashed `_id`.
    fn sharded_with(config: Config) -> Live {
        let config = Config {
            noop_interval: Duration::from_millis(20),
            ..config
        };
        let server = ServerHandle::start_blocking(config).expect("test server starts");
        let uri = server.uri();
        let live = Live::connect(Some(server), uri, DB.into(), None);
        live.admin(doc! {"enableSharding": &live.db});
        live.admin(doc! {
            "shardCollection": format!("{}.orders", live.db),
            "key": {"_id": "hashed"},
        });
        live
    }

    fn connect(server: Option<ServerHandle>, uri: String, db: String, turn: Option<Turn>) -> Live {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt.block_on(async {
            let mut options = ClientOptions::parse(&uri).await.expect("uri");
            options.server_selection_timeout = Some(Duration::from_secs(5));
            Client::with_options(options).expect("client")
        });
        Live {
            server,
            uri,
            db,
            rt,
            client,
            fail_point_set: AtomicBool::new(false),
            _turn: turn,
        }
    }

    pub fn uri(&self) -> String {
        self.uri.clone()
    }

    /// Works on the test's database (a paced writer, a reader) from a thread of its own while the
    /// test goes on (starting and killing runs): `work` gets a client of its own and the
    /// database, on a current-thread runtime. Join the handle for what it returns.
    pub fn background<T, F>(&self, work: F) -> std::thread::JoinHandle<T>
    where
        T: Send + 'static,
        F: AsyncFnOnce(Client, mongodb::Database) -> T + Send + 'static,
    {
        let (uri, db) = (self.uri(), self.db.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let client = Client::with_uri_str(&uri).await.expect("client");
                let database = client.database(&db);
                work(client, database).await
            })
        })
    }

    /// The test's own test server; panics on a shared deployment (such tests use
    /// [`Live::with_config`]).
    pub fn server(&self) -> &ServerHandle {
        self.server
            .as_ref()
            .expect("this test runs on its own test server (Live::with_config)")
    }

    /// `host:port` of the first server the URI names.
    pub fn address(&self) -> String {
        let options = self.wait(ClientOptions::parse(&self.uri)).expect("uri");
        options.hosts.first().expect("a host").to_string()
    }

    /// `settings.replicaSetId` of the deployment, as `handoff` reads it.
    pub fn replica_set_id(&self) -> String {
        let reply = self
            .wait(
                self.client
                    .database("admin")
                    .run_command(doc! {"replSetGetConfig": 1}),
            )
            .expect("replSetGetConfig");
        match reply
            .get_document("config")
            .and_then(|c| c.get_document("settings"))
            .map(|s| s.get("replicaSetId"))
        {
            Ok(Some(Bson::ObjectId(id))) => id.to_hex(),
            other => panic!("replSetGetConfig gave no replicaSetId: {other:?}"),
        }
    }

    /// The databases other than the server's own (`admin`, `config`, `local`).
    pub fn user_databases(&self) -> Vec<String> {
        let mut names = self
            .wait(self.client.list_database_names())
            .expect("listDatabases");
        names.retain(|n| !["admin", "config", "local"].contains(&n.as_str()));
        names.sort();
        names
    }

    /// Runs a driver action (or any future) to completion.
    /// What `handoff` sent to the test's own server (its handshake names it; the test's own
    /// reads are left out), oldest first.
    pub fn received_from_handoff(&self) -> Vec<Document> {
        self.server()
            .received_commands()
            .into_iter()
            .filter(|c| c.get_str("app").ok() == Some("handoff"))
            .collect()
    }

    /// The names of the commands in [`Live::received_from_handoff`].
    pub fn commands_from_handoff(&self) -> Vec<String> {
        self.received_from_handoff()
            .iter()
            .filter_map(|c| c.get_str("command").ok().map(str::to_string))
            .collect()
    }

    /// See [`transaction_writes`].
    pub fn transaction_writes(&self) -> (&'static str, &'static str) {
        self.wait(transaction_writes(&self.client))
    }

    pub fn wait<F: std::future::IntoFuture>(&self, action: F) -> F::Output {
        self.rt.block_on(action.into_future())
    }

    /// `command` run on the `admin` database of the deployment.
    pub fn admin(&self, command: Document) -> Document {
        self.wait(self.client.database("admin").run_command(command))
            .expect("admin command")
    }

    pub fn coll(&self, name: &str) -> mongodb::Collection<Document> {
        self.client.database(&self.db).collection(name)
    }

    /// `handoff run` on this deployment and database: one-second idle wait, up to 500 events.
    pub fn command(&self) -> Command {
        let mut command = super::handoff();
        command
            .arg("run")
            .env("MONGODB_URI", &self.uri)
            .env("SOURCE_DATABASE", &self.db)
            .env("MAX_WAIT_SECONDS", "1")
            .env("MAX_EVENTS", "500");
        command
    }

    /// An operator command (`status`, `checkpoint reset`, `reconcile`, …) against this server's
    /// database, without an audit collection or operator name from the test's environment.
    pub fn operator(&self, args: &[&str]) -> Output {
        self.operator_command(args).output().expect("run handoff")
    }

    /// The command [`Live::operator`] runs, to spawn.
    pub fn operator_command(&self, args: &[&str]) -> Command {
        let mut command = super::handoff();
        command
            .args(args)
            .env("MONGODB_URI", &self.uri)
            .env("SOURCE_DATABASE", &self.db)
            .env_remove(super::env_names::AUDIT_COLLECTION)
            .env_remove("HANDOFF_OPERATOR");
        command
    }

    pub fn run(&self, extra: &[&str]) -> Output {
        self.command().args(extra).output().expect("run handoff")
    }

    pub fn spawn(&self, extra: &[&str]) -> std::process::Child {
        self.command()
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn handoff")
    }

    pub fn checkpoint(&self) -> Option<Document> {
        self.wait(self.coll(CHECKPOINTS).find_one(doc! {"_id": CONSUMER}))
            .expect("find checkpoint")
    }

    /// Where the checkpoint stands, `(token, mode)`, leaving out what a run writes without
    /// moving it (its lease, revision and configuration).
    pub fn position(&self) -> Option<(Option<Bson>, Option<Bson>)> {
        self.checkpoint()
            .map(|c| (c.get("token").cloned(), c.get("mode").cloned()))
    }

    /// The checkpoint's token; panics when the checkpoint or its token is missing.
    pub fn checkpoint_token(&self) -> Document {
        self.checkpoint()
            .expect("a checkpoint")
            .get_document("token")
            .expect("a token")
            .clone()
    }

    /// Ends the consumer's lease now, as time would: a run that was killed, or whose release
    /// failed with its commits, leaves it held until `leaseUntil`.
    pub fn expire_lease(&self) {
        self.wait(self.coll(CHECKPOINTS).update_one(
            doc! {"_id": CONSUMER},
            doc! {"$set": {"leaseUntil": bson::DateTime::from_millis(0)}},
        ))
        .expect("expire the lease");
    }

    /// Every outbox document, in insertion order.
    pub fn outbox(&self) -> Vec<Document> {
        self.records(OUTBOX)
    }

    /// Every document of `collection`, in insertion order.
    pub fn records(&self, collection: &str) -> Vec<Document> {
        self.rt.block_on(async {
            self.coll(collection)
                .find(doc! {})
                .await
                .expect("find outbox")
                .try_collect()
                .await
                .expect("collect outbox")
        })
    }

    pub fn outbox_len(&self) -> usize {
        self.wait(self.coll(OUTBOX).count_documents(doc! {}))
            .expect("count outbox") as usize
    }

    pub fn insert(&self, ids: std::ops::Range<i32>) {
        self.wait(
            self.coll("orders")
                .insert_many(ids.map(|i| doc! {"_id": i, "qty": 0}).collect::<Vec<_>>()),
        )
        .expect("insert");
    }

    pub fn fail_point(&self, mode: Bson, data: Document) {
        self.fail_point_set.store(true, Ordering::Relaxed);
        self.wait(
            self.client.database("admin").run_command(
                doc! {"configureFailPoint": "failCommand", "mode": mode, "data": data},
            ),
        )
        .expect("configureFailPoint");
    }

    /// Turns the fail point off; returns how many times it fired.
    pub fn fail_point_off(&self) -> i64 {
        let reply = self
            .wait(
                self.client
                    .database("admin")
                    .run_command(doc! {"configureFailPoint": "failCommand", "mode": "off"}),
            )
            .expect("configureFailPoint off");
        match reply.get("count") {
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Int32(n)) => i64::from(*n),
            other => panic!("configureFailPoint off answered {other:?}"),
        }
    }

    /// A first, idle run: the fresh consumer starts the stream now and saves its watermark.
    pub fn start_consumer(&self) -> Document {
        let out = super::ok(&self.run(&[]));
        assert_eq!(out["status"], "IDLE");
        self.checkpoint_token()
    }

    /// Every change event of the watched collection after `token`, as the server sends them.
    pub fn events_after(&self, token: &Document) -> Vec<Document> {
        self.rt.block_on(async {
            let token: mongodb::change_stream::event::ResumeToken =
                bson::deserialize_from_bson(Bson::Document(token.clone())).unwrap();
            let mut stream = self
                .coll("orders")
                .watch()
                .resume_after(token)
                .max_await_time(Duration::from_millis(200))
                .await
                .expect("watch")
                .with_type::<Document>();
            let mut events = Vec::new();
            while let Some(event) = stream.next_if_any().await.expect("next") {
                events.push(event);
            }
            events
        })
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // A fail point a failed test left on would strike the next tests on the deployment.
        if self.server.is_none() && self.fail_point_set.load(Ordering::Relaxed) {
            let _ = self.wait(
                self.client
                    .database("admin")
                    .run_command(doc! {"configureFailPoint": "failCommand", "mode": "off"}),
            );
        }
    }
}

/// The integer `_id` of the document an outbox record's event is about.
pub fn key_of(record: &Document) -> i32 {
    record
        .get_document("event")
        .and_then(|e| e.get_document("documentKey"))
        .and_then(|k| k.get_i32("_id"))
        .expect("an integer documentKey._id")
}

/// The integer `_id`s of the outbox records' documents, in the outbox's order.
pub fn keys_of(outbox: &[Document]) -> Vec<i32> {
    outbox.iter().map(key_of).collect()
}

/// The default policy's event ID: SHA-256 of the token's canonical text.
pub fn event_id(event: &Document) -> String {
    let token = event.get_document("_id").expect("event token");
    hex::encode(sha2::Sha256::digest(
        handoff::domain::token::canonical_text(token).as_bytes(),
    ))
}

/// The event IDs of the outbox records, checking each `_id` is `<consumer>/<event ID>` of its
/// event and that no event appears twice.
pub fn outbox_event_ids(outbox: &[Document]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    outbox
        .iter()
        .map(|record| {
            let event = record.get_document("event").expect("outbox event");
            let id = event_id(event);
            assert_eq!(
                record.get_str("_id").expect("outbox _id"),
                format!("{CONSUMER}/{id}")
            );
            assert!(seen.insert(id.clone()), "event {id} handed off twice");
            id
        })
        .collect()
}

/// The hex of a `{_data: HEX}` token (resume tokens sort by it in stream order, MongoDB's and the
/// test server's alike).
pub fn token_hex(token: &Document) -> String {
    token.get_str("_data").expect("_data").to_string()
}

/// Asserts the checkpoint is at `last` (the last event's token) or at a high-water mark after it,
/// and that nothing the server holds comes after it.
pub fn assert_checkpoint_at_end(live: &Live, last: &Document) {
    let checkpoint = live.checkpoint_token();
    let (at, last_hex) = (token_hex(&checkpoint), token_hex(last));
    // Past the last event with no event after that one: a high-water mark, whatever the
    // deployment's token layout.
    assert!(
        checkpoint == *last || (at > last_hex && live.events_after(last).is_empty()),
        "checkpoint {at} is neither the last event {last_hex} nor a high-water mark after it"
    );
    assert!(
        live.events_after(&checkpoint).is_empty(),
        "events remain after the checkpoint"
    );
}
