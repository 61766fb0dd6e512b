//! Graceful stop: SIGTERM ends a run after its in-flight commit, within a bounded time, with
//! outputs for what was committed and the checkpoint consistent with the outbox.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use futures_util::TryStreamExt;
use mongo_sim::{Config, ServerHandle};

struct Live {
    server: ServerHandle,
    rt: tokio::runtime::Runtime,
    client: mongodb::Client,
}

impl Live {
    fn new() -> Live {
        let server = ServerHandle::start_blocking(Config::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt
            .block_on(async { mongodb::Client::with_uri_str(server.uri()).await })
            .unwrap();
        Live { server, rt, client }
    }

    fn spawn(&self, max_wait: &str) -> Child {
        support::handoff()
            .arg("run")
            .env("MONGODB_URI", self.server.uri())
            .env("MAX_EVENTS", "500")
            .env("MAX_WAIT_SECONDS", max_wait)
            .env("HANDOFF_LOG", "handoff=debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn outbox(&self) -> Vec<Document> {
        self.rt.block_on(async {
            let coll = self
                .client
                .database("change_demo")
                .collection::<Document>("kestra_change_outbox");
            coll.find(doc! {})
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap()
        })
    }

    fn checkpoint(&self) -> Document {
        self.rt.block_on(async {
            let coll = self
                .client
                .database("change_demo")
                .collection::<Document>("kestra_change_checkpoints");
            coll.find_one(doc! {"_id": "orders-to-outbox"})
                .await
                .unwrap()
                .unwrap()
        })
    }

    fn insert(&self, range: std::ops::Range<i32>) {
        self.rt.block_on(async {
            let coll = self
                .client
                .database("change_demo")
                .collection::<Document>("orders");
            coll.insert_many(range.map(|i| doc! {"_id": i}).collect::<Vec<_>>())
                .await
                .unwrap();
        });
    }
}

fn sigterm(child: &Child) {
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits until the child's log shows `needle` `count` times; returns the lines read so far.
fn wait_for(reader: &mut impl BufRead, needle: &str, count: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen < count && Instant::now() < deadline {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.contains(needle) {
            seen += 1;
        }
        lines.push(line);
    }
    assert_eq!(seen, count, "{needle:?} seen {seen} times: {lines:?}");
    lines
}

#[test]
fn sigterm_while_idle_stops_promptly_with_outputs_and_no_watermark() {
    let live = Live::new();
    let mut child = live.spawn("30");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    wait_for(&mut stderr, "run starting", 1);
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    sigterm(&child);
    let output = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");
    assert_eq!(output.status.code(), Some(12));
    let outputs = support::outputs(&output);
    assert_eq!(outputs["status"], "IDLE");
    assert_eq!(outputs["stopped"], true);
    // Stopped before its idle watermark: the checkpoint holds only the stream's starting
    // position, saved before anything was read, and nothing was handed off.
    let checkpoint = live.checkpoint();
    let start = checkpoint
        .get_document("token")
        .expect("the starting position was saved");
    assert!(start.get_str("_data").is_ok());
    assert_eq!(checkpoint.get_str("mode").ok(), Some("resumeAfter"));
    live.insert(0..2);
    let out = support::ok(&live.spawn("1").wait_with_output().unwrap());
    assert_eq!(
        out["events_handed_off"], 2,
        "events after the saved position were lost"
    );
}

#[test]
fn sigterm_mid_handoff_keeps_checkpoint_and_outbox_consistent() {
    let live = Live::new();
    support::ok(&live.spawn("1").wait_with_output().unwrap());
    live.insert(0..400);
    let mut child = live.spawn("30");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    wait_for(&mut stderr, "event committed", 20);
    let sent = Instant::now();
    sigterm(&child);
    let output = child.wait_with_output().unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "stopping took {:?}",
        sent.elapsed()
    );
    assert_eq!(
        output.status.code(),
        Some(12),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let outputs = support::outputs(&output);
    assert_eq!(outputs["stopped"], true);
    let reported = outputs["events_handed_off"].as_u64().unwrap() as usize;
    let outbox = live.outbox();
    // What the run reported is exactly what it committed, and the checkpoint is at the last of it.
    assert!((20..400).contains(&reported), "{reported}");
    assert_eq!(outbox.len(), reported);
    let last = outbox
        .last()
        .unwrap()
        .get_document("event")
        .unwrap()
        .get_document("_id")
        .unwrap();
    assert_eq!(live.checkpoint().get_document("token").unwrap(), last);
    // The next run continues from there: every event exactly once.
    support::ok(&live.spawn("1").wait_with_output().unwrap());
    let outbox = live.outbox();
    assert_eq!(outbox.len(), 400);
    let ids: std::collections::HashSet<_> = outbox
        .iter()
        .map(|r| r.get_str("_id").unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 400);
}
