//! The run history and what is read from it: one record per run, kept with the lease's release
//! and bounded per consumer; the forecast of history loss, checked against the moment the loss
//! comes at known rates; `status --all` and `--min-forecast`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use futures_util::TryStreamExt;
use mongo_sim::Config;
use serde_json::Value;

use crate::support;
use crate::support::live::{CONSUMER, DB, Live};

const RUNS: &str = "kestra_change_runs";
/// The forecast's test: the watched collection's writes a second, and the other writes that
/// make most of the oplog (so that the consumer's own writes, which fall when it is throttled,
/// hardly change how fast the oplog turns over).
const WRITES_PER_SECOND: u32 = 20;
const OTHER_WRITES_PER_SECOND: u32 = 200;

fn runs(live: &Live) -> Vec<Document> {
    live.wait(async {
        live.coll(RUNS)
            .find(doc! {})
            .sort(doc! {"run": 1})
            .await
            .expect("find runs")
            .try_collect()
            .await
            .expect("collect runs")
    })
}

/// The consumer's lease ends at the epoch: the run gave it back.
fn assert_lease_given_back(live: &Live) {
    let checkpoint = live.checkpoint().expect("the checkpoint");
    let until = checkpoint.get_datetime("leaseUntil").ok();
    assert_eq!(
        until.map(|d| d.timestamp_millis()),
        Some(0),
        "the lease was given back: {checkpoint:?}"
    );
}

fn status_json(live: &Live, extra: &[&str]) -> Value {
    let mut args = vec!["status", "--json"];
    args.extend_from_slice(extra);
    let out = live.operator(&args);
    assert!(out.status.success(), "{}", support::stderr(&out));
    serde_json::from_slice(&out.stdout).expect("status --json")
}

#[test]
fn each_run_keeps_one_record_and_a_consumer_keeps_at_most_runs_keep() {
    let live = Live::with_config(Config::default());
    let first = support::ok(&live.run(&[]));
    assert!(
        first
            .get("history_loss_eta_seconds")
            .is_some_and(Value::is_null),
        "not estimable after one run: {first}"
    );
    let recorded = runs(&live);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let record = &recorded[0];
    assert_eq!(record.get_str("consumer").unwrap(), CONSUMER);
    assert_eq!(record.get_i64("run").unwrap(), 1);
    assert_eq!(record.get_str("status").unwrap(), "IDLE");
    assert!(record.get_i64("oplogMarginSeconds").is_ok(), "{record:?}");
    assert!(record.get_i64("lagSeconds").is_ok(), "{record:?}");
    assert!(record.get_timestamp("checkpointTime").is_ok(), "{record:?}");
    assert!(*record.get_datetime("endedAt").unwrap() >= *record.get_datetime("startedAt").unwrap());

    live.insert(0..3);
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 3);
    let second = runs(&live).pop().expect("the second run");
    assert_eq!(second.get_i64("run").unwrap(), 2);
    assert_eq!(second.get_str("status").unwrap(), "HANDED_OFF");
    assert_eq!(
        second
            .get_document("events")
            .unwrap()
            .get_i64("handedOff")
            .unwrap(),
        3
    );

    for _ in 0..4 {
        support::ok(&live.run(&["--runs-keep", "3"]));
        assert_lease_given_back(&live);
    }
    let kept: Vec<i64> = runs(&live)
        .iter()
        .map(|r| r.get_i64("run").unwrap())
        .collect();
    assert_eq!(kept, vec![4, 5, 6], "the oldest records are replaced");
    // The checkpoint counts every run.
    assert_eq!(live.checkpoint().unwrap().get_i64("runs").unwrap(), 6);

    // status reads the history.
    let status = status_json(&live, &[]);
    assert_eq!(status["runs"]["recorded"], 3, "{status}");
    assert_eq!(status["runs"]["last"]["run"], 6, "{status}");
    assert_eq!(status["forecast"]["basis"]["runs"], 3, "{status}");

    // An operator's move of the checkpoint starts the rates again: the runs before it are not
    // the consumer's pace.
    let reset = live.operator(&["checkpoint", "reset", "--to", "now", "--reason", "forecast"]);
    assert!(reset.status.success(), "{}", support::stderr(&reset));
    support::ok(&live.run(&[]));
    let last = runs(&live)
        .into_iter()
        .max_by_key(|r| r.get_i64("run").unwrap())
        .expect("a record");
    assert_eq!(last.get_i64("moves").unwrap(), 1, "{last:?}");
    let status = status_json(&live, &[]);
    assert_eq!(status["forecast"]["verdict"], "unknown", "{status}");
    assert!(
        status["forecast"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("fewer than 3 runs")),
        "{status}"
    );
}

/// A user refused the runs collection is refused the whole `bulkWrite` that gives the lease back
/// with the record: the lease's end is then sent alone, and the record after it.
#[test]
fn a_release_refused_with_its_record_is_sent_apart_and_the_lease_given_back() {
    let live = Live::with_config(Config::default());
    support::ok(&live.run(&[]));
    live.insert(0..2);
    // The three commits (one per event, then the idle position's) pass; the release is
    // refused.
    live.fail_point(
        doc! {"skip": 3, "times": 1}.into(),
        doc! {"failCommands": ["bulkWrite"], "errorCode": 13},
    );
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 2);
    assert_eq!(live.fail_point_off(), 1, "the release was refused");
    assert_lease_given_back(&live);
    assert_eq!(runs(&live).len(), 2, "the record was kept after it");
    // The next run starts at once.
    support::ok(&live.run(&[]));
}

#[test]
fn a_server_without_bulk_write_keeps_the_record_in_a_second_command() {
    let live = Live::with_config(Config {
        max_wire_version: 21,
        ..Config::default()
    });
    support::ok(&live.run(&[]));
    live.insert(0..2);
    support::ok(&live.run(&[]));
    let recorded = runs(&live);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    assert_eq!(recorded[1].get_str("status").unwrap(), "HANDED_OFF");
    assert_lease_given_back(&live);
}

#[test]
fn a_failed_run_is_recorded_with_its_class_and_status_all_lists_it_first() {
    let live = Live::with_config(Config {
        history_limit: 20,
        ..Config::default()
    });
    // Two consumers: one keeps up, one falls off the oplog.
    support::ok(&live.run(&["--consumer-id", "behind"]));
    live.insert(0..40);
    let failed = live.run(&["--consumer-id", "behind"]);
    assert_eq!(
        failed.status.code(),
        Some(6),
        "{}",
        support::stderr(&failed)
    );
    support::ok(&live.run(&[]));
    let recorded = runs(&live);
    let behind: Vec<&Document> = recorded
        .iter()
        .filter(|r| r.get_str("consumer").ok() == Some("behind"))
        .collect();
    assert_eq!(behind.len(), 2, "{recorded:?}");
    let last = behind
        .iter()
        .max_by_key(|r| r.get_i64("run").unwrap())
        .unwrap();
    assert_eq!(last.get_str("status").unwrap(), "FAILED");
    assert_eq!(last.get_str("errorClass").unwrap(), "history_lost");
    assert_eq!(last.get_i32("exitCode").unwrap(), 6);
    assert!(last.get_i64("oplogMarginSeconds").unwrap() <= 0, "{last:?}");

    let all = live.operator(&["status", "--all", "--json"]);
    assert!(all.status.success(), "{}", support::stderr(&all));
    let all: Value = serde_json::from_slice(&all.stdout).unwrap();
    let order: Vec<&str> = all["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["consumer"].as_str().unwrap())
        .collect();
    assert_eq!(order, vec!["behind", CONSUMER], "the worst first: {all}");
    assert_eq!(all["consumers"][0]["forecast"]["verdict"], "lost", "{all}");
    assert_eq!(all["consumers"][0]["history_loss_eta_seconds"], 0, "{all}");

    let text = live.operator(&["status", "--all"]);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("consumer"), "{text}");
    assert!(
        lines[1].starts_with("behind") && lines[1].contains("LOST"),
        "{text}"
    );
    assert!(lines[2].starts_with(CONSUMER), "{text}");

    let watched = live.operator(&["status", "--all", "--min-forecast", "1h"]);
    assert_eq!(
        watched.status.code(),
        Some(16),
        "{}",
        support::stderr(&watched)
    );
    assert!(
        support::stderr(&watched).contains("1 of 2 consumers need attention"),
        "{}",
        support::stderr(&watched)
    );
}

/// A writer inserting `per_second` documents a second into `collection` until stopped.
fn writer(
    uri: String,
    collection: &'static str,
    per_second: u32,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let client = mongodb::Client::with_uri_str(&uri).await.expect("client");
            let orders = client.database(DB).collection::<Document>(collection);
            let started = Instant::now();
            let mut written: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * f64::from(per_second)) as u64;
                if due > written {
                    let batch: Vec<Document> =
                        (written..due).map(|i| doc! {"n": i as i64}).collect();
                    orders.insert_many(batch).await.expect("insert");
                    written = due;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            written
        })
    })
}

/// The oldest entry's time in the oplog.
fn oldest(live: &Live) -> bson::Timestamp {
    live.wait(
        live.client
            .database("local")
            .collection::<Document>("oplog.rs")
            .find_one(doc! {})
            .sort(doc! {"$natural": 1}),
    )
    .expect("oplog")
    .expect("an entry")
    .get_timestamp("ts")
    .expect("ts")
}

/// Runs the consumer every `period` (or as soon as the last run ended, when it took longer) with
/// `max_events(time since the last run began)` until `until` says stop; returns the last run's
/// output.
fn paced_runs(
    live: &Live,
    period: Duration,
    max_events: impl Fn(Duration) -> String,
    mut until: impl FnMut(&std::process::Output) -> bool,
) -> std::process::Output {
    let mut previous: Option<Instant> = None;
    loop {
        let started = Instant::now();
        let since = previous.map_or(period, |p| started - p);
        previous = Some(started);
        let out = live.run(&["--max-events", &max_events(since)]);
        if until(&out) {
            return out;
        }
        if let Some(rest) = period.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

/// At known rates (20 writes a second to the watched collection and 200 to another; a consumer
/// handing off 8 a second once throttled, in runs 1.5 s apart) on a small oplog, the forecast `status` gives comes
/// true: the run that finds history lost comes within the stated tolerance of it. The consumer
/// falls behind by 0.6 s a second: the oplog's one-second times blur each rate by up to 0.08 over
/// the fitted runs, a small part of that difference.
#[test]
fn a_forecast_of_a_consumer_falling_behind_comes_true_within_its_tolerance() {
    let live = Live::with_config(Config {
        history_limit: 7000,
        ..Config::default()
    });
    support::ok(&live.run(&[]));
    let stop = Arc::new(AtomicBool::new(false));
    let writing = [
        writer(live.uri(), "orders", WRITES_PER_SECOND, stop.clone()),
        writer(live.uri(), "other", OTHER_WRITES_PER_SECOND, stop.clone()),
    ];
    let period = Duration::from_secs(1);
    // Keeping up (up to 500 a run) until the oplog is full and discarding, and a few runs more.
    let first = oldest(&live);
    let mut after_full = 0;
    paced_runs(
        &live,
        period,
        |_| "500".into(),
        |out| {
            assert!(out.status.success(), "{}", support::stderr(out));
            if oldest(&live) != first {
                after_full += 1;
            }
            after_full >= 3
        },
    );
    // Throttled: a run every 1.5 s (or as soon as the last ended, on a loaded machine), each
    // handing off 40 % of what was written since the last began (runs this far apart keep the
    // oplog's one-second times from blurring the rates).
    let period = Duration::from_millis(1500);
    let batch = |since: Duration| {
        ((0.4 * f64::from(WRITES_PER_SECOND) * since.as_secs_f64()).round() as u32)
            .clamp(1, 500)
            .to_string()
    };
    let mut throttled = 0;
    paced_runs(&live, period, batch, |out| {
        assert!(
            out.status.success(),
            "history lost before the forecast: {}",
            support::stderr(out)
        );
        throttled += 1;
        // The forecast fits the last runs: all of them at the throttled rate. The run's own
        // outputs then forecast the loss too (counting the run itself).
        let done = throttled > handoff::domain::forecast::FIT_RUNS;
        if done {
            let outputs = support::ok(out);
            assert!(
                outputs["history_loss_eta_seconds"]
                    .as_i64()
                    .is_some_and(|eta| eta > 0),
                "{outputs}"
            );
        }
        done
    });
    let status = status_json(&live, &[]);
    let forecast_at = Instant::now();
    let eta = status["history_loss_eta_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("a loss is forecast: {status}"));
    let watched = live.operator(&["status", "--min-forecast", "1h"]);
    assert_eq!(
        watched.status.code(),
        Some(16),
        "{}",
        support::stderr(&watched)
    );
    let relaxed = live.operator(&["status", "--min-forecast", "1s"]);
    assert!(relaxed.status.success(), "{}", support::stderr(&relaxed));
    // The same rates until a run finds the history lost (exit 6).
    let mut previous = forecast_at;
    let mut last = forecast_at;
    paced_runs(&live, period, batch, |out| {
        previous = last;
        last = Instant::now();
        assert!(
            forecast_at.elapsed() < Duration::from_secs(120),
            "no loss two minutes after a forecast of {eta} s"
        );
        match out.status.code() {
            Some(0) => false,
            Some(6) => true,
            other => panic!("exit {other:?}: {}", support::stderr(out)),
        }
    });
    stop.store(true, Ordering::Relaxed);
    for writer in writing {
        writer.join().expect("writer");
    }
    // The loss came between the last successful run and the one that found it.
    let came = (previous - forecast_at).as_secs_f64()..=(last - forecast_at).as_secs_f64();
    let observed = (came.start() + came.end()) / 2.0;
    let error = (eta - observed).abs();
    let tolerance = (observed * 0.35).max(4.0);
    eprintln!(
        "forecast {eta:.0} s, loss found between {:.1} s and {:.1} s after it: error {error:.1} s \
         (tolerance {tolerance:.1} s); basis {}",
        came.start(),
        came.end(),
        status["forecast"]["basis"]
    );
    assert!(
        error <= tolerance,
        "forecast {eta} s, observed {observed:.1} s: {}",
        status["forecast"]
    );
}
