//! `cargo bench -p handoff --bench latency [-- --seconds N] [-- --rates 100,1000]`
//!
//! Write-to-hand-off latency on the test server: a writer inserts at 100, 1,000 and 5,000 writes
//! per second for 20 s (in 10 ms ticks, one `insert_many` per tick), and a change stream on the
//! outbox sees each write's record arrive. A write's latency is from its acknowledgment to the
//! moment its outbox record is seen (so it includes the commit and the outbox stream's own
//! wake-up). For each rate, three contenders, each with its own database and consumer:
//! - `run --follow` with the default policy (one event per transaction);
//! - `run --follow` with the batching policy (`batch_size=100`);
//! - the best the baseline's schedule can do: bounded runs started again as soon as the previous
//!   one ends (the seed's webhook trigger starts one per write; back to back is the most that
//!   keeps up), `MAX_EVENTS=500`, `MAX_WAIT_SECONDS=1`.
//!
//! It prints p50, p99, p99.9 and the largest latency per rate and contender, and the writes per
//! second each handed off (the offered rate when it kept up). Every run is checked: each write's
//! record arrives, once.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use futures_util::StreamExt;
use mongo_sim::{Config, ServerHandle};
use mongodb::Client;

const CHECKPOINTS: &str = "kestra_change_checkpoints";
const OUTBOX: &str = "kestra_change_outbox";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Contender {
    FollowDefault,
    FollowBatching,
    BackToBack,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::FollowDefault => "follow-default",
            Contender::FollowBatching => "follow-batching",
            Contender::BackToBack => "back-to-back-runs",
        }
    }
}

struct Bench {
    uri: String,
    _server: ServerHandle,
    rt: tokio::runtime::Runtime,
    client: Client,
    seconds: u64,
}

/// When each write was acknowledged and when its record was seen, by its `_id`.
#[derive(Default)]
struct Times {
    acked: HashMap<i64, Instant>,
    seen: HashMap<i64, Instant>,
    twice: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds = value("--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let rates: Vec<u64> = value("--rates")
        .map(|r| r.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 1000, 5000]);
    let server = ServerHandle::start_blocking(Config::default()).expect("test server");
    let uri = server.uri();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client = rt.block_on(Client::with_uri_str(&uri)).expect("client");
    let bench = Bench {
        uri,
        _server: server,
        rt,
        client,
        seconds,
    };
    println!(
        "write-to-outbox latency, {seconds} s per rate, test server on this machine ({} CPUs)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:>7} {:<18} {:>8} {:>8} {:>9} {:>8} {:>12}",
        "writes/s", "contender", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "handed off/s"
    );
    for rate in rates {
        for contender in [
            Contender::FollowDefault,
            Contender::FollowBatching,
            Contender::BackToBack,
        ] {
            bench.measure(rate, contender);
        }
    }
}

/// `handoff run` of `contender` on `db`.
fn handoff(uri: &str, db: &str, contender: Contender) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_handoff"));
    command
        .arg("run")
        .env("MONGODB_URI", uri)
        .env("SOURCE_DATABASE", db)
        .env("CONSUMER_ID", contender.name())
        .env("MAX_EVENTS", "500")
        .env("MAX_WAIT_SECONDS", "1")
        .env_remove("HANDOFF_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match contender {
        Contender::FollowDefault => {
            command.arg("--follow");
        }
        Contender::FollowBatching => {
            command.args([
                "--follow",
                "--policy",
                handoff_test_policies::BATCHING,
                "--policy-param",
                "batch_size=100",
            ]);
        }
        Contender::BackToBack => {}
    }
    command
}

impl Bench {
    /// Waits until the consumer has its starting position.
    fn started(&self, db: &str, contender: Contender) {
        let checkpoints = self.client.database(db).collection::<Document>(CHECKPOINTS);
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            let found = self
                .rt
                .block_on(async {
                    checkpoints
                        .find_one(doc! {"_id": contender.name(), "token": {"$exists": true}})
                        .await
                })
                .expect("checkpoint");
            if found.is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} never started", contender.name());
    }

    fn measure(&self, rate: u64, contender: Contender) {
        let db = format!("latency_{rate}_{}", contender.name().replace('-', "_"));
        let times = Arc::new(Mutex::new(Times::default()));
        // The outbox's stream, open before anything is written.
        let watching = {
            let outbox = self.client.database(&db).collection::<Document>(OUTBOX);
            let mut stream = self
                .rt
                .block_on(async {
                    outbox
                        .watch()
                        .max_await_time(Duration::from_millis(5))
                        .await
                })
                .expect("watch the outbox");
            let times = times.clone();
            let total = rate * self.seconds;
            self.rt.spawn(async move {
                let mut seen = 0;
                while seen < total {
                    let Some(Ok(event)) = stream.next().await else {
                        break;
                    };
                    let at = Instant::now();
                    let Some(id) = event
                        .full_document
                        .as_ref()
                        .and_then(|d| d.get_document("event").ok())
                        .and_then(|e| e.get_document("documentKey").ok())
                        .and_then(|k| k.get_i64("_id").ok())
                    else {
                        continue;
                    };
                    let mut times = times.lock().expect("times");
                    if times.seen.insert(id, at).is_some() {
                        times.twice += 1;
                    }
                    seen += 1;
                }
            })
        };
        // The contender, its consumer started before the first write.
        let stop = Arc::new(AtomicBool::new(false));
        let mut follower: Option<Child> = None;
        let mut runner = None;
        if contender == Contender::BackToBack {
            let (uri, db, stop) = (self.uri.clone(), db.clone(), stop.clone());
            runner = Some(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let _ = handoff(&uri, &db, contender).status();
                }
            }));
        } else {
            let child = handoff(&self.uri, &db, contender)
                .spawn()
                .expect("spawn handoff");
            follower = Some(child);
        }
        self.started(&db, contender);
        // The writer: `rate` writes a second, in ticks of 10 ms (one write a tick below 100/s).
        let orders = self.client.database(&db).collection::<Document>("orders");
        let (every, per_tick) = if rate >= 100 {
            (Duration::from_millis(10), rate / 100)
        } else {
            (Duration::from_millis(1000 / rate.max(1)), 1)
        };
        let ticks = rate * self.seconds / per_tick;
        let began = Instant::now();
        let mut next = 0i64;
        for tick in 0..ticks {
            if let Some(wait) = (began + every * tick as u32).checked_duration_since(Instant::now())
            {
                std::thread::sleep(wait);
            }
            let documents: Vec<Document> = (0..per_tick as i64)
                .map(|k| doc! {"_id": next + k, "tick": tick as i64})
                .collect();
            self.rt
                .block_on(async { orders.insert_many(documents).await })
                .expect("insert");
            let acked = Instant::now();
            let mut times = times.lock().expect("times");
            for k in 0..per_tick as i64 {
                times.acked.insert(next + k, acked);
            }
            next += per_tick as i64;
        }
        let written = next as u64;
        // Every write's record, then the contender stops.
        let until = Instant::now() + Duration::from_secs(120);
        while times.lock().expect("times").seen.len() < written as usize && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        if let Some(mut child) = follower {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        if let Some(runner) = runner {
            let _ = runner.join();
        }
        watching.abort();
        let times = times.lock().expect("times");
        assert_eq!(
            times.seen.len() as u64,
            written,
            "{} at {rate}/s: not every write reached the outbox",
            contender.name()
        );
        assert_eq!(times.twice, 0, "a write's record seen twice");
        let mut histogram =
            hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram");
        let mut last = began;
        for (id, acked) in &times.acked {
            let seen = times.seen[id];
            last = last.max(seen);
            let us = seen.saturating_duration_since(*acked).as_micros() as u64;
            histogram.saturating_record(us.max(1));
        }
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        let rate_out = written as f64 / last.duration_since(began).as_secs_f64();
        println!(
            "{:>7} {:<18} {:>8.2} {:>8.2} {:>9.2} {:>8.2} {:>12.0}",
            rate,
            contender.name(),
            ms(0.5),
            ms(0.99),
            ms(0.999),
            histogram.max() as f64 / 1000.0,
            rate_out
        );
    }
}
