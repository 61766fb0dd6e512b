//! `handoff backfill`: the watched collection's existing documents handed off as snapshot
//! records beside `handoff run`, so that the outbox describes the source exactly: for every
//! document key, the record with the greatest position (cluster time, then token) holds the
//! document as it is (a delete, or no record at all, for a document that is gone).
//!
//! The big case writes, streams and kills the backfill at once; the kill moments are drawn from a
//! seeded generator whose seed is printed (`HANDOFF_BACKFILL_SEED=<seed>` replays it).

use crate::support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bson::{Bson, Document, doc};
use mongo_sim::Config;
use sha2::Digest as _;
use support::Rng;
use support::live::*;

const SIGNALS: &str = "kestra_change_signals";
const STATES: &str = "kestra_change_backfill";
const AUDIT: &str = "kestra_change_audit";

fn seed() -> u64 {
    support::seed("HANDOFF_BACKFILL_SEED")
}

/// A test server whose history holds everything these tests write.
fn server() -> Live {
    Live::with_config(Config {
        history_limit: 2_000_000,
        // A killed backfill's open transaction is ended soon after it blocks another write.
        transaction_lifetime: Duration::from_secs(3),
        ..Config::default()
    })
}

/// `handoff backfill` on the test's deployment and database, with a reason.
fn backfill(live: &Live, extra: &[&str]) -> Command {
    let mut command = support::handoff();
    command
        .arg("backfill")
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .args(["--reason", "initial load of the consumer"])
        .args(extra);
    command
}

/// A document key as a map key.
fn key_text(key: &Bson) -> String {
    handoff::domain::token::canonical_text(&doc! { "k": key.clone() })
}

/// Every document of the source, by key.
fn source(live: &Live) -> BTreeMap<String, Document> {
    live.records("orders")
        .into_iter()
        .map(|d| (key_text(d.get("_id").expect("_id")), d))
        .collect()
}

/// Where a record stands: cluster time (seconds, increment), then token `_data`.
type Position = (u32, u32, String);

/// What the outbox says each document is now: per key, the record of greatest position
/// (cluster time, then token `_data`); a delete, or a snapshot of nothing, means absent.
fn outbox_view(outbox: &[Document]) -> BTreeMap<String, Document> {
    let mut latest: HashMap<String, (Position, Option<Document>)> = HashMap::new();
    for record in outbox {
        assert_eq!(record.get_str("consumer").ok(), Some(CONSUMER));
        assert_eq!(record.get_str("source").ok(), Some("change_demo.orders"));
        let event = record
            .get_document("event")
            .expect("a record has its event");
        let ts = event.get_timestamp("clusterTime").expect("clusterTime");
        let data = event
            .get_document("_id")
            .expect("token")
            .get_str("_data")
            .expect("_data")
            .to_string();
        let key = event
            .get_document("documentKey")
            .expect("documentKey")
            .get("_id")
            .expect("key");
        let value = match event.get_str("operationType").expect("operationType") {
            "delete" => None,
            "insert" | "update" | "replace" | "snapshot" => match event.get("fullDocument") {
                Some(Bson::Document(d)) => Some(d.clone()),
                _ => None,
            },
            other => panic!("unexpected operation {other}"),
        };
        let position = (ts.time, ts.increment, data);
        let entry = latest
            .entry(key_text(key))
            .or_insert_with(|| (position.clone(), value.clone()));
        assert!(
            entry.0 != position || entry.1 == value,
            "two records at one position for one key"
        );
        if position > entry.0 {
            *entry = (position, value);
        }
    }
    latest
        .into_iter()
        .filter_map(|(key, (_, value))| value.map(|v| (key, v)))
        .collect()
}

/// Asserts the outbox describes the source exactly.
fn assert_outbox_describes_source(live: &Live) {
    let source = source(live);
    let view = outbox_view(&live.outbox());
    let missing: Vec<_> = source.keys().filter(|k| !view.contains_key(*k)).collect();
    let orphans: Vec<_> = view.keys().filter(|k| !source.contains_key(*k)).collect();
    let stale: Vec<_> = source
        .iter()
        .filter(|(k, d)| view.get(*k).is_some_and(|v| v != *d))
        .map(|(k, _)| k)
        .collect();
    assert!(
        missing.is_empty() && orphans.is_empty() && stale.is_empty(),
        "missing {} (e.g. {:?}), orphans {} (e.g. {:?}), stale {} (e.g. {:?})",
        missing.len(),
        missing.first(),
        orphans.len(),
        orphans.first(),
        stale.len(),
        stale.first()
    );
}

/// The snapshot records of the outbox.
fn snapshots(live: &Live) -> Vec<Document> {
    live.outbox()
        .into_iter()
        .filter(|r| r.contains_key("snapshot"))
        .collect()
}

fn state(live: &Live) -> Option<Document> {
    live.wait(live.coll(STATES).find_one(doc! { "_id": CONSUMER }))
        .expect("read state")
}

fn state_chunks(live: &Live) -> i64 {
    state(live).map_or(0, |s| s.get_i64("chunks").expect("chunks"))
}

fn audits(live: &Live) -> Vec<Document> {
    live.records(AUDIT)
}

/// Runs until a run hands off nothing: the stream is caught up.
fn catch_up(live: &Live) {
    for _ in 0..200 {
        let out = support::ok(&live.run(&[]));
        if out["events_handed_off"] == 0 {
            return;
        }
    }
    panic!("the runs never caught up");
}

#[test]
fn a_small_collection_is_backfilled_and_the_outbox_describes_it() {
    let live = server();
    live.wait(
        live.coll("orders").insert_many(
            (0..50)
                .map(|i| doc! { "_id": i, "qty": i * 2, "sku": format!("SKU-{i}") })
                .collect::<Vec<_>>(),
        ),
    )
    .expect("insert");
    // Keys of other types come after the numbers, in MongoDB's order.
    live.wait(live.coll("orders").insert_many([
        doc! { "_id": "b", "qty": 1 },
        doc! { "_id": "a", "qty": 2 },
        doc! { "_id": bson::oid::ObjectId::new(), "qty": 3 },
    ]))
    .expect("insert");
    // No run yet: the backfill starts the consumer's checkpoint itself.
    assert!(live.checkpoint().is_none());
    let summary = support::json_stdout(
        &backfill(&live, &["--chunk-size", "20", "--json"])
            .output()
            .expect("backfill"),
    );
    assert_eq!(summary["done"], true);
    assert_eq!(summary["chunks"], 4);
    assert_eq!(summary["rows"], 53);
    assert_eq!(summary["dropped"], 0);
    assert_eq!(summary["checkpoint_created"], true);
    assert!(summary["elapsed_seconds"].as_f64().is_some());

    let checkpoint = live.checkpoint().expect("a checkpoint");
    assert_eq!(checkpoint.get_str("mode").ok(), Some("resumeAfter"));
    assert_eq!(
        checkpoint.get_str("source").ok(),
        Some("change_demo.orders")
    );
    assert!(checkpoint.get_document("token").is_ok());

    let records = snapshots(&live);
    assert_eq!(records.len(), 53);
    let ids: HashSet<&str> = records.iter().map(|r| r.get_str("_id").unwrap()).collect();
    assert_eq!(ids.len(), 53);
    for record in &records {
        let event = record.get_document("event").unwrap();
        assert_eq!(event.get_str("operationType").ok(), Some("snapshot"));
        assert_eq!(
            event.get_document("ns").unwrap(),
            &doc! { "db": "change_demo", "coll": "orders" }
        );
        let token = event.get_document("_id").unwrap();
        assert_eq!(
            handoff::domain::token::cluster_time(token),
            Some(event.get_timestamp("clusterTime").unwrap()),
            "the position token and the cluster time agree"
        );
        let key = event
            .get_document("documentKey")
            .unwrap()
            .get("_id")
            .unwrap();
        // The token is the position's plus the document's namespace and key; the default
        // policy's ID is its SHA-256, as for any event.
        assert_eq!(
            token.get_document("snapshot").unwrap(),
            &doc! { "ns": "change_demo.orders", "_id": key.clone() }
        );
        let id = hex::encode(sha2::Sha256::digest(
            handoff::domain::token::canonical_text(token).as_bytes(),
        ));
        assert_eq!(record.get_str("_id").unwrap(), format!("{CONSUMER}/{id}"));
        assert_eq!(
            record
                .get_document("snapshot")
                .unwrap()
                .get_str("command")
                .ok(),
            Some("backfill")
        );
    }
    assert_outbox_describes_source(&live);

    let saved = state(&live).expect("a state document");
    assert_eq!(saved.get_bool("done").ok(), Some(true));
    assert_eq!(saved.get_i64("chunks").ok(), Some(4));
    assert_eq!(saved.get_i64("rows").ok(), Some(53));
    assert!(
        matches!(saved.get("last_key"), Some(Bson::ObjectId(_))),
        "the last key is the greatest: {saved}"
    );
    let audit = audits(&live);
    assert_eq!(audit.len(), 1, "one audit record per backfill invocation");
    assert_eq!(
        audit[0].get_str("reason").ok(),
        Some("initial load of the consumer")
    );
    assert_eq!(audit[0].get_str("consumer").ok(), Some(CONSUMER));
    assert_eq!(audit[0].get("from"), Some(&Bson::Null));
    assert_eq!(
        audit[0]
            .get_document("evidence")
            .unwrap()
            .get_str("action")
            .ok(),
        Some("start")
    );
    // The watermarks are gone once their chunks are committed.
    assert!(live.records(SIGNALS).is_empty());

    // The regular runs continue from the checkpoint the backfill started: later changes are
    // handed off over the snapshot.
    live.wait(
        live.coll("orders")
            .update_one(doc! { "_id": 3 }, doc! { "$set": { "qty": -1 } }),
    )
    .expect("update");
    live.wait(live.coll("orders").delete_one(doc! { "_id": 4 }))
        .expect("delete");
    let out = support::ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 2);
    assert_outbox_describes_source(&live);

    // Done is done: a second invocation changes nothing.
    let before = live.outbox_len();
    let again = support::json_stdout(&backfill(&live, &["--json"]).output().expect("backfill"));
    assert_eq!(again["already_done"], true);
    let human = backfill(&live, &[]).output().expect("backfill");
    assert_eq!(human.status.code(), Some(0));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("already done"), "{text}");
    assert!(
        text.contains("chunks 4, documents decided by the policy 53"),
        "{text}"
    );
    assert_eq!(live.outbox_len(), before);
    assert_eq!(audits(&live).len(), 1);
}

#[test]
fn a_killed_backfill_resumes_without_redoing_finished_chunks_and_restart_starts_over() {
    let live = server();
    live.wait(
        live.coll("orders").insert_many(
            (0..200)
                .map(|i| doc! { "_id": i, "qty": i })
                .collect::<Vec<_>>(),
        ),
    )
    .expect("insert");
    let mut child = backfill(&live, &["--chunk-size", "10", "--max-rate", "40", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn backfill");
    while state_chunks(&live) < 3 {
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "the throttled backfill ended before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    // (A commit the killed process sent may still land: the state is read on both sides of
    // the outbox until it holds still.)
    let (at_kill, records) = loop {
        let before = state_chunks(&live);
        let records = snapshots(&live).len() as i64;
        if state_chunks(&live) == before {
            break (before, records);
        }
    };
    assert!((3..20).contains(&at_kill), "{at_kill}");
    assert_eq!(records, at_kill * 10);

    let resumed = support::json_stdout(
        &backfill(&live, &["--chunk-size", "10", "--json"])
            .output()
            .expect("backfill"),
    );
    assert_eq!(resumed["done"], true);
    assert_eq!(resumed["resumed"], true);
    assert_eq!(resumed["chunks"], 20);
    assert_eq!(resumed["this_run"]["chunks"], 20 - at_kill);
    assert_eq!(resumed["rows"], 200);
    // Every document has exactly one snapshot record: no chunk was handed off twice.
    let records = snapshots(&live);
    assert_eq!(records.len(), 200);
    let keys: HashSet<String> = records
        .iter()
        .map(|r| {
            key_text(
                r.get_document("event")
                    .unwrap()
                    .get_document("documentKey")
                    .unwrap()
                    .get("_id")
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(keys.len(), 200);
    assert_outbox_describes_source(&live);
    let audit = audits(&live);
    assert_eq!(audit.len(), 2, "the start and the resume");
    let resume = &audit[1];
    assert_eq!(
        resume
            .get_document("evidence")
            .unwrap()
            .get_str("action")
            .ok(),
        Some("resume")
    );
    assert_eq!(
        resume.get_document("from").unwrap().get_i64("chunks").ok(),
        Some(at_kill)
    );

    // --restart starts over, audited: new snapshot records at new positions, which still
    // describe the source.
    live.wait(
        live.coll("orders")
            .update_one(doc! { "_id": 7 }, doc! { "$set": { "qty": 700 } }),
    )
    .expect("update");
    let restarted = support::json_stdout(
        &backfill(&live, &["--chunk-size", "50", "--restart", "--json"])
            .output()
            .expect("backfill"),
    );
    assert_eq!(restarted["restarted"], true);
    assert_eq!(restarted["chunks"], 4);
    assert_eq!(restarted["rows"], 200);
    assert_eq!(snapshots(&live).len(), 400);
    let audit = audits(&live);
    assert_eq!(audit.len(), 3);
    assert_eq!(
        audit[2]
            .get_document("evidence")
            .unwrap()
            .get_str("action")
            .ok(),
        Some("restart")
    );
    assert!(audit[2].get_str("command").unwrap().contains("--restart"));
    assert_outbox_describes_source(&live);
}

#[test]
fn bad_input_writes_nothing() {
    let live = server();
    let refused: &[&[&str]] = &[
        &["--chunk-size", "0"],
        &["--chunk-size", "many"],
        &["--max-rate", "0"],
        &["--signal-collection", "orders"],
        &["--state-collection", "kestra_change_outbox"],
        &["--consumer-id", "1-starts-with-a-digit"],
        &["--collection", "a.b"],
        &["--watermark-timeout-seconds", "0"],
        &["--reason", "   "],
        &["--reason", "line\nbreak"],
        // A parameter the policy does not read (the default reads none).
        &["--policy-param", "batch_size=3"],
    ];
    for extra in refused {
        let out = backfill(&live, extra).output().expect("backfill");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{extra:?}: {}",
            support::stderr(&out)
        );
    }
    // Without a reason, and with a URI that is not one.
    let out = support::handoff()
        .arg("backfill")
        .env("MONGODB_URI", live.uri())
        .output()
        .expect("backfill");
    assert_eq!(out.status.code(), Some(2));
    let out = support::handoff()
        .args([
            "backfill",
            "--reason",
            "r",
            "--uri",
            "http://user:secret@example",
        ])
        .output()
        .expect("backfill");
    assert_eq!(out.status.code(), Some(2));
    assert!(!support::stderr(&out).contains("secret"));
    assert!(
        live.user_databases().is_empty(),
        "{:?}",
        live.user_databases()
    );
}

/// The source's keys: 0..INITIAL at first, the writer adds keys up to KEY_SPACE.
const INITIAL: i32 = 10_000;
const KEY_SPACE: i32 = 12_000;

/// Inserts, updates and deletes until told to stop; returns how many operations it made.
async fn write_continuously(db: mongodb::Database, seed: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut rng = Rng::new(seed ^ 0x0b5e55ed);
    let orders = db.collection::<Document>("orders");
    let states = db.collection::<Document>(STATES);
    let mut ops = 0;
    let mut focus = 0;
    while !stop.load(Ordering::Relaxed) {
        // Half the writes go just past the backfill's position: into the chunk it reads.
        if ops % 20 == 0 {
            let saved = states
                .find_one(doc! { "_id": CONSUMER })
                .await
                .expect("read the backfill state");
            focus = saved.and_then(|s| s.get_i32("last_key").ok()).unwrap_or(-1);
        }
        let key = if rng.below(2) == 0 {
            focus + 1 + rng.below(500) as i32
        } else {
            rng.below(KEY_SPACE as u64) as i32
        };
        let result = match rng.below(10) {
            0..=3 => orders
                .update_one(
                    doc! { "_id": key },
                    doc! { "$inc": { "qty": 1 }, "$set": { "touched": ops as i64 } },
                )
                .await
                .map(|_| ()),
            4..=5 => orders.delete_one(doc! { "_id": key }).await.map(|_| ()),
            6..=7 => orders
                .replace_one(
                    doc! { "_id": key },
                    doc! { "_id": key, "qty": -(ops as i64), "replaced": true },
                )
                .upsert(true)
                .await
                .map(|_| ()),
            _ => match orders
                .insert_one(doc! { "_id": key, "qty": 0, "new": true })
                .await
            {
                // The key exists: nothing changed.
                Err(e) if duplicate_key(&e) => Ok(()),
                other => other.map(|_| ()),
            },
        };
        result.expect("a write of the writer");
        ops += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    ops
}

fn duplicate_key(error: &mongodb::error::Error) -> bool {
    matches!(
        error.kind.as_ref(),
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) if w.code == 11000
    )
}

/// `handoff run` over and over until told to stop, counting the runs in `runs`.
fn run_continuously(live_uri: String, db: String, stop: Arc<AtomicBool>, runs: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        let out = support::handoff()
            .arg("run")
            .env("MONGODB_URI", &live_uri)
            .env("SOURCE_DATABASE", &db)
            .env("MAX_WAIT_SECONDS", "1")
            .env("MAX_EVENTS", "100")
            .output()
            .expect("run handoff");
        // A run that lost the race for a fresh checkpoint to the backfill (3) retries.
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "run: {}",
            support::stderr(&out)
        );
        runs.fetch_add(1, Ordering::Relaxed);
    }
}

fn spawn_backfill(live: &Live) -> Child {
    backfill(
        live,
        &["--chunk-size", "500", "--max-rate", "1000", "--json"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn backfill")
}

#[test]
fn ten_thousand_documents_under_writes_runs_and_kills_end_described_exactly() {
    let seed = seed();
    println!("HANDOFF_BACKFILL_SEED={seed}");
    let mut rng = Rng::new(seed);
    let clock = std::time::Instant::now();
    let live = server();
    for start in (0..INITIAL).step_by(1000) {
        live.wait(
            live.coll("orders").insert_many(
                (start..start + 1000)
                    .map(|i| doc! { "_id": i, "qty": i, "sku": format!("SKU-{i}") })
                    .collect::<Vec<_>>(),
            ),
        )
        .expect("insert");
    }
    let stop_writer = Arc::new(AtomicBool::new(false));
    let stop_runs = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU64::new(0));
    let writer = {
        let stop = stop_writer.clone();
        live.background(async move |_, db| write_continuously(db, seed, stop).await)
    };
    let runner = {
        let (uri, db, stop, runs) = (live.uri(), live.db.clone(), stop_runs.clone(), runs.clone());
        std::thread::spawn(move || run_continuously(uri, db, stop, runs))
    };

    let kills = 2 + rng.below(2);
    let mut killed = 0;
    let mut invocations = 0;
    let summary = loop {
        invocations += 1;
        assert!(invocations < 20, "the backfill never finished");
        let mut child = spawn_backfill(&live);
        if killed < kills {
            // A moment while it works: once it committed another chunk (or, the first time
            // sometimes, before its first), plus a random delay.
            let chunks = state_chunks(&live);
            let early = killed == 0 && rng.below(2) == 0;
            while !early
                && state_chunks(&live) == chunks
                && child.try_wait().expect("try_wait").is_none()
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(rng.below(400)));
            if child.try_wait().expect("try_wait").is_none() {
                child.kill().expect("SIGKILL");
                child.wait().expect("reaped");
                killed += 1;
                continue;
            }
        }
        let out = child.wait_with_output().expect("backfill");
        break support::json_stdout(&out);
    };
    println!(
        "backfill invocations {invocations} done after {:?}: {summary}",
        clock.elapsed()
    );
    assert!(killed >= 2, "only {killed} kills landed");
    assert_eq!(summary["done"], true);
    // About 10,000 documents (the writer deletes and inserts) in chunks of 500.
    assert!(summary["chunks"].as_i64().unwrap() >= 15, "{summary}");

    stop_writer.store(true, Ordering::Relaxed);
    let ops = writer.join().expect("writer");
    // The runs go on until a few of them have ended since the backfill's (they streamed
    // beside it, and now catch up with the writer's last changes).
    let ended = runs.load(Ordering::Relaxed);
    while runs.load(Ordering::Relaxed) < ended + 2 {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_runs.store(true, Ordering::Relaxed);
    runner.join().expect("runner");
    let runs = runs.load(Ordering::Relaxed);
    println!("writer operations {ops}, runs {runs}, kills {killed}, summary {summary}");
    assert!(ops > 0);
    catch_up(&live);
    println!("caught up after {:?}", clock.elapsed());

    assert_outbox_describes_source(&live);
    // And `reconcile` says the same: nothing missing, orphan or stale, nothing in flight.
    let reconciled = support::handoff()
        .args(["reconcile", "--json", "--chunk-size", "700"])
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .output()
        .expect("run handoff reconcile");
    let report = support::json_stdout(&reconciled);
    for kind in ["missing", "orphan", "stale"] {
        assert_eq!(report[kind]["count"], 0, "{kind}: {report}");
    }
    assert_eq!(report["in_flight"]["count"], 0, "{report}");
    assert!(report["checked"].as_u64().unwrap_or(0) > 9_000, "{report}");
    // No change event handed off twice, and no snapshot record for one key at one position
    // twice (ids of regular records are their event's; of snapshots, their key and position).
    let outbox = live.outbox();
    let events: Vec<Document> = outbox
        .iter()
        .filter(|r| !r.contains_key("snapshot"))
        .cloned()
        .collect();
    support::live::outbox_event_ids(&events);
    let mut seen = HashSet::new();
    for record in outbox.iter().filter(|r| r.contains_key("snapshot")) {
        let event = record.get_document("event").unwrap();
        let key = key_text(
            event
                .get_document("documentKey")
                .unwrap()
                .get("_id")
                .unwrap(),
        );
        let at = event.get_document("_id").unwrap().get_str("_data").unwrap();
        assert!(seen.insert((key, at.to_string())), "a snapshot twice");
    }
    let saved = state(&live).expect("state");
    assert_eq!(saved.get_bool("done").ok(), Some(true));
    assert!(!audits(&live).is_empty());
    assert!(
        audits(&live)
            .iter()
            .all(|a| a.get_str("reason").ok() == Some("initial load of the consumer"))
    );
    // The documents the backfill read and did not hand off were superseded by stream events.
    let read = summary["rows"].as_i64().unwrap() + summary["dropped"].as_i64().unwrap();
    assert!(read >= i64::from(INITIAL) / 2, "{summary}");
}

#[test]
fn a_checkpoint_of_another_source_is_refused_and_nothing_is_written() {
    let live = server();
    live.insert(0..5);
    let foreign = doc! {
        "_id": CONSUMER,
        "source": "change_demo.invoices",
        "replicaSetId": live.replica_set_id(),
        "token": Bson::Null,
        "mode": "resumeAfter",
    };
    live.wait(live.coll(CHECKPOINTS).insert_one(foreign.clone()))
        .expect("insert checkpoint");
    let out = backfill(&live, &[]).output().expect("backfill");
    assert_eq!(out.status.code(), Some(4), "{}", support::stderr(&out));
    assert!(
        support::stderr(&out).contains("another source"),
        "{}",
        support::stderr(&out)
    );
    assert_eq!(live.checkpoint(), Some(foreign));
    assert_eq!(live.outbox_len(), 0);
    assert!(state(&live).is_none());
    assert!(audits(&live).is_empty());
    assert!(live.records(SIGNALS).is_empty());
}

#[test]
fn a_watermark_not_seen_in_time_fails_the_chunk_and_commits_nothing() {
    let live = server();
    live.insert(0..30);
    // The change stream's getMore answers late: the watermarks cannot be seen in time.
    live.fail_point(
        Bson::String("alwaysOn".into()),
        doc! { "failCommands": ["getMore"], "blockConnection": true, "blockTimeMS": 2500 },
    );
    let out = backfill(
        &live,
        &["--chunk-size", "10", "--watermark-timeout-seconds", "1"],
    )
    .output()
    .expect("backfill");
    assert_eq!(out.status.code(), Some(10), "{}", support::stderr(&out));
    assert!(
        support::stderr(&out).contains("watermark of chunk 1 was not seen"),
        "{}",
        support::stderr(&out)
    );
    assert_eq!(live.outbox_len(), 0);
    assert!(state(&live).is_none());
    assert!(audits(&live).is_empty());
    live.fail_point_off();
    // Once the stream answers again, the backfill goes through.
    let summary = support::json_stdout(
        &backfill(&live, &["--chunk-size", "10", "--json"])
            .output()
            .expect("backfill"),
    );
    assert_eq!(summary["done"], true);
    assert_eq!(summary["rows"], 30);
    assert_outbox_describes_source(&live);
}

#[test]
fn every_backfilled_document_is_one_the_consumers_policy_decided() {
    let live = server();
    live.wait(
        live.coll("orders").insert_many(
            (1..=5)
                .map(|i| doc! { "_id": i, "schemaVersion": 1, "total": i * 10 })
                .chain([doc! { "_id": 6, "schemaVersion": 99, "card": "4111111111111111" }]),
        ),
    )
    .expect("insert");

    // The quarantine policy quarantines the poison document, as its runs would.
    let summary = support::json_stdout(
        &backfill(
            &live,
            &["--policy", handoff_test_policies::QUARANTINE, "--json"],
        )
        .output()
        .expect("backfill"),
    );
    assert_eq!(summary["this_run"]["handed_off"], 5, "{summary}");
    assert_eq!(summary["this_run"]["quarantined"], 1, "{summary}");
    let outbox = snapshots(&live);
    assert_eq!(outbox.len(), 5);
    assert!(!format!("{outbox:?}").contains("4111111111111111"));
    let quarantine = live.records("kestra_change_quarantine");
    assert_eq!(quarantine.len(), 1);
    let held = quarantine[0].get_document("event").unwrap();
    assert_eq!(held.get_str("operationType").unwrap(), "snapshot");
    assert_eq!(
        held.get_document("documentKey").unwrap(),
        &doc! { "_id": 6 }
    );
    assert!(
        quarantine[0]
            .get_str("reason")
            .unwrap()
            .contains("schemaVersion 99")
    );

    // A domain-events consumer gets typed records only, never raw change events.
    let typed = support::json_stdout(
        &backfill(
            &live,
            &[
                "--policy",
                handoff_test_policies::DOMAIN_EVENTS,
                "--consumer-id",
                "typed",
                "--outbox-collection",
                "typed_outbox",
                "--outbox-keep-event",
                "false",
                "--json",
            ],
        )
        .output()
        .expect("backfill"),
    );
    assert_eq!(typed["this_run"]["handed_off"], 6, "{typed}");
    let records = live.records("typed_outbox");
    assert_eq!(records.len(), 6);
    for record in &records {
        assert_eq!(record.get_str("eventType").unwrap(), "OrderSnapshot");
        assert!(record.get("event").is_none(), "{record}");
        let payload = record.get_document("payload").unwrap();
        assert!(payload.get("_id").is_none());
        assert!(payload.get("total").or(payload.get("card")).is_some());
    }

    // The consumer's runs decide with the quarantine policy (a commit of its decisions records
    // it): a backfill with another is refused.
    live.wait(
        live.coll("orders")
            .insert_one(doc! { "_id": 7, "schemaVersion": 1 }),
    )
    .expect("insert");
    support::ok(&live.run(&["--policy", handoff_test_policies::QUARANTINE]));
    let before = snapshots(&live).len();
    let out = backfill(&live, &["--restart"]).output().expect("backfill");
    support::refused(&out, 4, "the consumer's runs use");
    assert_eq!(snapshots(&live).len(), before);

    // A policy built before snapshot runs cannot say what a snapshot becomes: refused.
    let out = backfill(
        &live,
        &[
            "--policy",
            handoff_test_policies::LEGACY_V1_1,
            "--consumer-id",
            "legacy",
        ],
    )
    .output()
    .expect("backfill");
    support::refused(&out, 2, "contract 1.3.0 or later");
    assert!(
        live.records(STATES)
            .iter()
            .all(|s| s.get_str("_id").ok() != Some("legacy"))
    );
}

#[test]
fn a_hostile_policy_in_a_snapshot_run_writes_nothing() {
    let live = server();
    live.insert(1..30);
    for (policy, needle) in [
        (
            handoff_test_policies::SPIN_FOREVER,
            "without calling the host",
        ),
        (handoff_test_policies::FORGED_TOKEN, ""),
        (handoff_test_policies::HOARD, ""),
        (handoff_test_policies::HUGE_ID, ""),
        (handoff_test_policies::TRAP, "trapped"),
    ] {
        let out = backfill(
            &live,
            &["--policy", policy, "--policy-slice-ms", "200", "--json"],
        )
        .output()
        .expect("backfill");
        support::refused(&out, 9, needle);
        assert!(snapshots(&live).is_empty(), "{policy}");
        assert!(live.records("kestra_change_quarantine").is_empty());
        assert!(state(&live).is_none(), "{policy}");
        assert!(audits(&live).is_empty(), "{policy}");
    }
}
