//! `cargo bench -p handoff --bench delivery [-- --records N] [-- --seconds N] [-- --rate R]`
//!
//! Delivery on the test server, on this machine:
//! - **throughput**: `handoff deliver` of N outbox records (default 2,000) to a MongoDB projection
//!   and to a webhook (a receiver in this process answering 200 at once), beside a plain loop
//!   doing the same work with the same driver: per record, the ledger update and the effect (one
//!   transaction of both for the projection; an HTTP `POST` then the ledger update for the
//!   webhook). The whole `deliver` process is timed (start, connection, admission of every record,
//!   delivery), `--max-records N` ending it as the last record settles; the ratio is deliver's
//!   records/s over the loop's.
//! - **latency**: source write to projected document through `run --follow` and
//!   `deliver --follow`, at R writes/s (default 1,000, in 10 ms ticks) for S seconds (default
//!   10): from each write's acknowledgment to its document seen by a change stream on the
//!   projection. p50, p99 and the largest.
//!
//! Every run is checked: each record's effect arrives.

use std::collections::HashMap;
use std::future::IntoFuture as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use futures_util::{StreamExt, TryStreamExt};
use mongo_sim::{Config, ServerHandle};
use mongodb::Client;

const OUTBOX: &str = "kestra_change_outbox";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

struct Bench {
    uri: String,
    _server: ServerHandle,
    rt: tokio::runtime::Runtime,
    client: Client,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let records = value("--records").unwrap_or(2000);
    let seconds = value("--seconds").unwrap_or(10);
    let rate = value("--rate").unwrap_or(1000);
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
    };
    println!(
        "delivery on the test server, this machine ({} CPUs)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<11} {:>8} {:>14} {:>14} {:>7}",
        "sink", "records", "deliver rec/s", "plain rec/s", "ratio"
    );
    for sink in ["projection", "webhook"] {
        bench.throughput(sink, records);
    }
    bench.latency(rate, seconds);
}

/// `handoff SUBCOMMAND` on `db`.
fn handoff(uri: &str, db: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_handoff"));
    command
        .args(args)
        .env("MONGODB_URI", uri)
        .env("SOURCE_DATABASE", db)
        .env("MAX_EVENTS", "500")
        .env("MAX_WAIT_SECONDS", "1")
        .env("HANDOFF_SINK_SECRET", SECRET)
        .env_remove("HANDOFF_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

fn succeed(command: &mut Command) {
    let output = command.output().expect("run handoff");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A webhook receiver answering 200 at once, counting what it got; its URL.
fn receiver(count: Arc<AtomicU64>) -> String {
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("listen"));
    let port = server.server_addr().to_ip().expect("ip").port();
    for _ in 0..4 {
        let server = server.clone();
        let count = count.clone();
        std::thread::spawn(move || {
            for mut request in server.incoming_requests() {
                let mut body = Vec::new();
                let _ = std::io::Read::read_to_end(request.as_reader(), &mut body);
                count.fetch_add(1, Ordering::SeqCst);
                let _ = request.respond(tiny_http::Response::empty(200));
            }
        });
    }
    format!("http://127.0.0.1:{port}/hook")
}

impl Bench {
    /// A consumer on `db` whose outbox holds `n` records (inserts handed off by the batching
    /// policy, same IDs as the default's).
    fn outbox_of(&self, db: &str, n: u64) {
        succeed(&mut handoff(&self.uri, db, &["run"]));
        let orders = self.client.database(db).collection::<Document>("orders");
        self.rt.block_on(async {
            for chunk in (0..n as i64).collect::<Vec<_>>().chunks(500) {
                let docs: Vec<Document> = chunk
                    .iter()
                    .map(|i| doc! {"_id": *i, "qty": 1, "note": "x".repeat(100)})
                    .collect();
                orders.insert_many(docs).await.expect("insert");
            }
        });
        let outbox = self.client.database(db).collection::<Document>(OUTBOX);
        while self
            .rt
            .block_on(outbox.count_documents(doc! {}).into_future())
            .expect("count")
            < n
        {
            succeed(&mut handoff(
                &self.uri,
                db,
                &[
                    "run",
                    "--policy",
                    handoff_test_policies::BATCHING,
                    "--policy-param",
                    "batch_size=100",
                ],
            ));
        }
    }

    fn throughput(&self, sink: &str, n: u64) {
        let db = format!("deliver_{sink}");
        let plain_db = format!("plain_{sink}");
        self.outbox_of(&db, n);
        self.outbox_of(&plain_db, n);
        let count = Arc::new(AtomicU64::new(0));
        let url = receiver(count.clone());
        let target = match sink {
            "projection" => "mongodb:view".to_string(),
            _ => url.clone(),
        };
        let started = Instant::now();
        succeed(&mut handoff(
            &self.uri,
            &db,
            &[
                "deliver",
                "--sink",
                &target,
                "--max-records",
                &n.to_string(),
                "--concurrency",
                "4",
            ],
        ));
        let delivered = started.elapsed();
        let plain = self.plain_loop(sink, &plain_db, &url);
        match sink {
            "projection" => {
                let view = self.client.database(&db).collection::<Document>("view");
                let held = self
                    .rt
                    .block_on(view.count_documents(doc! {}).into_future())
                    .expect("count");
                assert_eq!(held, n, "every record projected");
            }
            _ => assert_eq!(count.load(Ordering::SeqCst), 2 * n, "every record posted"),
        }
        let ours = n as f64 / delivered.as_secs_f64();
        let theirs = n as f64 / plain.as_secs_f64();
        println!(
            "{sink:<11} {n:>8} {ours:>14.0} {theirs:>14.0} {:>6.0}%",
            100.0 * ours / theirs
        );
    }

    /// The same work without handoff: every record read, then per record its ledger update and
    /// its effect, one after the other.
    fn plain_loop(&self, sink: &str, db: &str, url: &str) -> Duration {
        let database = self.client.database(db);
        let outbox = database.collection::<Document>(OUTBOX);
        let ledger = database.collection::<Document>("plain_ledger");
        let view = database.collection::<Document>("view");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let started = Instant::now();
        self.rt.block_on(async {
            let records: Vec<Document> = outbox
                .find(doc! {})
                .await
                .expect("find")
                .try_collect()
                .await
                .expect("records");
            let mut session = self.client.start_session().await.expect("session");
            for record in records {
                let id = record.get_str("_id").expect("an _id").to_string();
                let entry = doc! {"_id": format!("d/{id}")};
                let done =
                    doc! {"$set": {"status": "succeeded", "updatedAt": bson::DateTime::now()}};
                if sink == "projection" {
                    let event = record.get_document("event").expect("event");
                    let full = event
                        .get_document("fullDocument")
                        .expect("document")
                        .clone();
                    let key = doc! {"_id": full.get("_id").cloned()};
                    session.start_transaction().await.expect("start");
                    ledger
                        .update_one(entry, done)
                        .upsert(true)
                        .session(&mut session)
                        .await
                        .expect("ledger");
                    view.replace_one(key, full)
                        .upsert(true)
                        .session(&mut session)
                        .await
                        .expect("write");
                    session.commit_transaction().await.expect("commit");
                } else {
                    let body = serde_json::to_vec(
                        &bson::Bson::Document(record.clone()).into_relaxed_extjson(),
                    )
                    .expect("JSON");
                    let agent = agent.clone();
                    let url = url.to_string();
                    tokio::task::spawn_blocking(move || {
                        agent
                            .post(&url)
                            .header("content-type", "application/json")
                            .send(&body[..])
                            .expect("post")
                    })
                    .await
                    .expect("joined");
                    ledger
                        .update_one(entry, done)
                        .upsert(true)
                        .await
                        .expect("ledger");
                }
            }
        });
        started.elapsed()
    }

    fn latency(&self, rate: u64, seconds: u64) {
        let db = "deliver_latency";
        succeed(&mut handoff(&self.uri, db, &["run"]));
        let mut run = handoff(&self.uri, db, &["run", "--follow"])
            .stderr(Stdio::null())
            .spawn()
            .expect("run --follow");
        let mut deliver = handoff(
            &self.uri,
            db,
            &["deliver", "--sink", "mongodb:view", "--follow"],
        )
        .stderr(Stdio::null())
        .spawn()
        .expect("deliver --follow");
        std::thread::sleep(Duration::from_secs(2));
        let acked: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
        let seen: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
        let total = rate * seconds;
        let view = self.client.database(db).collection::<Document>("view");
        let mut stream = self
            .rt
            .block_on(async { view.watch().max_await_time(Duration::from_millis(5)).await })
            .expect("watch the projection");
        let seen_by = seen.clone();
        let watcher = self.rt.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(seconds + 30);
            while Instant::now() < deadline {
                if seen_by.lock().expect("seen").len() as u64 >= total {
                    break;
                }
                let Ok(Some(Ok(event))) =
                    tokio::time::timeout(Duration::from_millis(200), stream.next()).await
                else {
                    continue;
                };
                let at = Instant::now();
                if let Some(id) = event
                    .full_document
                    .as_ref()
                    .and_then(|d| d.get_i64("_id").ok())
                {
                    seen_by.lock().expect("seen").entry(id).or_insert(at);
                }
            }
        });
        let orders = self.client.database(db).collection::<Document>("orders");
        let per_tick = (rate / 100).max(1);
        self.rt.block_on(async {
            let mut next = 0_i64;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while (next as u64) < total {
                tick.tick().await;
                let docs: Vec<Document> = (next..next + per_tick as i64)
                    .map(|i| doc! {"_id": i, "qty": 1})
                    .collect();
                orders.insert_many(docs).await.expect("insert");
                let now = Instant::now();
                let mut acked = acked.lock().expect("acked");
                for i in next..next + per_tick as i64 {
                    acked.insert(i, now);
                }
                next += per_tick as i64;
            }
        });
        self.rt.block_on(watcher).expect("watcher");
        let _ = run.kill();
        let _ = deliver.kill();
        let _ = run.wait();
        let _ = deliver.wait();
        let acked = acked.lock().expect("acked");
        let seen = seen.lock().expect("seen");
        let mut ms: Vec<f64> = acked
            .iter()
            .filter_map(|(id, at)| {
                seen.get(id)
                    .map(|s| s.duration_since(*at).as_secs_f64() * 1e3)
            })
            .collect();
        if ms.len() < acked.len() {
            // Behind: the latencies below are of the writes that arrived in time only.
            println!(
                "behind: {} of {} writes projected within {} s of the last write ({:.0} writes/s \
                 sustained end to end)",
                ms.len(),
                acked.len(),
                30,
                ms.len() as f64 / (seconds + 30) as f64
            );
        }
        if ms.is_empty() {
            println!("no write was projected");
            return;
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
        println!(
            "source write -> projection through run --follow + deliver --follow, {rate} writes/s for {seconds} s: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
}
