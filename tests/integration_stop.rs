//! Graceful stop: SIGTERM ends a run after its in-flight commit, within a bounded time, with
//! outputs for what was committed and the checkpoint consistent with the outbox.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::live::Live;

/// `handoff run` with its debug log, idle for `max_wait` seconds before it ends.
fn spawn(live: &Live, max_wait: &str) -> Child {
    live.command()
        .env("MAX_WAIT_SECONDS", max_wait)
        .env("HANDOFF_LOG", "handoff=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
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
    let live = Live::start();
    let mut child = spawn(&live, "30");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    wait_for(&mut stderr, "run starting", 1);
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    support::sigterm(&child);
    let output = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");
    assert_eq!(output.status.code(), Some(12));
    let outputs = support::outputs(&output);
    assert_eq!(outputs["status"], "IDLE");
    assert_eq!(outputs["stopped"], true);
    // Stopped before its idle watermark: the checkpoint holds only the stream's starting
    // position, saved before anything was read, and nothing was handed off.
    let checkpoint = live.checkpoint().expect("a checkpoint");
    let start = checkpoint
        .get_document("token")
        .expect("the starting position was saved");
    assert!(start.get_str("_data").is_ok());
    assert_eq!(checkpoint.get_str("mode").ok(), Some("resumeAfter"));
    live.insert(0..2);
    let out = support::ok(&spawn(&live, "1").wait_with_output().unwrap());
    assert_eq!(
        out["events_handed_off"], 2,
        "events after the saved position were lost"
    );
}

#[test]
fn sigterm_mid_handoff_keeps_checkpoint_and_outbox_consistent() {
    let live = Live::start();
    support::ok(&spawn(&live, "1").wait_with_output().unwrap());
    live.insert(0..400);
    let mut child = spawn(&live, "30");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    wait_for(&mut stderr, "event committed", 20);
    let sent = Instant::now();
    support::sigterm(&child);
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
    assert_eq!(&live.checkpoint_token(), last);
    // The next run continues from there: every event exactly once.
    support::ok(&spawn(&live, "1").wait_with_output().unwrap());
    let outbox = live.outbox();
    assert_eq!(outbox.len(), 400);
    let ids: std::collections::HashSet<_> = outbox
        .iter()
        .map(|r| r.get_str("_id").unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 400);
}
