//! Two runs racing on one consumer: one compare-and-set (the claim of the checkpoint) loses,
//! nothing is duplicated or lost.

use crate::support;

use std::sync::{Arc, Barrier};

use bson::{DateTime, Document};
use handoff::backend::memory::MemoryStore;
use handoff::backend::replay::Fixture;
use handoff::backend::replay::ReplaySource;
use handoff::domain::{Applied, CheckpointStore, Claim, Commit, CommitError, Dump};
use handoff::error::HandoffError;
use handoff::run::RawInputs;
use handoff::run::{Plan, begin};
use handoff::runtime::{Limits, PolicySource, Runtime};
use support::*;

/// A store that makes both runs load the checkpoint before either commits.
struct Gate {
    inner: MemoryStore,
    loaded: Barrier,
}

impl CheckpointStore for Gate {
    fn ensure_checkpoint(
        &self,
        consumer: &str,
        initial: Document,
    ) -> Result<Document, CommitError> {
        let doc = self.inner.ensure_checkpoint(consumer, initial);
        self.loaded.wait();
        doc
    }
    fn commit(&self, commit: &Commit<'_>) -> Result<Applied, CommitError> {
        self.inner.commit(commit)
    }
    fn claim(&self, consumer: &str, claim: &Claim) -> Result<(), CommitError> {
        self.inner.claim(consumer, claim)
    }
    fn release(&self, consumer: &str, owner: &str, at: DateTime) -> Result<(), CommitError> {
        self.inner.release(consumer, owner, at)
    }
    fn dump(&self, consumer: &str) -> Result<Dump, CommitError> {
        self.inner.dump(consumer)
    }
}

fn fixture_text(events: u32) -> String {
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    lines.extend((1..=events).map(|i| event(i, "insert")));
    lines.push(batch_end(events));
    lines.iter().map(|l| format!("{l}\n")).collect()
}

#[test]
fn two_runs_on_one_store_one_cas_loses_and_no_event_is_duplicated() {
    let runtime = Arc::new(Runtime::new(None).unwrap());
    let policy = Arc::new(runtime.load(&PolicySource::embedded_default()).unwrap());
    let fixture = Arc::new(Fixture::parse(&fixture_text(20)).unwrap());
    let inputs = RawInputs {
        database: "change_demo".into(),
        collection: "orders".into(),
        consumer_id: "orders-to-outbox".into(),
        checkpoint_collection: "cp".into(),
        outbox_collection: "ob".into(),
        quarantine_collection: "qb".into(),
        runs_collection: "runs".into(),
        runs_keep: 10,
        max_events: "500".into(),
        max_wait_seconds: "2".into(),
    }
    .validate()
    .unwrap();
    let store = Arc::new(Gate {
        inner: MemoryStore::new(),
        loaded: Barrier::new(2),
    });

    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (runtime, policy, fixture, inputs, store) = (
                    runtime.clone(),
                    policy.clone(),
                    fixture.clone(),
                    inputs.clone(),
                    store.clone(),
                );
                scope.spawn(move || {
                    let plan = Plan {
                        inputs,
                        params: vec![],
                        limits: Limits::default(),
                        stop: Default::default(),
                        outbox: Default::default(),
                        stream: Default::default(),
                        follow: None,
                        live: Default::default(),
                    };
                    let deadline = begin(&plan.limits);
                    let source = Box::new(ReplaySource::new(fixture));
                    plan.execute(&runtime, &policy, source, store, deadline)
                        .map_err(HandoffError::from)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let conflicts = results
        .iter()
        .filter(|r| matches!(r, Err(HandoffError::Conflict(_))))
        .count();
    let wins: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(conflicts, 1, "{results:?}");
    assert_eq!(wins.len(), 1, "{results:?}");
    let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    // Both read the checkpoint before either took it: the second claim misses the revision the
    // first one moved, so the loser stops at its start, before any commit.
    assert!(
        loser
            .to_string()
            .contains("Another run took this consumer's checkpoint while this one started"),
        "{loser}"
    );
    assert_eq!(loser.exit_code(), 3);

    // Every event exactly once, in stream order, and the checkpoint at the end of the stream.
    let Dump {
        checkpoint, outbox, ..
    } = store.dump("orders-to-outbox").unwrap();
    let ids: Vec<String> = outbox
        .iter()
        .map(|r| r.get_str("_id").unwrap().to_string())
        .collect();
    let expected: Vec<String> = (1..=20)
        .map(|i| format!("orders-to-outbox/{}", baseline_event_id(&token(i))))
        .collect();
    // The winner committed a prefix or all of them; whatever it committed appears once.
    assert!(!ids.is_empty());
    assert_eq!(ids, expected[..ids.len()].to_vec());
    assert_eq!(wins[0].committed.handed_off as usize, ids.len());
    assert!(checkpoint.is_some());
}

#[test]
fn two_processes_on_one_state_file_never_duplicate() {
    let s = Scratch::new();
    let fixture = s.path("twenty.jsonl");
    std::fs::write(&fixture, fixture_text(20)).unwrap();
    let spawn = || {
        handoff()
            .arg("replay")
            .arg(&fixture)
            .arg("--state")
            .arg(s.state())
            .args(["--state-lock-timeout-ms", "0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outputs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let mut handed_off = 0;
    for output in &outputs {
        match output.status.code() {
            Some(0) => handed_off += outputs_of(output),
            // The loser is told the consumer is busy, and wrote nothing.
            Some(3) => assert!(
                stderr(output).contains("in use by another run"),
                "{}",
                stderr(output)
            ),
            other => panic!("unexpected exit {other:?}: {}", stderr(output)),
        }
    }
    let (_, outbox) = inspect(&s.state());
    let expected: Vec<String> = (1..=20).map(|i| baseline_event_id(&token(i))).collect();
    assert_eq!(outbox_ids(&outbox), expected);
    assert_eq!(handed_off, 20);
}

fn outputs_of(output: &std::process::Output) -> u64 {
    outputs(output)["events_handed_off"].as_u64().unwrap()
}
