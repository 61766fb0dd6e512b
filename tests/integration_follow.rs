//! Follow mode: `handoff run --follow` keeps its stream open and hands writes off as they come,
//! with the guarantees of a bounded run: it ends cleanly on SIGTERM or `--max-duration` (exit
//! 0), stops the moment it cannot prove it holds its lease (exit 3), and a fresh run after a
//! SIGKILL resumes with nothing lost and nothing twice.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bson::doc;
use support::Rng;
use support::live::*;
use support::{http, partitions};

/// `handoff run --follow` with `extra`, its debug log piped.
fn follow(live: &Live, extra: &[&str]) -> Child {
    live.command()
        .arg("--follow")
        .args(extra)
        .env("MAX_EVENTS", "1")
        .env("MAX_WAIT_SECONDS", "1")
        .env("HANDOFF_LOG", "handoff=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn handoff")
}

/// Reads the child's log until a line holds `needle`.
fn wait_for(reader: &mut impl BufRead, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        if reader.read_line(&mut line).expect("read the log") == 0 {
            break;
        }
        if line.contains(needle) {
            return;
        }
    }
    panic!("{needle:?} never logged");
}

/// Waits until the outbox holds `n` records, panicking after `limit`.
fn outbox_reaches(live: &Live, n: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    while live.outbox_len() < n {
        assert!(
            started.elapsed() < limit,
            "the outbox has {} of {n} records after {limit:?}",
            live.outbox_len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    started.elapsed()
}

#[test]
fn a_follow_run_hands_writes_off_as_they_come_and_ends_cleanly_on_sigterm() {
    let live = Live::start();
    let mut child = follow(&live, &[]);
    let mut log = BufReader::new(child.stderr.take().expect("stderr"));
    wait_for(&mut log, "run starting");
    // Drain the log so the run never blocks on a full pipe.
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        for line in log.lines().map_while(Result::ok) {
            rest.push_str(&line);
            rest.push('\n');
        }
        rest
    });
    std::thread::sleep(Duration::from_millis(300));
    // More writes than --max-events 1, with longer gaps than --max-wait-seconds 1: neither
    // ends the run, and each write is in the outbox while the same process runs.
    let mut slowest = Duration::ZERO;
    for i in 0..5 {
        live.insert(i..i + 1);
        let took = outbox_reaches(&live, i as usize + 1, Duration::from_secs(5));
        slowest = slowest.max(took);
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "the run ended"
        );
        std::thread::sleep(Duration::from_millis(if i == 2 { 1500 } else { 200 }));
    }
    support::sigterm(&child);
    let output = child.wait_with_output().expect("wait");
    let log = reader.join().expect("log");
    assert_eq!(output.status.code(), Some(0), "{log}");
    let outputs = support::outputs(&output);
    assert_eq!(outputs["events_handed_off"], 5, "{outputs}");
    assert_eq!(outputs["stopped"], true, "{outputs}");
    // Each change's write to its commit, measured over the run.
    let (p50, max) = (
        support::metric(&output, "latency_p50_ms"),
        support::metric(&output, "latency_max_ms"),
    );
    assert!(
        p50.as_u64().unwrap() <= max.as_u64().unwrap(),
        "{p50} {max}"
    );
    assert_checkpoint_at_end(
        &live,
        &live.outbox()[4]
            .get_document("event")
            .unwrap()
            .get_document("_id")
            .unwrap()
            .clone(),
    );
    // The run history says the run followed the stream and ended cleanly.
    let records = live.records("kestra_change_runs");
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].get_bool("follow").ok(),
        Some(true),
        "{:?}",
        records[0]
    );
    assert_eq!(
        records[0].get_i32("exitCode").ok(),
        Some(0),
        "{:?}",
        records[0]
    );
    eprintln!(
        "slowest write to outbox while following: {slowest:?}; write to commit p50 {p50} ms, max {max} ms"
    );
}

#[test]
fn max_duration_ends_a_follow_run_cleanly_and_needs_follow() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..3);
    let started = Instant::now();
    let output = follow(&live, &["--max-duration", "2s"])
        .wait_with_output()
        .expect("run");
    let took = started.elapsed();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        support::stderr(&output)
    );
    assert!(took >= Duration::from_secs(2), "ended after {took:?}");
    assert_eq!(support::outputs(&output)["events_handed_off"], 3);

    let refused = live.run(&["--max-duration", "2s"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(support::stderr(&refused).contains("add --follow"));
    let refused = live.run(&["--follow", "--max-duration", "soon"]);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(live.outbox_len(), 3, "a refused run writes nothing");
}

#[test]
fn a_policy_built_before_contract_1_5_cannot_follow() {
    let live = Live::start();
    let output = live.run(&["--follow", "--policy", handoff_test_policies::LEGACY_V1_0]);
    assert_eq!(output.status.code(), Some(2));
    assert!(support::stderr(&output).contains("contract 1.5.0 or later"));
    assert_eq!(support::outputs(&output)["status"], "FAILED");
    assert!(live.checkpoint().is_none(), "nothing written");
}

#[test]
fn a_follow_run_stops_the_moment_it_loses_its_lease() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..1);
    let mut child = follow(&live, &["--lease-seconds", "5"]);
    outbox_reaches(&live, 1, Duration::from_secs(10));
    // Another run takes the consumer over (as after the lease ran out).
    let until = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 600_000);
    live.wait(live.coll(CHECKPOINTS).update_one(
        doc! {"_id": CONSUMER},
        doc! {"$set": {"owner": "another-run", "leaseUntil": until}},
    ))
    .expect("take the lease");
    let taken = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            taken.elapsed() < Duration::from_secs(10),
            "the run kept going without its lease"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().expect("output");
    assert_eq!(status.code(), Some(3), "{}", support::stderr(&output));
    assert!(support::stderr(&output).contains("lost its lease"));
    live.insert(1..2);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        live.outbox_len(),
        1,
        "nothing written after the lease was lost"
    );
}

#[test]
fn ten_sigkills_of_follow_runs_under_a_steady_writer_lose_nothing_and_double_nothing() {
    let seed = support::seed("HANDOFF_FOLLOW_SEED");
    eprintln!("HANDOFF_FOLLOW_SEED={seed}");
    let mut rng = Rng::new(seed);
    let live = Live::for_kills();
    live.start_consumer();
    const WRITES: i32 = 400;
    let writer = live.background(async |_, db| {
        let orders = db.collection::<bson::Document>("orders");
        for i in 0..WRITES {
            orders.insert_one(doc! {"_id": i}).await.expect("insert");
            tokio::time::sleep(Duration::from_millis(8)).await;
        }
    });
    let mut kills = 0;
    while kills < 10 {
        let mut child = follow(&live, &[]);
        std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
        if child.try_wait().expect("try_wait").is_some() {
            let output = child.wait_with_output().expect("output");
            // A killed run's open transaction holds the checkpoint until the server reaps it.
            assert_eq!(
                output.status.code(),
                Some(10),
                "{}",
                support::stderr(&output)
            );
            std::thread::sleep(Duration::from_millis(300));
            continue;
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        kills += 1;
        live.expire_lease();
    }
    writer.join().expect("writer");
    // A last follow run catches up, then ends on SIGTERM (once it holds the consumer: a signal
    // before the process listens for it would end it as the signal's default does).
    let child = follow(&live, &[]);
    partitions::claimed(&live, CONSUMER);
    let deadline = Instant::now() + Duration::from_secs(60);
    while live.outbox_len() < WRITES as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    support::sigterm(&child);
    let output = child.wait_with_output().expect("output");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        support::stderr(&output)
    );
    assert_eq!(
        keys_of(&live.outbox()),
        (0..WRITES).collect::<Vec<_>>(),
        "seed {seed}"
    );
    eprintln!("{WRITES} writes, {kills} SIGKILLs of follow runs: every write once, in order");
}

/// `handoff run --follow --partition index/4` as consumer `orders-<index>`.
fn follow_partition(live: &Live, index: usize) -> Child {
    live.command()
        .args(["--follow", "--partition", &format!("{index}/4")])
        .env("CONSUMER_ID", format!("orders-{index}"))
        .env("MAX_EVENTS", "5")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn handoff")
}

#[test]
fn four_follow_partitions_under_writes_and_sigkills_hand_each_event_off_once_in_order() {
    let seed = support::seed("HANDOFF_FOLLOW_SEED");
    eprintln!("HANDOFF_FOLLOW_SEED={seed}");
    let mut rng = Rng::new(seed ^ 0x4b1d);
    let live = Live::for_kills();
    const KEYS: i32 = 40;
    const UPDATES: i32 = 260;
    let mut runs: Vec<Child> = (0..4).map(|i| follow_partition(&live, i)).collect();
    let consumers: Vec<String> = (0..4).map(|i| format!("orders-{i}")).collect();
    partitions::started(&live, &consumers);
    let writer =
        live.background(async move |_, db| partitions::write_keys(db, KEYS, UPDATES, seed).await);
    let mut kills = 0;
    while !writer.is_finished() || kills < 8 {
        std::thread::sleep(Duration::from_millis(150 + rng.below(400)));
        let index = rng.below(4) as usize;
        let _ = runs[index].kill();
        let _ = runs[index].wait();
        kills += 1;
        partitions::expire_lease_of(&live, &consumers[index]);
        runs[index] = follow_partition(&live, index);
    }
    writer.join().expect("writer");
    // As a StatefulSet does, a partition whose run ended is started again (a run started right
    // after a kill may find the killed one's transaction still open: exit 10), until every
    // write is handed off.
    let expected = (KEYS + UPDATES) as usize;
    let deadline = Instant::now() + Duration::from_secs(90);
    while live.outbox_len() < expected {
        assert!(
            Instant::now() < deadline,
            "the partitions never caught up (seed {seed})"
        );
        for (index, run) in runs.iter_mut().enumerate() {
            if let Some(status) = run.try_wait().expect("try_wait") {
                assert_eq!(status.code(), Some(10), "partition {index} (seed {seed})");
                *run = follow_partition(&live, index);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for consumer in &consumers {
        partitions::claimed(&live, consumer);
    }
    for run in &runs {
        support::sigterm(run);
    }
    for run in runs {
        let output = run.wait_with_output().expect("output");
        assert!(
            matches!(output.status.code(), Some(0) | Some(10)),
            "{}",
            support::stderr(&output)
        );
    }
    // Every write once, each key's events in one partition, in the order they were written.
    partitions::check_partitioned(&live.outbox(), expected, 4, seed);
    eprintln!(
        "{expected} writes over {KEYS} keys, 4 follow partitions, {kills} SIGKILLs: every write \
         once, each key in one partition, in order"
    );
}

#[test]
fn a_follow_run_serves_its_metrics_in_the_openmetrics_format_while_it_runs() {
    let live = Live::start();
    live.start_consumer();
    let port = http::free_port();
    let child = follow(&live, &["--metrics-listen", &port.to_string()]);
    let started = Instant::now();
    while http::status(port, "/readyz") != Some(200) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never ready: {:?}",
            http::status(port, "/readyz")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(http::status(port, "/healthz"), Some(200));
    assert_eq!(http::status(port, "/nothing"), Some(404));
    live.insert(0..3);
    outbox_reaches(&live, 3, Duration::from_secs(10));
    let http::Reply {
        status,
        content_type,
        body,
    } = http::get(port, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{content_type}"
    );
    let consumer = format!("consumer=\"{CONSUMER}\"");
    for sample in [
        format!("handoff_events_handed_off_total{{{consumer}}} 3"),
        format!("handoff_events_committed_total{{{consumer}}} 3"),
        format!("handoff_latency_seconds_count{{{consumer}}} 3"),
    ] {
        assert!(
            body.lines().any(|l| l == sample),
            "{sample} not in:\n{body}"
        );
    }
    // Well-formed OpenMetrics: every sample belongs to a family with its TYPE, and # EOF ends it.
    assert!(body.ends_with("# EOF\n"), "{body}");
    let families: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for family in [
        "handoff_events_handed_off",
        "handoff_latency_seconds",
        "handoff_checkpoint_age_seconds",
        "handoff_lag_seconds",
        "handoff_oplog_margin_seconds",
    ] {
        assert!(families.contains(&family), "{family} not in {families:?}");
    }
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            families.iter().any(|f| line.starts_with(f)),
            "{line} outside a family"
        );
    }
    support::sigterm(&child);
    let output = child.wait_with_output().expect("output");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        support::stderr(&output)
    );
}

#[test]
fn a_metrics_address_that_cannot_be_served_refuses_the_run_with_nothing_written() {
    let live = Live::start();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = busy.local_addr().expect("address").port().to_string();
    for address in [port.as_str(), "not an address", "127.0.0.1:99999"] {
        let output = live.run(&["--follow", "--metrics-listen", address]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{address}: {}",
            support::stderr(&output)
        );
        assert!(support::stderr(&output).contains("--metrics-listen"));
    }
    assert!(live.checkpoint().is_none(), "nothing written");
}
