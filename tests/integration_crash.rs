//! Crash anywhere: `handoff run` processes are killed with SIGKILL at random moments while a
//! writer changes the source, and restarted, many times. Every source event ends up in the outbox
//! exactly once, in stream order, the checkpoint ends at the last one, and no run reported success
//! for work it did not commit.
//!
//! The moments are drawn from a seeded generator; the seed is printed and can be replayed with
//! `HANDOFF_CRASH_SEED=<seed>`. `HANDOFF_CRASH_KILLS=<n>` asks for more kills (default 30).

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use bson::doc;
use support::Rng;
use support::live::*;

/// The fewest kills a run of this suite must survive.
const MIN_KILLS: u32 = 25;
/// How many source operations the writer performs (each is one or more change events).
const STEPS: i32 = 90;

fn seed() -> u64 {
    support::seed("HANDOFF_CRASH_SEED")
}

/// The known sequence of source changes, paced by the generator. Returns the operation type of
/// every change event it caused, in commit order.
async fn write_sequence(
    client: mongodb::Client,
    db: mongodb::Database,
    seed: u64,
) -> Vec<&'static str> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let orders = db.collection::<bson::Document>("orders");
    let mut ops = Vec::new();
    for i in 0..STEPS {
        orders
            .insert_one(doc! {"_id": i, "qty": 0})
            .await
            .expect("insert");
        ops.push("insert");
        if i % 3 == 2 {
            orders
                .update_one(doc! {"_id": i - 1}, doc! {"$inc": {"qty": 1}})
                .await
                .expect("update");
            ops.push("update");
        }
        if i % 5 == 4 {
            orders
                .delete_one(doc! {"_id": i - 2})
                .await
                .expect("delete");
            ops.push("delete");
        }
        if i == STEPS / 2 {
            // A multi-document transaction: three inserts and an update, one commit.
            let mut session = client.start_session().await.expect("session");
            session.start_transaction().await.expect("start");
            for k in 0..3 {
                orders
                    .insert_one(doc! {"_id": 1000 + k, "txn": true})
                    .session(&mut session)
                    .await
                    .expect("txn insert");
                ops.push("insert");
            }
            orders
                .update_one(doc! {"_id": i}, doc! {"$set": {"txn": true}})
                .session(&mut session)
                .await
                .expect("txn update");
            ops.push("update");
            session.commit_transaction().await.expect("commit");
        }
        tokio::time::sleep(Duration::from_millis(rng.below(240))).await;
    }
    ops
}

/// A `handoff run` under watch: its stderr is read as it comes, and every commit it logs is
/// signalled.
struct Watched {
    child: Child,
    commits: Receiver<()>,
    log: std::thread::JoinHandle<String>,
}

impl Watched {
    fn spawn(live: &Live) -> Watched {
        let mut command = live.command();
        command
            .env("HANDOFF_LOG", "handoff=debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn handoff");
        let stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let (tx, commits) = std::sync::mpsc::channel();
        let log = std::thread::spawn(move || {
            let mut text = String::new();
            for line in stderr.lines() {
                let Ok(line) = line else { break };
                if line.contains("event committed") {
                    let _ = tx.send(());
                }
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        Watched {
            child,
            commits,
            log,
        }
    }

    /// Waits up to `limit` for the process to exit; true when it did.
    fn exits_within(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            if self.child.try_wait().expect("try_wait").is_some() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the process has logged `n` commits (or ended, or `limit` passed); returns how
    /// many it saw.
    fn commits_seen(&self, n: u64, limit: Duration) -> u64 {
        let until = Instant::now() + limit;
        let mut seen = 0;
        while seen < n {
            let left = until.saturating_duration_since(Instant::now());
            match self.commits.recv_timeout(left) {
                Ok(()) => seen += 1,
                Err(_) => break,
            }
        }
        seen
    }

    fn finish(mut self) -> Finished {
        let status = self.child.wait().expect("wait");
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut stdout)
            .expect("read stdout");
        Finished {
            code: status.code(),
            stdout,
            stderr: self.log.join().expect("log reader"),
        }
    }
}

struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Finished {
    /// The outputs line of the run, if it printed one.
    fn outputs(&self) -> Option<serde_json::Value> {
        self.stdout.lines().find_map(|line| {
            let inner = line.strip_prefix("::")?.strip_suffix("::")?;
            let value: serde_json::Value = serde_json::from_str(inner).ok()?;
            value.get("outputs").cloned()
        })
    }
}

#[derive(Default, Debug)]
struct Tally {
    runs: u32,
    kills: u32,
    /// Kills that struck a run after it had committed at least one event.
    kills_mid_handoff: u32,
    successes: u32,
    unavailable: u32,
}

/// Checks one finished run against what the outbox gained while it ran (one run at a time):
/// a reported success covers exactly the records it committed.
fn check_run(live: &Live, run: &Finished, before: usize, tally: &mut Tally, seed: u64) {
    tally.runs += 1;
    let after = live.outbox_len();
    assert!(after >= before, "the outbox shrank (seed {seed})");
    let reported = run.outputs();
    match run.code {
        Some(0) => {
            tally.successes += 1;
            assert!(
                reported.is_some(),
                "exit 0 without outputs (seed {seed}): {}",
                run.stderr
            );
        }
        // Killed: its commits stand; if it got as far as its outputs, they must be true too.
        None => {}
        // A killed run's open transaction can hold the checkpoint until the server reaps it: the
        // next run may find the store busy and must say so, having written nothing.
        Some(10) => {
            tally.unavailable += 1;
            assert!(
                run.stderr.contains("error[unavailable]")
                    && run.stderr.contains("WriteConflict (code 112)"),
                "exit 10 for another reason (seed {seed}): {}",
                run.stderr
            );
            assert_eq!(after, before, "exit 10 after writing (seed {seed})");
            let reported = reported.as_ref().expect("the failure's outputs");
            assert_eq!(reported["status"], "FAILED", "seed {seed}");
            assert_eq!(reported["error_class"], "unavailable", "seed {seed}");
        }
        Some(code) => panic!("unexpected exit {code} (seed {seed}): {}", run.stderr),
    }
    if let Some(outputs) = reported {
        let handed_off = outputs["events_handed_off"].as_u64().expect("count") as usize;
        assert_eq!(
            handed_off,
            after - before,
            "a run reported {handed_off} event(s) but committed {} (seed {seed})",
            after - before
        );
        if handed_off > 0 {
            let outbox = live.outbox();
            let last = outbox
                .last()
                .expect("a record")
                .get_document("event")
                .unwrap();
            assert_eq!(outputs["last_event_id"], event_id(last), "seed {seed}");
        }
    }
}

#[test]
fn killed_runs_lose_nothing_and_hand_off_nothing_twice() {
    let seed = seed();
    let target: u32 = std::env::var("HANDOFF_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
        .max(MIN_KILLS);
    eprintln!("HANDOFF_CRASH_SEED={seed} (kills wanted: {target})");
    let mut rng = Rng::new(seed);
    // The server runs in this process and outlives every killed run. A killed run's open
    // transaction is reaped after a second, as a real server does after its lifetime limit (a
    // minute by default, hence always a test server of its own).
    let live = Live::for_kills();
    let start = live.start_consumer();

    let writer = live.background(async move |client, db| write_sequence(client, db, seed).await);
    let mut tally = Tally::default();
    let give_up = Instant::now() + Duration::from_secs(50 + u64::from(target));
    while tally.kills < target || !writer.is_finished() {
        assert!(
            Instant::now() < give_up,
            "too slow: {tally:?} (seed {seed})"
        );
        let before = live.outbox_len();
        let mut run = Watched::spawn(&live);
        // Half the kills strike at a random moment (start-up, connecting, reading, idling),
        // half right after the run logged its n-th commit, while it works on the next one.
        let mut after_commits = false;
        let exited = if rng.below(2) == 0 {
            run.exits_within(Duration::from_millis(rng.below(1500)))
        } else {
            let n = 1 + rng.below(6);
            after_commits = run.commits_seen(n, Duration::from_secs(3)) == n;
            run.exits_within(Duration::ZERO)
        };
        if !exited {
            run.child.kill().expect("SIGKILL");
            tally.kills += 1;
            tally.kills_mid_handoff += u32::from(after_commits);
        }
        let finished = run.finish();
        if !exited {
            // The killed run's lease would hold the consumer for a minute: let it expire now,
            // as the server lets its open transaction expire after a second.
            live.expire_lease();
        }
        check_run(&live, &finished, before, &mut tally, seed);
    }
    let ops = writer.join().expect("writer");

    // Unhindered runs drain what is left; the last one finds nothing new.
    let mut drained = false;
    for _ in 0..10 {
        let before = live.outbox_len();
        let finished = Watched::spawn(&live).finish();
        check_run(&live, &finished, before, &mut tally, seed);
        if finished.code == Some(0)
            && finished.outputs().expect("outputs")["events_handed_off"] == 0
        {
            drained = true;
            break;
        }
    }
    assert!(drained, "the consumer never caught up (seed {seed})");

    // Every source event exactly once, in stream order, as the server's own stream holds them.
    let stream = live.events_after(&start);
    assert_eq!(stream.len(), ops.len(), "seed {seed}");
    let stream_ops: Vec<&str> = stream
        .iter()
        .map(|e| e.get_str("operationType").unwrap())
        .collect();
    assert_eq!(stream_ops, ops, "seed {seed}");
    let expected: Vec<String> = stream.iter().map(event_id).collect();
    let outbox = live.outbox();
    assert_eq!(outbox_event_ids(&outbox), expected, "seed {seed}");
    for (record, event) in outbox.iter().zip(&stream) {
        let handed = record.get_document("event").unwrap();
        for key in ["_id", "operationType", "ns", "documentKey", "clusterTime"] {
            assert_eq!(handed.get(key), event.get(key), "{key} (seed {seed})");
        }
    }
    assert_checkpoint_at_end(&live, stream.last().unwrap().get_document("_id").unwrap());

    eprintln!(
        "survived {} kills ({} mid-handoff) in {} runs ({} succeeded, {} found the store busy); {} events handed off once each (seed {seed})",
        tally.kills,
        tally.kills_mid_handoff,
        tally.runs,
        tally.successes,
        tally.unavailable,
        outbox.len()
    );
    assert!(tally.kills >= MIN_KILLS, "{tally:?}");
}
