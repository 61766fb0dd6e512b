//! The main job, live: `handoff run` against a replica set.
//!
//! Every test starts its own test server (`tests/mongo-sim`). With `MONGODB_URI` set, the tests
//! that need nothing but a replica set run against that deployment instead (each in its own
//! database, one test at a time); those that need a server configured for them (bounded history,
//! standalone) always use their own test server.

use crate::support;

use std::process::Output;
use std::time::Duration;

use bson::{Bson, Document, doc};
use futures_util::TryStreamExt;
use mongo_sim::{Config, ServerHandle};
use mongodb::Client;
use mongodb::options::ClientOptions;
use sha2::Digest;
use support::handoff;
use support::live::{Turn, shared_uri};

/// A replica set for one test: a test server of its own, or `MONGODB_URI`.
struct Deployment {
    _server: Option<ServerHandle>,
    uri: String,
    db: String,
    rt: tokio::runtime::Runtime,
    client: Client,
    /// Set once a fail point was configured on the shared deployment.
    fail_point_set: std::cell::Cell<bool>,
    _turn: Option<Turn>,
}

impl Deployment {
    fn any(name: &str) -> Deployment {
        match shared_uri() {
            Some(uri) => Self::connect(None, uri, name, Some(Turn::take())),
            None => Self::sim(Config::default(), name),
        }
    }

    fn sim(config: Config, name: &str) -> Deployment {
        let server = ServerHandle::start_blocking(config).expect("test server starts");
        let uri = if server.set_name().is_empty() {
            server.direct_uri()
        } else {
            server.uri()
        };
        Self::connect(Some(server), uri, name, None)
    }

    fn connect(
        server: Option<ServerHandle>,
        uri: String,
        name: &str,
        turn: Option<Turn>,
    ) -> Deployment {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let mut options = ClientOptions::parse(&uri).await.expect("uri");
            options.server_selection_timeout = Some(Duration::from_secs(5));
            Client::with_options(options).expect("client")
        });
        let db = format!("handoff_{name}_{}", std::process::id());
        Deployment {
            _server: server,
            uri,
            db,
            rt,
            client,
            fail_point_set: std::cell::Cell::new(false),
            _turn: turn,
        }
    }

    /// Runs a driver action (or any future) to completion.
    fn wait<F: std::future::IntoFuture>(&self, action: F) -> F::Output {
        self.rt.block_on(action.into_future())
    }

    fn coll(&self, name: &str) -> mongodb::Collection<Document> {
        self.client.database(&self.db).collection(name)
    }

    fn insert(&self, docs: Vec<Document>) {
        self.wait(self.coll("orders").insert_many(docs))
            .expect("insert");
    }

    fn run(&self, extra: &[&str]) -> Output {
        self.run_with(&self.uri, extra)
    }

    fn run_with(&self, uri: &str, extra: &[&str]) -> Output {
        handoff()
            .arg("run")
            .env("MONGODB_URI", uri)
            .env("SOURCE_DATABASE", &self.db)
            .env("MAX_WAIT_SECONDS", "1")
            .args(extra)
            .output()
            .expect("run handoff")
    }

    fn checkpoint(&self) -> Option<Document> {
        self.wait(
            self.coll("kestra_change_checkpoints")
                .find_one(doc! {"_id": "orders-to-outbox"}),
        )
        .expect("find")
    }

    fn outbox(&self) -> Vec<Document> {
        self.rt.block_on(async {
            self.coll("kestra_change_outbox")
                .find(doc! {})
                .await
                .expect("find")
                .try_collect()
                .await
                .expect("collect")
        })
    }

    fn fail_point(&self, mode: Bson, data: Document) {
        self.fail_point_set.set(true);
        self.wait(
            self.client.database("admin").run_command(
                doc! {"configureFailPoint": "failCommand", "mode": mode, "data": data},
            ),
        )
        .expect("configureFailPoint");
    }

    /// A first, idle run: a fresh consumer starts the stream now and saves its watermark.
    fn start_consumer(&self) {
        let out = support::ok(&self.run(&[]));
        assert_eq!(out["status"], "IDLE");
        assert!(
            self.checkpoint().expect("checkpoint")["token"]
                .as_document()
                .is_some()
        );
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        // A fail point a failed test left on would strike the next tests on the deployment.
        if self._server.is_none() && self.fail_point_set.get() {
            let _ = self.wait(
                self.client
                    .database("admin")
                    .run_command(doc! {"configureFailPoint": "failCommand", "mode": "off"}),
            );
        }
    }
}

/// The baseline's event ID of a delivered event.
fn event_id(event: &Document) -> String {
    let token = event.get_document("_id").expect("token");
    hex::encode(sha2::Sha256::digest(
        handoff::domain::token::canonical_text(token).as_bytes(),
    ))
}

fn ops(outbox: &[Document]) -> Vec<String> {
    outbox
        .iter()
        .map(|r| {
            r.get_document("event")
                .unwrap()
                .get_str("operationType")
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Every outbox `_id` is `<consumer>/<sha256 of the event's token>`, and no event appears twice.
fn assert_outbox_consistent(outbox: &[Document]) {
    let mut seen = std::collections::HashSet::new();
    for record in outbox {
        let event = record.get_document("event").unwrap();
        assert_eq!(
            record.get_str("_id").unwrap(),
            format!("orders-to-outbox/{}", event_id(event))
        );
        assert!(seen.insert(event_id(event)), "event handed off twice");
    }
}

#[test]
fn live_crud_is_handed_off_once_each_with_the_event_as_sent() {
    let d = Deployment::any("crud");
    d.start_consumer();
    d.insert(vec![
        doc! {"_id": 1, "sku": "A", "qty": 5_i64, "price": bson::Decimal128::from_bytes([0; 16])},
        doc! {"_id": 2, "sku": "B"},
    ]);
    d.rt.block_on(async {
        let orders = d.coll("orders");
        orders
            .update_one(doc! {"_id": 1}, doc! {"$inc": {"qty": 1_i64}})
            .await
            .unwrap();
        orders
            .replace_one(doc! {"_id": 2}, doc! {"sku": "B2"})
            .await
            .unwrap();
        orders.delete_one(doc! {"_id": 1}).await.unwrap();
    });
    let out = support::ok(&d.run(&[]));
    assert_eq!(out["status"], "HANDED_OFF");
    assert_eq!(out["events_handed_off"], 5);
    let outbox = d.outbox();
    assert_eq!(
        ops(&outbox),
        ["insert", "insert", "update", "replace", "delete"]
    );
    assert_outbox_consistent(&outbox);
    // Types survive: the Int64 and the Decimal128 are still BSON types, never JSON numbers.
    let first = outbox[0]
        .get_document("event")
        .unwrap()
        .get_document("fullDocument")
        .unwrap();
    assert_eq!(first.get("qty"), Some(&Bson::Int64(5)));
    assert!(matches!(first.get("price"), Some(Bson::Decimal128(_))));
    // updateLookup: the update carries the document as it is now (deleted later, so null or the doc).
    let update = outbox[2].get_document("event").unwrap();
    assert!(update.get_document("updateDescription").is_ok());
    assert!(update.contains_key("fullDocument"));
    assert_eq!(
        out["last_event_id"],
        event_id(outbox[4].get_document("event").unwrap())
    );
    let checkpoint = d.checkpoint().unwrap();
    assert_eq!(checkpoint.get_str("mode").unwrap(), "resumeAfter");
    assert_eq!(
        checkpoint.get_str("source").unwrap(),
        format!("{}.orders", d.db)
    );

    // Nothing new: idle, nothing repeated.
    let out = support::ok(&d.run(&[]));
    assert_eq!(out["events_handed_off"], 0);
    assert_eq!(d.outbox().len(), 5);
}

#[test]
fn transactional_writes_are_handed_off_with_their_session() {
    let d = Deployment::any("txn");
    d.start_consumer();
    d.rt.block_on(async {
        let mut session = d.client.start_session().await.unwrap();
        session.start_transaction().await.unwrap();
        let orders = d.coll("orders");
        orders
            .insert_one(doc! {"_id": 10})
            .session(&mut session)
            .await
            .unwrap();
        orders
            .insert_one(doc! {"_id": 11})
            .session(&mut session)
            .await
            .unwrap();
        session.commit_transaction().await.unwrap();
    });
    let out = support::ok(&d.run(&[]));
    assert_eq!(out["events_handed_off"], 2);
    let outbox = d.outbox();
    for record in &outbox {
        let event = record.get_document("event").unwrap();
        assert!(
            event.contains_key("lsid") && event.contains_key("txnNumber"),
            "{event}"
        );
    }
    assert_outbox_consistent(&outbox);
}

#[test]
fn max_events_splits_the_work_across_runs_without_loss() {
    let d = Deployment::any("cap");
    d.start_consumer();
    d.insert((0..7).map(|i| doc! {"_id": i}).collect());
    let mut total = 0;
    for _ in 0..4 {
        total += support::ok(&d.run(&["--max-events", "3"]))["events_handed_off"]
            .as_u64()
            .unwrap();
    }
    assert_eq!(total, 7);
    let outbox = d.outbox();
    assert_eq!(outbox.len(), 7);
    assert_outbox_consistent(&outbox);
}

fn invalidation(d: &Deployment, change: impl FnOnce(&Deployment)) {
    d.start_consumer();
    d.insert(vec![doc! {"_id": 1}]);
    change(d);
    let out = support::ok(&d.run(&[]));
    assert_eq!(out["status"], "INVALIDATED");
    let checkpoint = d.checkpoint().unwrap();
    assert_eq!(checkpoint.get_str("mode").unwrap(), "startAfter");
    let handed_off = d.outbox().len();
    // The collection comes back: the next run starts after the invalidation and sees it.
    d.insert(vec![doc! {"_id": 2, "reborn": true}]);
    let out = support::ok(&d.run(&[]));
    assert_eq!(out["status"], "HANDED_OFF");
    let outbox = d.outbox();
    assert_eq!(outbox.len(), handed_off + 1);
    let last = outbox.last().unwrap().get_document("event").unwrap();
    assert_eq!(
        last.get_document("fullDocument")
            .unwrap()
            .get_bool("reborn")
            .ok(),
        Some(true)
    );
    assert_eq!(
        d.checkpoint().unwrap().get_str("mode").unwrap(),
        "resumeAfter"
    );
}

#[test]
fn dropping_the_collection_invalidates_and_the_next_run_starts_after() {
    let d = Deployment::any("drop");
    invalidation(&d, |d| d.wait(d.coll("orders").drop()).unwrap());
    assert_eq!(ops(&d.outbox())[..2], ["insert", "drop"]);
}

#[test]
fn renaming_the_collection_invalidates_and_the_next_run_starts_after() {
    let d = Deployment::any("rename");
    invalidation(&d, |d| {
        d.wait(d.client.database("admin").run_command(doc! {
            "renameCollection": format!("{}.orders", d.db),
            "to": format!("{}.orders_old", d.db),
        }))
        .unwrap();
    });
    assert_eq!(ops(&d.outbox())[..2], ["insert", "rename"]);
}

#[test]
fn lost_history_fails_with_the_checkpoint_untouched() {
    let d = Deployment::sim(
        Config {
            history_limit: 8,
            ..Config::default()
        },
        "history",
    );
    d.start_consumer();
    let before = d.checkpoint();
    d.insert((0..20).map(|i| doc! {"_id": i}).collect());
    let output = d.run(&[]);
    support::fails(&output, 6, "ChangeStreamHistoryLost");
    assert!(
        support::stderr(&output)
            .contains("reconcile from a verified snapshot before resetting this consumer")
    );
    // Its position is untouched (the run took and gave back its lease).
    let (before, after) = (before.unwrap(), d.checkpoint().unwrap());
    for key in ["token", "mode"] {
        assert_eq!(after.get(key), before.get(key), "{key}");
    }
    assert!(d.outbox().is_empty());
}

#[test]
fn two_runs_at_once_hand_off_every_event_exactly_once() {
    let d = Deployment::any("race");
    d.start_consumer();
    d.insert((0..30).map(|i| doc! {"_id": i}).collect());
    let spawn = || {
        handoff()
            .arg("run")
            .env("MONGODB_URI", &d.uri)
            .env("SOURCE_DATABASE", &d.db)
            .env("MAX_WAIT_SECONDS", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let results = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    for output in &results {
        match output.status.code() {
            Some(0) => {}
            // Stopped at its start by the other's lease, or (both started before either took
            // it) by the other's claim or commit.
            Some(3) => {
                let err = support::stderr(output);
                assert!(
                    err.contains("holds this consumer")
                        || err.contains("took this consumer's checkpoint")
                        || err.contains("Checkpoint changed during this run"),
                    "{err}"
                )
            }
            other => panic!("unexpected exit {other:?}: {}", support::stderr(output)),
        }
    }
    // Whatever the interleaving, a last run drains the rest and nothing is doubled.
    support::ok(&d.run(&[]));
    let outbox = d.outbox();
    assert_eq!(outbox.len(), 30);
    assert_outbox_consistent(&outbox);
}

#[test]
fn an_injected_write_conflict_is_retried_and_committed_once() {
    let d = Deployment::any("conflict");
    d.start_consumer();
    d.insert(vec![doc! {"_id": 1}, doc! {"_id": 2}]);
    // The outbox insert runs only inside the handoff transaction.
    let (_, insert) = d.wait(support::live::transaction_writes(&d.client));
    d.fail_point(
        doc! {"times": 1}.into(),
        doc! {"failCommands": [insert], "errorCode": 112, "errorLabels": ["TransientTransactionError"]},
    );
    let output = d.run(&[]);
    let out = support::ok(&output);
    assert_eq!(out["events_handed_off"], 2);
    assert!(
        support::stderr(&output).contains("transient transaction error; retrying"),
        "the fail point never fired"
    );
    let outbox = d.outbox();
    assert_eq!(outbox.len(), 2);
    assert_outbox_consistent(&outbox);
}

#[test]
fn a_connection_closed_mid_stream_is_resumed_without_loss_or_repeat() {
    let d = Deployment::any("network");
    d.start_consumer();
    d.insert((0..5).map(|i| doc! {"_id": i}).collect());
    d.fail_point(
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["getMore"], "closeConnection": true},
    );
    let first = support::ok(&d.run(&[]));
    d.insert((5..8).map(|i| doc! {"_id": i}).collect());
    let second = support::ok(&d.run(&[]));
    assert_eq!(
        first["events_handed_off"].as_u64().unwrap()
            + second["events_handed_off"].as_u64().unwrap(),
        8
    );
    let outbox = d.outbox();
    assert_eq!(outbox.len(), 8);
    assert_outbox_consistent(&outbox);
}

#[test]
fn a_checkpoint_written_by_the_python_task_is_continued_exactly() {
    // The baseline's documents, written as its code writes them: the checkpoint after its
    // second event, and the outbox records of its first two events.
    let d = Deployment::any("seedcompat");
    d.start_consumer();
    d.insert((0..4).map(|i| doc! {"_id": i}).collect());
    let saved = d
        .checkpoint()
        .unwrap()
        .get_document("token")
        .unwrap()
        .clone();
    let events: Vec<Document> = d.rt.block_on(async {
        let stream = d
            .coll("orders")
            .watch()
            .start_after(bson::deserialize_from_bson(Bson::Document(saved)).unwrap())
            .await
            .unwrap();
        let mut stream = stream.with_type::<Document>();
        let mut out = Vec::new();
        while out.len() < 4 {
            if let Some(e) = stream.next_if_any().await.unwrap() {
                out.push(e);
            }
        }
        out
    });
    let source = format!("{}.orders", d.db);
    d.rt.block_on(async {
        d.coll("kestra_change_checkpoints")
            .update_one(
                doc! {"_id": "orders-to-outbox"},
                doc! {"$set": {"token": events[1].get_document("_id").unwrap().clone(), "mode": "resumeAfter"}},
            )
            .await
            .unwrap();
        for e in &events[..2] {
            d.coll("kestra_change_outbox")
                .insert_one(doc! {"_id": format!("orders-to-outbox/{}", event_id(e)), "consumer": "orders-to-outbox", "source": &source, "event": e.clone()})
                .await
                .unwrap();
        }
    });
    let out = support::ok(&d.run(&[]));
    assert_eq!(out["events_handed_off"], 2);
    let outbox = d.outbox();
    assert_eq!(outbox.len(), 4);
    assert_outbox_consistent(&outbox);
    assert_eq!(out["last_event_id"], event_id(&events[3]));
}

#[test]
fn bad_uri_unreachable_and_standalone_servers_are_refused_with_nothing_written() {
    let d = Deployment::sim(Config::default(), "refusals");
    support::fails(
        &d.run_with("http://example.com", &[]),
        2,
        "MONGODB_URI must be a MongoDB connection URI",
    );
    support::fails(
        &d.run_with("mongodb://", &[]),
        2,
        "not a valid MongoDB connection string",
    );
    // Nothing listens on port 1; the credentials must never be printed.
    let output = d.run_with(
        "mongodb://alice:pa55w0rd@127.0.0.1:1/?serverSelectionTimeoutMS=500",
        &[],
    );
    support::fails(&output, 10, "Cannot reach a MongoDB server");
    assert!(!support::stderr(&output).contains("pa55w0rd"));
    // A server that refuses the credentials (the test server supports no SCRAM conversation).
    let with_credentials = d
        .uri
        .replacen("mongodb://", "mongodb://alice:s3cr3t-pw@", 1);
    let output = d.run_with(&with_credentials, &[]);
    support::fails(&output, 11, "MongoDB refused the credentials");
    assert!(!support::stderr(&output).contains("s3cr3t-pw"));
    let standalone = Deployment::sim(
        Config {
            standalone: true,
            ..Config::default()
        },
        "standalone",
    );
    support::fails(
        &standalone.run(&[]),
        2,
        "This blueprint requires a MongoDB replica set or a sharded cluster's mongos, not a \
         standalone server",
    );
    assert_eq!(standalone.checkpoint(), None);
    assert_eq!(d.checkpoint(), None);
    // Bad inputs are refused before connecting.
    support::fails(
        &d.run(&["--max-events", "0"]),
        2,
        "max_events must be 1-500",
    );
    assert_eq!(d.checkpoint(), None);
}
