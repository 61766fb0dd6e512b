//! A test server started in the test process (it outlives every `handoff run` the test starts or
//! kills), a driver client on it, and the checkpoint and outbox read back.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bson::{Bson, Document, doc};
use futures_util::TryStreamExt;
use mongo_sim::{Config, ServerHandle};
use mongodb::Client;
use mongodb::options::ClientOptions;
use sha2::Digest;

pub const DB: &str = "change_demo";
pub const CONSUMER: &str = "orders-to-outbox";
pub const CHECKPOINTS: &str = "kestra_change_checkpoints";
pub const OUTBOX: &str = "kestra_change_outbox";

pub struct Live {
    pub server: ServerHandle,
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
}

impl Live {
    pub fn start() -> Live {
        Live::with_config(Config::default())
    }

    pub fn with_config(config: Config) -> Live {
        let server = ServerHandle::start_blocking(config).expect("test server starts");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let uri = server.uri();
        let client = rt.block_on(async {
            let mut options = ClientOptions::parse(&uri).await.expect("uri");
            options.server_selection_timeout = Some(Duration::from_secs(5));
            Client::with_options(options).expect("client")
        });
        Live { server, rt, client }
    }

    pub fn uri(&self) -> String {
        self.server.uri()
    }

    /// Runs a driver action (or any future) to completion.
    pub fn wait<F: std::future::IntoFuture>(&self, action: F) -> F::Output {
        self.rt.block_on(action.into_future())
    }

    pub fn coll(&self, name: &str) -> mongodb::Collection<Document> {
        self.client.database(DB).collection(name)
    }

    /// `handoff run` on this server: one-second idle wait, up to 500 events.
    pub fn command(&self) -> Command {
        let mut command = super::handoff();
        command
            .arg("run")
            .env("MONGODB_URI", self.uri())
            .env("MAX_WAIT_SECONDS", "1")
            .env("MAX_EVENTS", "500");
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

    /// The checkpoint's token; panics when the checkpoint or its token is missing.
    pub fn checkpoint_token(&self) -> Document {
        self.checkpoint()
            .expect("a checkpoint")
            .get_document("token")
            .expect("a token")
            .clone()
    }

    /// Every outbox document, in insertion order.
    pub fn outbox(&self) -> Vec<Document> {
        self.rt.block_on(async {
            self.coll(OUTBOX)
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

/// The hex of a `{_data: HEX}` token (the test server's hex order is stream order).
pub fn token_hex(token: &Document) -> String {
    token.get_str("_data").expect("_data").to_string()
}

/// Asserts the checkpoint is at `last` (the last event's token) or at a high-water mark after it,
/// and that nothing the server holds comes after it.
pub fn assert_checkpoint_at_end(live: &Live, last: &Document) {
    let checkpoint = live.checkpoint_token();
    let (at, last_hex) = (token_hex(&checkpoint), token_hex(last));
    assert!(
        checkpoint == *last || (at > last_hex && at.ends_with("02")),
        "checkpoint {at} is neither the last event {last_hex} nor a high-water mark after it"
    );
    assert!(
        live.events_after(&checkpoint).is_empty(),
        "events remain after the checkpoint"
    );
}
