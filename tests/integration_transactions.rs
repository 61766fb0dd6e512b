//! Source transactions handed off whole: the events one MongoDB transaction wrote reach the
//! outbox in one handoff transaction or not at all — under SIGKILLs, with a `max_events` far
//! smaller than the transactions, for every policy — while a reader polling the outbox never
//! sees part of one.

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use futures_util::TryStreamExt;
use mongodb::options::ReadConcern;
use support::Rng;
use support::live::*;

/// How many source transactions the writer commits.
const TRANSACTIONS: i32 = 40;
/// The largest of them, in inserts.
const LARGEST: u64 = 50;
/// The fewest kills the main test must survive.
const MIN_KILLS: u32 = 10;

/// Commits `sizes.len()` transactions, the k-th inserting `sizes[k]` documents
/// `{_id: "t<k>-<j>", txn: k, of: sizes[k]}` into `orders`, paced by `rng`; a single insert
/// outside any transaction after every fifth.
async fn write_transactions(
    client: mongodb::Client,
    db: mongodb::Database,
    sizes: Vec<u64>,
    seed: u64,
) -> usize {
    let mut rng = Rng::new(seed ^ 0x7a7a);
    let orders = db.collection::<Document>("orders");
    let mut events = 0;
    for (k, size) in sizes.iter().enumerate() {
        let mut session = client.start_session().await.expect("session");
        session.start_transaction().await.expect("start");
        for j in 0..*size {
            orders
                .insert_one(doc! {"_id": format!("t{k}-{j}"), "txn": k as i32, "of": *size as i64})
                .session(&mut session)
                .await
                .expect("insert in the transaction");
        }
        session.commit_transaction().await.expect("commit");
        events += *size as usize;
        if k % 5 == 4 {
            orders
                .insert_one(doc! {"_id": format!("single-{k}"), "txn": -1, "of": 1i64})
                .await
                .expect("insert");
            events += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(150))).await;
    }
    events
}

/// Each source transaction's records in `outbox` (by the inserted document's `txn`), with the
/// size it was written with: `(txn → (records, size))`. Singles (`txn: -1`) are left out.
fn transactions_in(outbox: &[Document]) -> BTreeMap<i32, (usize, i64)> {
    let mut seen: BTreeMap<i32, (usize, i64)> = BTreeMap::new();
    for record in outbox {
        let Ok(document) = record
            .get_document("event")
            .and_then(|e| e.get_document("fullDocument"))
        else {
            continue;
        };
        let (Ok(txn), Ok(of)) = (document.get_i32("txn"), document.get_i64("of")) else {
            continue;
        };
        if txn >= 0 {
            let entry = seen.entry(txn).or_insert((0, of));
            entry.0 += 1;
        }
    }
    seen
}

/// Polls the outbox (snapshot reads) until `stop`, recording every source transaction seen in
/// part; returns them and how many reads it made.
async fn read_until(db: mongodb::Database, stop: Arc<AtomicBool>) -> (Vec<String>, u32) {
    let outbox = db.collection::<Document>(OUTBOX);
    let (mut partial, mut reads) = (Vec::new(), 0);
    while !stop.load(Ordering::SeqCst) {
        let records: Vec<Document> = outbox
            .find(doc! {})
            .read_concern(ReadConcern::snapshot())
            .batch_size(100_000)
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("read the outbox");
        reads += 1;
        for (txn, (seen, of)) in transactions_in(&records) {
            if seen as i64 != of {
                partial.push(format!("transaction {txn}: {seen} of its {of} records"));
            }
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    (partial, reads)
}

/// A run of the consumer with a tiny `max_events`.
fn spawn(live: &Live, max_events: &str, extra: &[&str]) -> Child {
    live.command()
        .env("MAX_EVENTS", max_events)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn handoff")
}

/// Waits up to `limit` for `child` to exit; true when it did.
fn exits_within(child: &mut Child, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The outbox's records by the inserted document's `_id`, checking that none is there twice and
/// that each transaction's records are in its write order.
fn check_outbox(live: &Live, expected: usize, seed: u64) {
    let outbox = live.outbox();
    let mut ids = HashSet::new();
    let mut next_in: BTreeMap<i32, i64> = BTreeMap::new();
    for record in &outbox {
        let document = record
            .get_document("event")
            .and_then(|e| e.get_document("fullDocument"))
            .expect("the event's document");
        let id = document.get_str("_id").expect("_id").to_string();
        if let Some((txn, j)) = id
            .strip_prefix('t')
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(k, j)| Some((k.parse::<i32>().ok()?, j.parse::<i64>().ok()?)))
        {
            let next = next_in.entry(txn).or_default();
            assert_eq!(j, *next, "transaction {txn} out of order (seed {seed})");
            *next += 1;
        }
        assert!(
            ids.insert(id.clone()),
            "{id} handed off twice (seed {seed})"
        );
    }
    assert_eq!(outbox.len(), expected, "every event once (seed {seed})");
    for (txn, (seen, of)) in transactions_in(&outbox) {
        assert_eq!(seen as i64, of, "transaction {txn} (seed {seed})");
    }
}

/// Runs the consumer unhindered until a run finds nothing new.
fn drain(live: &Live, max_events: &str, extra: &[&str]) {
    for _ in 0..200 {
        let output = spawn(live, max_events, extra)
            .wait_with_output()
            .expect("run");
        let outputs = support::ok(&output);
        if outputs["events_handed_off"] == 0 {
            return;
        }
    }
    panic!("the consumer never caught up");
}

#[test]
fn a_reader_never_sees_part_of_a_source_transaction_under_kills_and_a_tiny_max_events() {
    let seed = support::seed("HANDOFF_TXN_SEED");
    eprintln!("HANDOFF_TXN_SEED={seed}");
    let mut rng = Rng::new(seed);
    let live = Live::for_kills();
    live.start_consumer();
    let sizes: Vec<u64> = (0..TRANSACTIONS).map(|_| 1 + rng.below(LARGEST)).collect();
    let writer = {
        let sizes = sizes.clone();
        live.background(async move |client, db| write_transactions(client, db, sizes, seed).await)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        live.background(async move |_, db| read_until(db, stop).await)
    };

    let (mut kills, mut runs, mut over_max) = (0u32, 0u32, 0u32);
    let give_up = Instant::now() + Duration::from_secs(240);
    while kills < MIN_KILLS || !writer.is_finished() {
        assert!(
            Instant::now() < give_up,
            "too slow: {kills} kills in {runs} runs"
        );
        runs += 1;
        let mut child = spawn(&live, "5", &[]);
        if rng.below(2) == 0 && !exits_within(&mut child, Duration::from_millis(rng.below(1200))) {
            child.kill().expect("SIGKILL");
            kills += 1;
            child.wait().expect("wait");
            live.expire_lease();
            continue;
        }
        let output = child.wait_with_output().expect("run");
        match output.status.code() {
            Some(0) => {
                let outputs = support::outputs(&output);
                if outputs["events_handed_off"].as_u64().unwrap_or(0) > 5 {
                    over_max += 1;
                }
            }
            // A killed run's open transaction holds the checkpoint until the server reaps it.
            Some(10) => std::thread::sleep(Duration::from_millis(300)),
            code => panic!("exit {code:?}: {}", support::stderr(&output)),
        }
    }
    let events = writer.join().expect("writer");
    drain(&live, "5", &[]);
    stop.store(true, Ordering::SeqCst);
    let (partial, reads) = reader.join().expect("reader");

    assert!(
        partial.is_empty(),
        "seen in part: {partial:?} (seed {seed})"
    );
    check_outbox(&live, events, seed);
    assert!(
        over_max > 0,
        "no run went past max_events to finish a transaction (seed {seed})"
    );
    eprintln!(
        "{TRANSACTIONS} transactions of 1-{LARGEST} inserts ({events} events): {kills} kills in \
         {runs} runs, {over_max} runs past max_events 5, {reads} outbox reads, none saw part of \
         a transaction (seed {seed})"
    );
}

/// `n` inserts in one transaction, `{_id: "<prefix>-<j>"}`.
fn transaction(live: &Live, prefix: &str, n: usize) {
    live.rt.block_on(async {
        let mut session = live.client.start_session().await.expect("session");
        session.start_transaction().await.expect("start");
        let documents: Vec<Document> = (0..n)
            .map(|j| doc! {"_id": format!("{prefix}-{j}"), "j": j as i32})
            .collect();
        live.coll("orders")
            .insert_many(documents)
            .session(&mut session)
            .await
            .expect("insert");
        session.commit_transaction().await.expect("commit");
    });
}

#[test]
fn the_batching_policy_cuts_its_batches_where_source_transactions_end() {
    let live = Live::start();
    live.start_consumer();
    transaction(&live, "a", 7);
    live.insert(0..2);
    transaction(&live, "b", 12);
    let batching = ["--policy", handoff_test_policies::BATCHING];
    let param = ["--policy-param", "batch_size=5"];
    let args: Vec<&str> = batching.iter().chain(&param).copied().collect();
    // max_events 4: the first run takes all of `a`, the next the singles and all of `b`.
    let first = support::ok(
        &live
            .command()
            .env("MAX_EVENTS", "4")
            .args(&args)
            .output()
            .unwrap(),
    );
    assert_eq!(first["events_handed_off"], 7, "{first}");
    assert_eq!(live.outbox_len(), 7);
    let second = live
        .command()
        .env("MAX_EVENTS", "4")
        .args(&args)
        .output()
        .unwrap();
    let outputs = support::ok(&second);
    assert_eq!(outputs["events_handed_off"], 14, "{outputs}");
    assert_eq!(support::metric(&second, "source_transactions"), 1);
    assert_eq!(support::metric(&second, "source_transactions_split"), 0);
    assert_eq!(live.outbox_len(), 21);
}

#[test]
fn a_policy_built_before_contract_1_5_never_writes_part_of_a_transaction_it_ends_inside() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..2);
    transaction(&live, "a", 3);
    transaction(&live, "b", 6);
    let legacy = ["--policy", handoff_test_policies::LEGACY_V1_0];
    let run = || {
        live.command()
            .env("MAX_EVENTS", "4")
            .args(legacy)
            .output()
            .unwrap()
    };
    // It reads 4 events and stops inside `a`: the two singles are written, `a` is left whole.
    let first = run();
    support::ok(&first);
    assert_eq!(live.outbox_len(), 2);
    assert_eq!(support::metric(&first, "transaction_events_held_back"), 2);
    // `a` whole; it stops inside `b`, which is left.
    let second = run();
    support::ok(&second);
    assert_eq!(live.outbox_len(), 5);
    assert_eq!(support::metric(&second, "transaction_events_held_back"), 1);
    // `b` is larger than what a run of this policy reads and begins the run: written as the
    // policy committed it, said in the metric.
    let third = run();
    support::ok(&third);
    assert_eq!(support::metric(&third, "source_transactions_split"), 1);
    assert!(support::stderr(&third).contains("larger than what a run reads"));
    support::ok(&run());
    assert_eq!(live.outbox_len(), 11);
}

#[test]
fn a_transaction_over_the_bound_is_handed_off_in_order_with_a_warning() {
    let live = Live::start();
    live.start_consumer();
    transaction(&live, "big", 520);
    live.insert(0..1);
    let mut total = 0;
    let mut split = 0;
    for _ in 0..5 {
        let output = live.run(&[]);
        let outputs = support::ok(&output);
        total += outputs["events_handed_off"].as_u64().unwrap();
        split += support::metric(&output, "source_transactions_split")
            .as_u64()
            .unwrap();
        if outputs["events_handed_off"] == 0 {
            break;
        }
    }
    assert_eq!(total, 521);
    assert_eq!(split, 1);
    let outbox = live.outbox();
    let order: Vec<String> = outbox
        .iter()
        .filter_map(|r| {
            let document = r
                .get_document("event")
                .ok()?
                .get_document("fullDocument")
                .ok()?;
            document.get_str("_id").ok().map(str::to_string)
        })
        .collect();
    let expected: Vec<String> = (0..520).map(|j| format!("big-{j}")).collect();
    assert_eq!(order, expected);
    assert_eq!(outbox.len(), 521);
}

#[test]
fn the_domain_events_policy_writes_one_record_per_source_transaction_when_asked() {
    let live = Live::start();
    live.start_consumer();
    transaction(&live, "o", 3);
    live.insert(0..1);
    let output = live.run(&[
        "--policy",
        handoff_test_policies::DOMAIN_EVENTS,
        "--policy-param",
        "per-transaction=true",
    ]);
    let outputs = support::ok(&output);
    assert_eq!(outputs["events_handed_off"], 2, "{outputs}");
    assert_eq!(outputs["events_skipped"], 2, "{outputs}");
    let outbox = live.outbox();
    assert_eq!(outbox.len(), 2);
    let record = &outbox[0];
    assert_eq!(record.get_str("eventType").unwrap(), "OrderTransaction");
    assert!(record.get_str("_id").unwrap().contains("/txn-"));
    let payload = record.get_document("payload").unwrap();
    let events = payload.get_array("events").unwrap();
    assert_eq!(events.len(), 3);
    let ids: Vec<&str> = events
        .iter()
        .map(|e| e.as_document().unwrap().get_str("aggregateId").unwrap())
        .collect();
    assert_eq!(ids, vec!["o-0", "o-1", "o-2"]);
    assert_eq!(outbox[1].get_str("eventType").unwrap(), "OrderCreated");
}
