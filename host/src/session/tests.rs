//! The session's rules on recorded streams and in-memory stores.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use sha2::{Digest, Sha256};

use super::*;
use crate::backend::memory::MemoryStore;
use crate::backend::replay::{Fixture, ReplaySource};
use crate::domain::token::canonical_text;
use crate::domain::{Applied, Commit, CommitError, Dump, Start, StreamError};

/// A memory store that remembers the size of every transaction it committed.
#[derive(Default)]
struct Counting {
    inner: MemoryStore,
    transactions: Mutex<Vec<(usize, usize)>>,
}

impl CheckpointStore for Counting {
    fn ensure_checkpoint(
        &self,
        consumer: &str,
        initial: Document,
    ) -> Result<Document, CommitError> {
        self.inner.ensure_checkpoint(consumer, initial)
    }
    fn commit(&self, commit: &Commit<'_>) -> Result<Applied, CommitError> {
        let applied = self.inner.commit(commit)?;
        let bytes = commit.outbox.iter().map(bson_size).sum();
        self.transactions
            .lock()
            .unwrap()
            .push((commit.outbox.len(), bytes));
        Ok(applied)
    }
    fn dump(&self, consumer: &str) -> Result<Dump, CommitError> {
        self.inner.dump(consumer)
    }
}

fn token(seq: u32) -> Document {
    doc! {"_data": format!("82{seq:08X}2B0429296E1404")}
}

/// A recording of `sizes.len()` inserts, the n-th carrying a string of `sizes[n]` bytes.
fn fixture(sizes: &[usize], last_invalidate: bool) -> Arc<Fixture> {
    let mut text = String::new();
    for (n, size) in sizes.iter().enumerate() {
        let seq = n as u32 + 1;
        let op = if last_invalidate && n + 1 == sizes.len() {
            "invalidate"
        } else {
            "insert"
        };
        let event = doc! {
            "_id": token(seq),
            "operationType": op,
            "ns": {"db": "d", "coll": "c"},
            "fullDocument": {"_id": seq, "pad": "x".repeat(*size)},
        };
        let json = bson::Bson::Document(event).into_relaxed_extjson();
        text.push_str(&json.to_string());
        text.push('\n');
    }
    Arc::new(Fixture::parse(&text).expect("fixture"))
}

fn session(
    fixture: Arc<Fixture>,
    store: Arc<dyn CheckpointStore>,
    token: Option<Document>,
    mode: Mode,
) -> Session {
    let consumer = Consumer {
        consumer: "c".into(),
        source: "d.c".into(),
    };
    let mut initial = crate::domain::checkpoint::initial("c", "d.c", "0");
    if let Some(t) = &token {
        initial.insert("token", t.clone());
        initial.insert("mode", mode.as_str());
    }
    store.ensure_checkpoint("c", initial).unwrap();
    Session::new(
        consumer,
        Deployment {
            set_name: "rs".into(),
            replica_set_id: "0".into(),
        },
        Checkpoint { token, mode },
        Box::new(ReplaySource::new(fixture)),
        store,
        Instant::now() + Duration::from_secs(600),
    )
}

fn deliver(session: &mut Session, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| session.next_event().unwrap().expect("an event").token)
        .collect()
}

#[test]
fn a_batch_over_the_transaction_bound_is_written_as_consecutive_transactions() {
    let store = Arc::new(Counting::default());
    let mut s = session(
        fixture(&[3000; 10], false),
        store.clone(),
        None,
        Mode::ResumeAfter,
    )
    .with_bounds(Bounds {
        max_transaction_bytes: 10_000,
        ..Bounds::default()
    });
    s.open_stream(Start::Now).unwrap();
    let tokens = deliver(&mut s, 10);
    let decisions = (0..10)
        .map(|i| Decision::HandOff(format!("e{i}")))
        .collect();
    s.commit_batch(None, &tokens[9], Mode::ResumeAfter, decisions)
        .unwrap();
    let transactions = store.transactions.lock().unwrap().clone();
    assert!(transactions.len() >= 4, "{transactions:?}");
    assert_eq!(transactions.iter().map(|t| t.0).sum::<usize>(), 10);
    assert!(
        transactions.iter().all(|t| t.1 <= 10_000),
        "{transactions:?}"
    );
    assert_eq!(s.committed().handed_off, 10);
    assert_eq!(s.checkpoint().0.as_deref(), Some(tokens[9].as_str()));
    let dump = store.dump("c").unwrap();
    assert_eq!(dump.outbox.len(), 10);
}

#[test]
fn a_record_over_the_document_limit_writes_nothing() {
    let store = Arc::new(Counting::default());
    let mut s = session(
        fixture(&[100, 5000], false),
        store.clone(),
        None,
        Mode::ResumeAfter,
    )
    .with_bounds(Bounds {
        max_record_bytes: 4000,
        ..Bounds::default()
    });
    s.open_stream(Start::Now).unwrap();
    let tokens = deliver(&mut s, 2);
    let decisions = vec![Decision::HandOff("a".into()), Decision::HandOff("b".into())];
    let error = s
        .commit_batch(None, &tokens[1], Mode::ResumeAfter, decisions)
        .unwrap_err();
    assert!(format!("{error:?}").contains("document limit"), "{error:?}");
    assert!(store.transactions.lock().unwrap().is_empty());
    assert!(store.dump("c").unwrap().outbox.is_empty());
}

#[test]
fn pending_events_are_bounded_by_bytes() {
    let store = Arc::new(MemoryStore::new());
    let mut s =
        session(fixture(&[3000; 5], false), store, None, Mode::ResumeAfter).with_bounds(Bounds {
            max_pending_bytes: 7000,
            ..Bounds::default()
        });
    s.open_stream(Start::Now).unwrap();
    deliver(&mut s, 3);
    let error = s.next_event().unwrap_err();
    assert!(
        error.kind == RefusalKind::Rejected && error.message.contains("waiting for their commit"),
        "{error:?}"
    );
    assert!(matches!(s.failure(), Some(HandoffError::Policy(_))));
}

#[test]
fn the_host_enforces_max_events() {
    let store = Arc::new(MemoryStore::new());
    let mut s =
        session(fixture(&[10; 5], false), store, None, Mode::ResumeAfter).with_max_events(2);
    s.open_stream(Start::Now).unwrap();
    deliver(&mut s, 2);
    let error = s.next_event().unwrap_err();
    assert!(
        error.kind == RefusalKind::Rejected && error.message.contains("max_events = 2"),
        "{error:?}"
    );
}

#[test]
fn the_stream_opens_only_with_the_saved_mode() {
    for (saved, asked) in [
        (
            Mode::StartAfter,
            Start::ResumeAfter(canonical_text(&token(1))),
        ),
        (
            Mode::ResumeAfter,
            Start::StartAfter(canonical_text(&token(1))),
        ),
    ] {
        let store = Arc::new(MemoryStore::new());
        let mut s = session(fixture(&[10; 3], false), store, Some(token(1)), saved);
        let error = s.open_stream(asked).unwrap_err();
        assert!(
            error.kind == RefusalKind::Rejected
                && error.message.contains("must open with that mode"),
            "{error:?}"
        );
    }
    let store = Arc::new(MemoryStore::new());
    let mut s = session(
        fixture(&[10; 3], false),
        store,
        Some(token(1)),
        Mode::StartAfter,
    );
    s.open_stream(Start::StartAfter(canonical_text(&token(1))))
        .unwrap();
}

/// A source whose "now" has a position, as a live stream's first post-batch token.
struct Positioned(ReplaySource, Document);

impl ChangeSource for Positioned {
    fn deployment(&mut self) -> crate::error::Result<Deployment> {
        self.0.deployment()
    }
    fn open(&mut self, start: Start<Document>) -> Result<(), StreamError> {
        self.0.open(start)
    }
    fn next(&mut self) -> Result<Option<Document>, StreamError> {
        self.0.next()
    }
    fn watermark(&self) -> Option<Document> {
        self.0.watermark().or_else(|| Some(self.1.clone()))
    }
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}

#[test]
fn a_fresh_stream_saves_its_starting_position_before_delivering_anything() {
    let store = Arc::new(MemoryStore::new());
    let mut s = session(
        fixture(&[10; 2], false),
        store.clone(),
        None,
        Mode::ResumeAfter,
    );
    s.source = Box::new(Positioned(
        ReplaySource::new(fixture(&[10; 2], false)),
        token(0),
    ));
    s.open_stream(Start::Now).unwrap();
    // Saved before any event is read: a run that fails now leaves the position behind.
    let saved = store.dump("c").unwrap().checkpoint.unwrap();
    assert_eq!(saved.get_document("token").unwrap(), &token(0));
    // The policy still holds "no token" and may commit from it.
    let tokens = deliver(&mut s, 1);
    s.commit(None, &tokens[0], Mode::ResumeAfter, Some("a"))
        .unwrap();
    // After its first commit, only the real token is accepted.
    let tokens = deliver(&mut s, 1);
    assert!(
        s.commit(None, &tokens[0], Mode::ResumeAfter, Some("b"))
            .is_err()
    );
}

#[test]
fn an_invalidated_run_reports_the_invalidate_events_id() {
    let store = Arc::new(MemoryStore::new());
    let mut s = session(fixture(&[10; 2], true), store, None, Mode::ResumeAfter);
    s.open_stream(Start::Now).unwrap();
    let tokens = deliver(&mut s, 2);
    s.commit(None, &tokens[0], Mode::ResumeAfter, Some("a"))
        .unwrap();
    s.commit(Some(&tokens[0]), &tokens[1], Mode::StartAfter, None)
        .unwrap();
    let invalidate_id = hex::encode(Sha256::digest(tokens[1].as_bytes()));
    assert_eq!(s.committed().last_event_id, invalidate_id);
    let report = |id: &str| Report {
        status: Status::Invalidated,
        events_handed_off: 1,
        last_event_id: id.into(),
    };
    // Both the baseline's ID and, from older policies, the last outbox ID are accepted.
    let summary = s.finish(Ok(report(&invalidate_id))).unwrap();
    assert_eq!(summary.committed.last_event_id, invalidate_id);
    assert!(s.finish(Ok(report("a"))).is_ok());
    assert!(s.finish(Ok(report("zz"))).is_err());
}
