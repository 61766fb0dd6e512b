//! Sharded clusters: handoff through a `mongos` in front of the test server's shards.
//!
//! The watched collection is sharded by a hashed `_id`, so its documents and their changes live on
//! every shard; the `mongos` merges the shards' streams in cluster-time order. Every command works
//! through it, the checkpoint is pinned to the cluster's `clusterId` (never moving to a replica set
//! or another cluster), and runs killed while they hand off events of every shard, and
//! transactions that span shards, lose nothing and hand nothing off twice.

use crate::support;

use std::collections::BTreeSet;
use std::process::Child;
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use support::live::*;
use support::{Rng, partitions};

/// Inserts `ids` one by one.
fn insert(live: &Live, ids: std::ops::Range<i32>) {
    for id in ids {
        live.wait(live.coll("orders").insert_one(doc! {"_id": id, "v": 0}))
            .expect("insert");
    }
}

/// Sets `v: 1` on each of `ids` in the orders.
fn update(live: &Live, ids: std::ops::Range<i32>) {
    for id in ids {
        live.wait(
            live.coll("orders")
                .update_one(doc! {"_id": id}, doc! {"$set": {"v": 1}}),
        )
        .expect("update");
    }
}

/// The shard each outbox record's document lives on.
fn shards_of(live: &Live, outbox: &[Document]) -> BTreeSet<usize> {
    let server = live.server();
    outbox
        .iter()
        .map(|record| {
            let key = record
                .get_document("event")
                .and_then(|e| e.get_document("documentKey"))
                .expect("documentKey");
            server.shard_of(&format!("{}.orders", live.db), key)
        })
        .collect()
}

#[test]
fn a_run_through_mongos_hands_off_every_shards_events_once_and_pins_the_checkpoint_to_the_cluster()
{
    let live = Live::sharded(2);
    live.start_consumer();
    let checkpoint = live.checkpoint().expect("a checkpoint");
    assert_eq!(
        checkpoint.get_str("clusterId").ok(),
        Some(live.server().cluster_id().to_hex().as_str()),
        "{checkpoint}"
    );
    assert!(!checkpoint.contains_key("replicaSetId"), "{checkpoint}");
    insert(&live, 0..40);
    let out = support::ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 40, "{out}");
    let outbox = live.outbox();
    assert_eq!(
        keys_of(&outbox),
        (0..40).collect::<Vec<_>>(),
        "merged in write order"
    );
    assert_eq!(shards_of(&live, &outbox), BTreeSet::from([0, 1]));
    let again = support::ok(&live.run(&[]));
    assert_eq!(again["events_handed_off"], 0);
    assert_eq!(live.outbox_len(), 40);

    // Another cluster's checkpoint, and a replica set's, are refused with nothing written.
    let pinned = |set: Document, unset: &str| {
        live.wait(live.coll(CHECKPOINTS).update_one(
            doc! {"_id": CONSUMER},
            doc! {"$set": set, "$unset": {unset: ""}},
        ))
        .expect("repin the checkpoint");
    };
    insert(&live, 40..42);
    pinned(
        doc! {"clusterId": "66a000000000000000000002"},
        "replicaSetId",
    );
    support::fails(&live.run(&[]), 4, "belongs to another sharded cluster");
    pinned(
        doc! {"replicaSetId": live.server().cluster_id().to_hex()},
        "clusterId",
    );
    support::fails(
        &live.run(&[]),
        4,
        "belongs to a replica set, and this deployment is a sharded cluster",
    );
    assert_eq!(live.outbox_len(), 40, "nothing written by a refused run");
}

#[test]
fn a_cluster_checkpoint_never_continues_on_a_replica_set() {
    let live = Live::start();
    live.start_consumer();
    live.wait(live.coll(CHECKPOINTS).update_one(
        doc! {"_id": CONSUMER},
        doc! {"$set": {"clusterId": "66a000000000000000000001"}, "$unset": {"replicaSetId": ""}},
    ))
    .expect("pin the checkpoint to a cluster");
    live.insert(0..2);
    let refused = support::fails(
        &live.run(&[]),
        4,
        "belongs to a sharded cluster, and this deployment is a replica set",
    );
    assert_eq!(live.outbox_len(), 0);
    // Its token's figures against this deployment would mean nothing: none are given.
    assert!(refused["lag_seconds"].is_null(), "{refused}");
    assert!(refused["oplog_margin_seconds"].is_null(), "{refused}");
    // status refuses it as run does: its token's lag against this deployment would mean nothing.
    support::refused(
        &live.operator(&["status", "--json"]),
        4,
        "belongs to a sharded cluster, and this deployment is a replica set",
    );
    // The list of every consumer shows it, its figures unknown.
    let all = live.operator(&["status", "--all", "--json"]);
    assert!(all.status.success(), "{}", support::stderr(&all));
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).expect("json");
    let listed = &all["consumers"][0];
    assert_eq!(listed["consumer"], CONSUMER, "{all}");
    assert!(listed["lag_seconds"].is_null(), "{all}");
    assert!(listed["checkpoint_cluster_time"].is_null(), "{all}");
    assert!(all["consumers"][0]["cluster_time"].is_object(), "{all}");
}

#[test]
fn status_backfill_reconcile_reset_and_record_work_through_mongos() {
    let live = Live::sharded(2);
    insert(&live, 0..30);
    // backfill: a new consumer's snapshot of every shard's documents, then its changes.
    let backfill = support::handoff()
        .arg("backfill")
        .args(["--reason", "initial load", "--json"])
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .output()
        .expect("backfill");
    let report = support::json_stdout(&backfill);
    assert_eq!(live.outbox_len(), 30, "{report}");
    assert_eq!(shards_of(&live, &live.outbox()), BTreeSet::from([0, 1]));
    live.wait(
        live.coll("orders")
            .update_one(doc! {"_id": 3}, doc! {"$set": {"v": 1}}),
    )
    .expect("update");
    live.wait(live.coll("orders").delete_one(doc! {"_id": 4}))
        .expect("delete");
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 2);

    // reconcile: the outbox describes every shard's documents.
    let reconcile = live.operator(&["reconcile", "--json"]);
    let found = support::json_stdout(&reconcile);
    for kind in ["missing", "orphan", "stale"] {
        assert_eq!(found[kind]["count"], 0, "{found}");
    }

    // status: the position through mongos; the margin is unknown unless the shards' own oplogs
    // may be read (below).
    let status = support::json_stdout(&live.operator(&["status", "--json"]));
    assert_eq!(status["checkpoint"]["has_token"], true, "{status}");
    assert!(status["cluster_time"].is_object(), "{status}");
    assert!(status["oplog_margin_seconds"].is_null(), "{status}");
    let status = support::json_stdout(&live.operator(&["status", "--json", "--shard-oplogs"]));
    assert!(status["oplog_margin_seconds"].is_i64(), "{status}");

    // checkpoint reset --to now: moved through mongos, audited.
    insert(&live, 100..103);
    let reset = live.operator(&["checkpoint", "reset", "--to", "now", "--reason", "skip"]);
    assert_eq!(reset.status.code(), Some(0), "{}", support::stderr(&reset));
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 0);

    // record: the recording names the cluster.
    let dir = tempfile::tempdir().expect("a folder");
    let path = dir.path().join("cluster.jsonl");
    let mut recording = support::handoff()
        .args(["record", "--max-wait-seconds", "2", "--out"])
        .arg(&path)
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .env("HANDOFF_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("record");
    // The recording opens its stream from now: write once it has.
    let mut log = std::io::BufReader::new(recording.stderr.take().expect("stderr"));
    support::engines::read_until(&mut log, "recording");
    insert(&live, 200..203);
    assert!(recording.wait().expect("record ends").success());
    let text = std::fs::read_to_string(&path).expect("the recording");
    let first: serde_json::Value =
        serde_json::from_str(text.lines().next().expect("a first line")).expect("JSON");
    assert_eq!(
        first["$deployment"]["clusterId"],
        live.server().cluster_id().to_hex(),
        "{first}"
    );
    assert!(first["$deployment"].get("replicaSetId").is_none());
    let events = text
        .lines()
        .filter(|l| l.contains("\"operationType\""))
        .count();
    assert_eq!(events, 3, "{text}");
}

/// `handoff run --follow` through the cluster's mongos, its log piped.
fn follow(live: &Live) -> Child {
    live.command()
        .arg("--follow")
        .env("MAX_EVENTS", "5")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn handoff")
}

#[test]
fn sigkills_during_live_hand_off_from_every_shard_and_of_multi_shard_transactions_lose_nothing() {
    let seed = support::seed("HANDOFF_SHARDED_SEED");
    eprintln!("HANDOFF_SHARDED_SEED={seed}");
    let mut rng = Rng::new(seed ^ 0x5a4d);
    let live = Live::sharded(2);
    live.start_consumer();
    const KEYS: i32 = 30;
    const STEPS: i32 = 150;
    // Inserts, then updates with a rising `v`; every tenth step a transaction updating three keys
    // (on both shards, most of the time) and inserting one.
    let writer = live.background(async move |client, db| {
        let mut rng = Rng::new(seed ^ 0x7e57);
        let orders = db.collection::<Document>("orders");
        let mut writes = 0;
        for key in 0..KEYS {
            orders
                .insert_one(doc! {"_id": key, "v": 0})
                .await
                .expect("insert");
            writes += 1;
        }
        let mut v = 0;
        for step in 0..STEPS {
            if step % 10 == 9 {
                let mut session = client.start_session().await.expect("session");
                session.start_transaction().await.expect("start");
                for k in 0..3 {
                    v += 1;
                    orders
                        .update_one(doc! {"_id": (step + k * 7) % KEYS}, doc! {"$set": {"v": v}})
                        .session(&mut session)
                        .await
                        .expect("update in the transaction");
                }
                orders
                    .insert_one(doc! {"_id": 1000 + step, "v": 0})
                    .session(&mut session)
                    .await
                    .expect("insert in the transaction");
                session.commit_transaction().await.expect("commit");
                writes += 4;
            } else {
                v += 1;
                let key = rng.below(KEYS as u64) as i32;
                orders
                    .update_one(doc! {"_id": key}, doc! {"$set": {"v": v}})
                    .await
                    .expect("update");
                writes += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
        }
        writes
    });
    let mut kills = 0;
    let mut run = follow(&live);
    while !writer.is_finished() || kills < 8 {
        std::thread::sleep(Duration::from_millis(150 + rng.below(400)));
        if run.try_wait().expect("try_wait").is_none() {
            run.kill().expect("SIGKILL");
            kills += 1;
        }
        let _ = run.wait();
        live.expire_lease();
        run = follow(&live);
    }
    let expected = writer.join().expect("writer");
    // A run started right after a kill can find the killed one's transaction still open (exit
    // 10): started again, as an engine's retry does, until every write is handed off.
    let deadline = Instant::now() + Duration::from_secs(90);
    while live.outbox_len() < expected {
        assert!(Instant::now() < deadline, "never caught up (seed {seed})");
        if let Some(status) = run.try_wait().expect("try_wait") {
            assert_eq!(status.code(), Some(10), "seed {seed}");
            run = follow(&live);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    partitions::claimed(&live, CONSUMER);
    support::sigterm(&run);
    let output = run.wait_with_output().expect("output");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        support::stderr(&output)
    );
    let outbox = live.outbox();
    // Every write once, each document's changes in the order written (one consumer: one
    // "partition").
    partitions::check_partitioned(&outbox, expected, 1, seed);
    assert_eq!(shards_of(&live, &outbox), BTreeSet::from([0, 1]));
    // Each transaction's four records were committed together: next to each other in the
    // outbox, in the order the transaction wrote them.
    let transaction_inserts: Vec<usize> = outbox
        .iter()
        .enumerate()
        .filter(|(_, r)| key_of(r) >= 1000)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(transaction_inserts.len(), (STEPS / 10) as usize);
    for at in transaction_inserts {
        let ids: Vec<Option<&Bson>> = outbox[at - 3..=at]
            .iter()
            .map(|r| {
                r.get_document("event")
                    .ok()
                    .and_then(|e| e.get_document("lsid").ok())
                    .and_then(|l| l.get("id"))
            })
            .collect();
        assert!(ids[0].is_some(), "a transaction's events carry its lsid");
        assert!(
            ids.windows(2).all(|w| w[0] == w[1]),
            "a transaction's records together (seed {seed})"
        );
    }
    eprintln!(
        "{expected} writes on 2 shards ({} transactions across shards), {kills} SIGKILLs of \
         follow runs through mongos: every write once, in order, transactions whole",
        STEPS / 10
    );
}

#[test]
fn partitions_through_mongos_hand_off_every_event_once() {
    let seed = support::seed("HANDOFF_SHARDED_SEED");
    let live = Live::sharded(3);
    let consumers: Vec<String> = (0..3).map(|i| format!("orders-{i}-of-3")).collect();
    let run_each = || -> Vec<serde_json::Value> {
        consumers
            .iter()
            .enumerate()
            .map(|(i, consumer)| {
                let out = live
                    .command()
                    .args(["--partition", &format!("{i}/3")])
                    .env("CONSUMER_ID", consumer)
                    .output()
                    .expect("run");
                support::ok(&out)
            })
            .collect()
    };
    for out in run_each() {
        assert_eq!(out["status"], "IDLE");
    }
    partitions::started(&live, &consumers);
    let writer = live.background(async move |_, db| partitions::write_keys(db, 30, 90, seed).await);
    let expected = writer.join().expect("writer");
    run_each();
    partitions::check_partitioned(&live.outbox(), expected, 3, seed);
    assert_eq!(shards_of(&live, &live.outbox()), BTreeSet::from([0, 1, 2]));
}

/// The time of the oldest entry of shard `i`'s own oplog, read on the shard.
fn oldest_on_shard(live: &Live, i: usize) -> u32 {
    let uri = live.server().shard_uri(i).expect("a shard's own address");
    live.rt.block_on(async {
        let shard = mongodb::Client::with_uri_str(&uri).await.expect("client");
        let entry = shard
            .database("local")
            .collection::<Document>("oplog.rs")
            .find_one(doc! {})
            .await
            .expect("the shard's oplog")
            .expect("an entry");
        entry.get_timestamp("ts").expect("ts").time
    })
}

#[test]
fn status_takes_the_smallest_margin_of_the_shards_own_oplogs() {
    // Five entries of history per shard: a shard written to more forgets sooner.
    let live = Live::with_config(mongo_sim::Config {
        shards: 2,
        history_limit: 5,
        noop_interval: Duration::from_millis(20),
        ..mongo_sim::Config::default()
    });
    live.admin(doc! {"enableSharding": &live.db});
    live.admin(doc! {"shardCollection": format!("{}.orders", live.db), "key": {"_id": "hashed"}});
    live.start_consumer();
    std::thread::sleep(Duration::from_millis(1_100));
    // Ten writes on shard 1 only: it forgets the consumer's position, shard 0 still holds it.
    let ns = format!("{}.orders", live.db);
    let on_shard_1: Vec<i32> = (0..)
        .filter(|id| live.server().shard_of(&ns, &doc! {"_id": id}) == 1)
        .take(10)
        .collect();
    for id in &on_shard_1 {
        live.wait(live.coll("orders").insert_one(doc! {"_id": id}))
            .expect("insert");
    }
    let (first, second) = (oldest_on_shard(&live, 0), oldest_on_shard(&live, 1));
    assert!(first < second, "shard 1 forgot more: {first} {second}");
    let status = support::json_stdout(&live.operator(&["status", "--json", "--shard-oplogs"]));
    assert_eq!(status["oldest_oplog_time"]["t"], second, "{status}");
    let checkpoint = status["checkpoint_cluster_time"]["t"]
        .as_i64()
        .expect("the checkpoint's time");
    let margin = status["oplog_margin_seconds"].as_i64().expect("a margin");
    assert_eq!(margin, checkpoint - i64::from(second), "{status}");
    assert!(margin < 0, "the position is lost on shard 1: {status}");
    // The run agrees: history lost (exit 6), nothing handed off.
    support::fails(&live.run(&[]), 6, "");
    assert_eq!(live.outbox_len(), 0);
}

/// A cluster whose `orders` keeps pre- and post-images, sharded by a hashed `_id`.
fn sharded_with_images(config: mongo_sim::Config) -> Live {
    let live = Live::with_config(mongo_sim::Config {
        shards: 2,
        noop_interval: Duration::from_millis(20),
        ..config
    });
    live.wait(
        live.client.database(&live.db).run_command(
            doc! {"create": "orders", "changeStreamPreAndPostImages": {"enabled": true}},
        ),
    )
    .expect("create");
    live.admin(doc! {"enableSharding": &live.db});
    live.admin(doc! {"shardCollection": format!("{}.orders", live.db), "key": {"_id": "hashed"}});
    live
}

#[test]
fn images_and_the_database_scope_work_through_mongos() {
    let live = sharded_with_images(mongo_sim::Config::default());
    let images = [
        "--full-document",
        "required",
        "--full-document-before-change",
        "required",
    ];
    support::ok(&live.run(&images));
    insert(&live, 0..6);
    update(&live, 0..6);
    assert_eq!(support::ok(&live.run(&images))["events_handed_off"], 12);
    let updates: Vec<Document> = live
        .outbox()
        .iter()
        .map(|r| r.get_document("event").expect("event").clone())
        .filter(|e| e.get_str("operationType").ok() == Some("update"))
        .collect();
    assert_eq!(updates.len(), 6);
    for event in &updates {
        let id = event
            .get_document("documentKey")
            .and_then(|k| k.get_i32("_id"))
            .expect("documentKey._id");
        assert_eq!(
            event.get_document("fullDocumentBeforeChange").ok(),
            Some(&doc! {"_id": id, "v": 0})
        );
        assert_eq!(
            event.get_document("fullDocument").ok(),
            Some(&doc! {"_id": id, "v": 1})
        );
    }
    assert_eq!(shards_of(&live, &live.outbox()), BTreeSet::from([0, 1]));

    // The database scope: the sharded collection's events and an unsharded one's, merged.
    let scope = ["--scope", "database", "--consumer-id", "shop-wide"];
    support::ok(&live.run(&scope));
    insert(&live, 10..14);
    live.wait(live.coll("payments").insert_one(doc! {"_id": "p1"}))
        .expect("insert a payment");
    insert(&live, 14..16);
    let out = support::ok(&live.run(&scope));
    assert_eq!(out["events_handed_off"], 7, "{out}");
    let namespaces: Vec<String> = live
        .outbox()
        .iter()
        .filter(|r| r.get_str("consumer").ok() == Some("shop-wide"))
        .map(|r| {
            let event = r.get_document("event").expect("event");
            let ns = event.get_document("ns").expect("ns");
            ns.get_str("coll").expect("coll").to_string()
        })
        .collect();
    assert_eq!(
        namespaces,
        [
            "orders", "orders", "orders", "orders", "payments", "orders", "orders"
        ]
    );
}

#[test]
fn lost_history_on_every_shard_is_recovered_through_mongos_with_nothing_missing() {
    // Forty entries of history per shard.
    let live = Live::with_config(mongo_sim::Config {
        shards: 2,
        history_limit: 40,
        noop_interval: Duration::from_millis(20),
        transaction_lifetime: Duration::from_secs(2),
        ..mongo_sim::Config::default()
    });
    live.admin(doc! {"enableSharding": &live.db});
    live.admin(doc! {"shardCollection": format!("{}.orders", live.db), "key": {"_id": "hashed"}});
    live.start_consumer();
    insert(&live, 0..10);
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 10);
    // Two hundred writes while no run reads: both shards forget past the checkpoint.
    let rows: Vec<Document> = (100..300).map(|id| doc! {"_id": id, "v": 0}).collect();
    live.wait(live.coll("orders").insert_many(rows))
        .expect("insert");
    // Most of them gone again: the repair has little to write (an outbox on the primary shard
    // writes into that shard's history too).
    live.wait(live.coll("orders").delete_many(doc! {"_id": {"$gte": 105}}))
        .expect("delete");
    update(&live, 0..5);
    support::fails(&live.run(&[]), 6, "");
    let recovered = support::json_stdout(&live.operator(&[
        "recover",
        "--reason",
        "INC-1: both shards forgot",
        "--json",
    ]));
    assert_eq!(recovered["applied"], true, "{recovered}");
    let missing = recovered["repair"]["missing"]
        .as_u64()
        .expect("the repair's count");
    let stale = recovered["repair"]["stale"]
        .as_u64()
        .expect("the repair's count");
    assert_eq!((missing, stale), (5, 5), "{recovered}");
    support::ok(&live.run(&[]));
    let check = live.operator(&["reconcile", "--json"]);
    let found = support::json_stdout(&check);
    for kind in ["missing", "orphan", "stale"] {
        assert_eq!(found[kind]["count"], 0, "{found}");
    }
}

#[test]
fn the_window_is_unknown_unless_every_shard_answers() {
    let live = Live::sharded(2);
    live.start_consumer();
    insert(&live, 0..10);
    support::ok(&live.run(&[]));
    let margin = |live: &Live| {
        support::json_stdout(&live.operator(&["status", "--json", "--shard-oplogs"]))
            ["oplog_margin_seconds"]
            .clone()
    };
    assert!(margin(&live).is_i64());
    // Shard 1 refuses reads of its oplog (its own fail point; the mongos and shard 0 serve).
    let uri = live.server().shard_uri(1).expect("a shard's own address");
    let shard = live
        .wait(mongodb::Client::with_uri_str(&uri))
        .expect("client");
    let fail_point = |mode: Bson| {
        live.wait(shard.database("admin").run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": mode,
            "data": {"failCommands": ["find"], "errorCode": 13},
        }))
        .expect("configureFailPoint on the shard")
    };
    fail_point("alwaysOn".into());
    let status = support::json_stdout(&live.operator(&["status", "--json", "--shard-oplogs"]));
    assert!(status["oplog_margin_seconds"].is_null(), "{status}");
    assert!(status["oldest_oplog_time"].is_null(), "{status}");
    // The rest of the position stands.
    assert!(status["cluster_time"].is_object(), "{status}");
    assert_eq!(support::ok(&live.run(&[]))["status"], "IDLE");
    // A shard that does not answer within the figures' bound: the run's lag stays known.
    fail_point("off".into());
    live.wait(shard.database("admin").run_command(doc! {
        "configureFailPoint": "failCommand",
        "mode": "alwaysOn",
        "data": {"failCommands": ["find"], "blockConnection": true, "blockTimeMS": 4000},
    }))
    .expect("configureFailPoint on the shard");
    insert(&live, 10..12);
    let outputs = support::ok(&live.run(&["--shard-oplogs"]));
    assert_eq!(outputs["events_handed_off"], 2, "{outputs}");
    assert!(outputs["oplog_margin_seconds"].is_null(), "{outputs}");
    assert!(outputs["lag_seconds"].is_i64(), "{outputs}");
    fail_point("off".into());
    assert!(margin(&live).is_i64());
}

#[test]
fn a_pipeline_and_the_deployment_scope_work_through_mongos() {
    let live = Live::sharded(2);
    let scratch = support::Scratch::new();
    let file = scratch.path("pipeline.json");
    std::fs::write(&file, r#"[{"$match": {"operationType": "update"}}]"#).expect("write");
    let file = file.to_str().expect("a path").to_string();
    let updates = ["--pipeline", &file, "--consumer-id", "updates"];
    let everything = ["--scope", "deployment", "--consumer-id", "everything"];
    support::ok(&live.run(&updates));
    support::ok(&live.run(&everything));
    insert(&live, 0..8);
    update(&live, 0..8);
    let other = live.client.database(&format!("{}_other", live.db));
    live.wait(
        other
            .collection::<Document>("things")
            .insert_one(doc! {"_id": 1}),
    )
    .expect("insert elsewhere");
    assert_eq!(support::ok(&live.run(&updates))["events_handed_off"], 8);
    assert_eq!(support::ok(&live.run(&everything))["events_handed_off"], 17);
    let of = |consumer: &str| -> Vec<Document> {
        live.outbox()
            .into_iter()
            .filter(|r| r.get_str("consumer").ok() == Some(consumer))
            .collect()
    };
    let updated = of("updates");
    assert!(updated.iter().all(|r| {
        r.get_document("event")
            .and_then(|e| e.get_str("operationType"))
            .ok()
            == Some("update")
    }));
    assert_eq!(shards_of(&live, &updated), BTreeSet::from([0, 1]));
    let databases: BTreeSet<String> = of("everything")
        .iter()
        .map(|r| {
            r.get_document("event")
                .and_then(|e| e.get_document("ns"))
                .and_then(|ns| ns.get_str("db"))
                .expect("ns.db")
                .to_string()
        })
        .collect();
    assert_eq!(
        databases,
        BTreeSet::from([live.db.clone(), format!("{}_other", live.db)])
    );
}
