//! Throughput of the test server through the official Rust driver.
//!
//! `cargo bench -p mongo-sim --bench throughput [-- --seconds 5 --workers 8 --events 20000]`
//!
//! Prints transactions/s (each: checkpoint compare-and-set `update_one` plus outbox
//! `insert_one` in one transaction through the convenient API) and change-stream events/s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use futures_util::{FutureExt, StreamExt};
use mongo_sim::{Config, ServerHandle};
use mongodb::Client;
use mongodb::options::ClientOptions;

struct Options {
    seconds: u64,
    workers: usize,
    events: usize,
}

fn options() -> Options {
    let mut o = Options {
        seconds: 5,
        workers: 8,
        events: 20_000,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let next = args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (args[i].as_str(), next) {
            ("--seconds", Some(n)) => o.seconds = n.max(1),
            ("--workers", Some(n)) => o.workers = (n as usize).max(1),
            ("--events", Some(n)) => o.events = (n as usize).max(1),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

async fn transactions(client: &Client, o: &Options) -> f64 {
    let db = client.database("bench");
    let checkpoints = db.collection::<Document>("checkpoints");
    let outbox = db.collection::<Document>("outbox");
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(o.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..o.workers {
        let (client, checkpoints, outbox, done) = (
            client.clone(),
            checkpoints.clone(),
            outbox.clone(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let consumer = format!("consumer-{w}");
            checkpoints
                .insert_one(doc! {"_id": &consumer, "source": "bench.src", "token": Bson::Null, "mode": "resumeAfter"})
                .await
                .expect("checkpoint created");
            let mut session = client.start_session().await.expect("session");
            let mut token = Bson::Null;
            let mut n: u64 = 0;
            while Instant::now() < deadline {
                n += 1;
                let next = Bson::Document(doc! {"_data": format!("82{w:04X}{n:016X}")});
                let ctx = (checkpoints.clone(), outbox.clone(), consumer.clone(), token.clone(), next.clone(), n);
                session
                    .start_transaction()
                    .and_run(ctx, |s, (checkpoints, outbox, consumer, token, next, n)| {
                        async move {
                            let r = checkpoints
                                .update_one(
                                    doc! {"_id": consumer.as_str(), "token": token.clone(), "source": "bench.src"},
                                    doc! {"$set": {"token": next.clone(), "mode": "resumeAfter"}},
                                )
                                .session(&mut *s)
                                .await?;
                            assert_eq!(r.matched_count, 1, "checkpoint compare-and-set");
                            outbox
                                .insert_one(doc! {"_id": format!("{consumer}/{n}"), "consumer": consumer.as_str(), "event": {"n": *n as i64}})
                                .session(&mut *s)
                                .await?;
                            Ok(())
                        }
                        .boxed()
                    })
                    .await
                    .expect("transaction commits");
                token = next;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn change_events(client: &Client, o: &Options) -> f64 {
    let coll = client.database("bench").collection::<Document>("events");
    let stream = coll.watch().await.expect("watch");
    let start = stream.resume_token().expect("initial token");
    drop(stream);
    let batch: Vec<Document> = (0..1000)
        .map(|i| doc! {"i": i, "payload": "x".repeat(100)})
        .collect();
    let mut written = 0;
    while written < o.events {
        let docs: Vec<Document> = batch.iter().take(o.events - written).cloned().collect();
        written += docs.len();
        coll.insert_many(docs).await.expect("insert");
    }
    let started = Instant::now();
    let mut stream = coll
        .watch()
        .resume_after(start)
        .batch_size(1000)
        .await
        .expect("resume");
    let mut seen = 0;
    while seen < o.events {
        match stream.next().await {
            Some(Ok(_)) => seen += 1,
            Some(Err(e)) => panic!("stream failed: {e}"),
            None => break,
        }
    }
    seen as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let o = options();
    let server = ServerHandle::start_blocking(Config::default()).expect("server starts");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut opts = ClientOptions::parse(server.uri()).await.expect("uri");
        opts.max_pool_size = Some(o.workers as u32 * 2);
        let client = Client::with_options(opts).expect("client");
        client.database("admin").run_command(doc! {"ping": 1}).await.expect("ping");
        let tps = transactions(&client, &o).await;
        println!("transactions/s: {tps:.0} ({} workers, {} s, update_one CAS + insert_one per transaction)", o.workers, o.seconds);
        let eps = change_events(&client, &o).await;
        println!("change-stream events/s: {eps:.0} ({} events)", o.events);
    });
}
