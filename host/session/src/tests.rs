//! The session's rules on recorded streams and in-memory stores.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Document, doc};
use sha2::{Digest, Sha256};

use super::*;
use handoff_backend::memory::MemoryStore;
use handoff_backend::replay::{Fixture, ReplaySource};
use handoff_domain::token::canonical_text;
use handoff_domain::{Applied, Claim, Commit, CommitError, Dump, Start, StreamError};

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
        let bytes = commit.outbox.iter().map(|r| r.as_bytes().len()).sum();
        self.transactions
            .lock()
            .unwrap()
            .push((commit.outbox.len(), bytes));
        Ok(applied)
    }
    fn claim(&self, consumer: &str, claim: &Claim) -> Result<(), CommitError> {
        self.inner.claim(consumer, claim)
    }
    fn release(&self, consumer: &str, owner: &str, at: bson::DateTime) -> Result<(), CommitError> {
        self.inner.release(consumer, owner, at)
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
    let mut initial = handoff_domain::checkpoint::initial("c", "d.c", "0");
    if let Some(t) = &token {
        initial.insert("token", t.clone());
        initial.insert("mode", mode.as_str());
    }
    store.ensure_checkpoint("c", initial).unwrap();
    Session::new(
        consumer,
        Deployment::replica_set("rs", "0"),
        Checkpoint::at(token, mode),
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
    fn deployment(&mut self) -> handoff_domain::error::Result<Deployment> {
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
    let report = |id: &str| PolicyReport {
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

/// A recording of lines given as documents, each an event (or a fragment of one).
fn recording(events: Vec<Document>) -> Arc<Fixture> {
    let text: String = events
        .into_iter()
        .map(|event| format!("{}\n", bson::Bson::Document(event).into_relaxed_extjson()))
        .collect();
    Arc::new(Fixture::parse(&text).expect("fixture"))
}

/// A session over `events` that joins split events, its stream open from now.
fn split_session(events: Vec<Document>, store: Arc<dyn CheckpointStore>) -> Session {
    let mut s = session(recording(events), store, None, Mode::ResumeAfter).with_split_events(true);
    s.open_stream(Start::Now).unwrap();
    s
}

/// Event 1 whole, event 2 in three fragments (tokens 2, 3, 4), event 5 whole.
fn with_split_event() -> Vec<Document> {
    vec![
        doc! {"_id": token(1), "operationType": "insert", "documentKey": {"_id": 1}, "fullDocument": {"_id": 1}},
        doc! {"_id": token(2), "splitEvent": {"fragment": 1, "of": 3}, "operationType": "update",
        "documentKey": {"_id": 2}, "ns": {"db": "d", "coll": "c"}},
        doc! {"_id": token(3), "splitEvent": {"fragment": 2, "of": 3}, "fullDocument": {"_id": 2, "big": "after"}},
        doc! {"_id": token(4), "splitEvent": {"fragment": 3, "of": 3}, "fullDocumentBeforeChange": {"_id": 2, "big": "before"}},
        doc! {"_id": token(5), "operationType": "insert", "documentKey": {"_id": 5}, "fullDocument": {"_id": 5}},
    ]
}

#[test]
fn a_split_event_is_delivered_committed_and_resumed_from_as_one() {
    let store = Arc::new(Counting::default());
    let mut s = split_session(with_split_event(), store.clone());
    let tokens = deliver(&mut s, 2);
    // The policy sees the event once, by its first fragment's token, and reads fields across
    // its fragments.
    assert_eq!(tokens[1], canonical_text(&token(2)));
    let field = |s: &Session, path: &str| s.field(&tokens[1], path);
    assert_eq!(field(&s, "operationType").as_deref(), Some("\"update\""));
    assert_eq!(field(&s, "fullDocument.big").as_deref(), Some("\"after\""));
    assert_eq!(
        field(&s, "fullDocumentBeforeChange.big").as_deref(),
        Some("\"before\"")
    );
    assert_eq!(field(&s, "missing"), None);
    s.commit_batch(
        None,
        &tokens[1],
        Mode::ResumeAfter,
        vec![Decision::HandOff("a".into()), Decision::HandOff("b".into())],
    )
    .unwrap();
    // One transaction: the whole event's fragments, one record each, and the checkpoint at its
    // last fragment.
    assert_eq!(store.transactions.lock().unwrap().len(), 1);
    let dump = store.dump("c").unwrap();
    let ids: Vec<&str> = dump
        .outbox
        .iter()
        .map(|r| r.get_str("_id").unwrap())
        .collect();
    assert_eq!(ids, ["c/a", "c/b.1of3", "c/b.2of3", "c/b.3of3"]);
    assert_eq!(
        dump.outbox[2].get_document("event").unwrap(),
        &with_split_event()[2]
    );
    let checkpoint = dump.checkpoint.unwrap();
    assert_eq!(checkpoint.get_document("token").unwrap(), &token(4));
    assert_eq!(s.committed().handed_off, 2);
    // The next event follows; a new run resumes after the last fragment.
    assert_eq!(deliver(&mut s, 1), [canonical_text(&token(5))]);
    let mut resumed = session(
        recording(with_split_event()),
        store.clone(),
        Some(token(4)),
        Mode::ResumeAfter,
    )
    .with_split_events(true);
    resumed
        .open_stream(Start::ResumeAfter(canonical_text(&token(4))))
        .unwrap();
    assert_eq!(deliver(&mut resumed, 1), [canonical_text(&token(5))]);
}

#[test]
fn a_split_event_quarantined_keeps_a_record_per_fragment() {
    let store = Arc::new(MemoryStore::new());
    let mut s = split_session(with_split_event(), store.clone());
    let tokens = deliver(&mut s, 2);
    s.commit_batch(
        None,
        &tokens[1],
        Mode::ResumeAfter,
        vec![
            Decision::Skip("not needed".into()),
            Decision::Quarantine {
                id: "q".into(),
                reason: "poison".into(),
            },
        ],
    )
    .unwrap();
    let dump = store.dump("c").unwrap();
    assert!(dump.outbox.is_empty());
    let tokens_kept: Vec<&Document> = dump
        .quarantine
        .iter()
        .map(|r| r.get_document("token").unwrap())
        .collect();
    assert_eq!(tokens_kept, [&token(2), &token(3), &token(4)]);
    assert_eq!(dump.quarantine[0].get_str("_id").unwrap(), "c/q.1of3");
    assert_eq!(s.committed().quarantined, 1);
}

#[test]
fn a_split_event_out_of_order_ends_the_run() {
    let whole = with_split_event();
    for (events, says) in [
        // A later fragment without its first.
        (
            vec![whole[2].clone(), whole[4].clone()],
            "without its first fragment",
        ),
        // The stream goes on to another event in the middle of one.
        (
            vec![whole[1].clone(), whole[2].clone(), whole[4].clone()],
            "interrupted a split event after fragment 2 of 3",
        ),
        // Fragments out of order.
        (
            vec![whole[1].clone(), whole[3].clone(), whole[2].clone()],
            "interrupted a split event after fragment 1 of 3",
        ),
        (
            vec![
                doc! {"_id": token(9), "splitEvent": {"fragment": 4, "of": 3}, "operationType": "update"},
            ],
            "malformed splitEvent",
        ),
    ] {
        let store = Arc::new(MemoryStore::new());
        let mut s = split_session(events, store.clone());
        let error = s.next_event().unwrap_err();
        assert_eq!(error.kind, RefusalKind::Fatal, "{error:?}");
        assert!(
            matches!(s.failure(), Some(HandoffError::StreamFatal(m)) if m.contains(says)),
            "{says}: {:?}",
            s.failure()
        );
        assert!(store.dump("c").unwrap().outbox.is_empty());
    }
}

#[test]
fn a_split_event_whose_last_fragment_never_comes_ends_the_run() {
    let whole = with_split_event();
    let store = Arc::new(MemoryStore::new());
    let mut s = split_session(vec![whole[1].clone(), whole[2].clone()], store);
    let error = s.next_event().unwrap_err();
    assert_eq!(error.kind, RefusalKind::Fatal, "{error:?}");
    assert!(
        matches!(s.failure(), Some(HandoffError::StreamFatal(m)) if m.contains("did not arrive")),
        "{:?}",
        s.failure()
    );
}

#[test]
fn an_invalidation_marker_goes_with_the_invalidations_commit() {
    let store = Arc::new(MemoryStore::new());
    let mut s = session(
        fixture(&[10, 10], true),
        store.clone(),
        None,
        Mode::ResumeAfter,
    )
    .with_outbox_options(OutboxOptions {
        invalidate_marker: true,
        ..OutboxOptions::default()
    });
    s.open_stream(Start::Now).unwrap();
    let tokens = deliver(&mut s, 2);
    s.commit_batch(
        None,
        &tokens[1],
        Mode::StartAfter,
        vec![
            Decision::HandOff("a".into()),
            Decision::Skip("invalidate".into()),
        ],
    )
    .unwrap();
    let dump = store.dump("c").unwrap();
    assert_eq!(dump.outbox.len(), 2);
    let marker = &dump.outbox[1];
    let id = hex::encode(Sha256::digest(tokens[1].as_bytes()));
    assert_eq!(marker.get_str("_id").unwrap(), format!("c/{id}"));
    assert_eq!(marker.get_str("marker").unwrap(), "invalidate");
    assert_eq!(s.committed().handed_off, 1);
    assert_eq!(s.committed().invalidate_markers, 1);
    assert_eq!(s.committed().last_event_id, id);
}

#[test]
fn without_split_events_a_split_event_field_joins_nothing() {
    // Documents whose data brings up a `splitEvent` field (a pipeline replacing the event by its
    // document, say): without --split-large-events each is an event of its own.
    let forged = vec![
        doc! {"_id": token(1), "operationType": "insert", "splitEvent": {"fragment": 1, "of": 2}},
        doc! {"_id": token(2), "operationType": "insert", "splitEvent": {"fragment": 2, "of": 2}},
        doc! {"_id": token(3), "operationType": "insert", "splitEvent": {"fragment": 2, "of": 2}},
    ];
    let store = Arc::new(MemoryStore::new());
    let mut s = session(recording(forged), store.clone(), None, Mode::ResumeAfter);
    s.open_stream(Start::Now).unwrap();
    let tokens = deliver(&mut s, 3);
    s.commit_batch(
        None,
        &tokens[2],
        Mode::ResumeAfter,
        (0..3).map(|i| Decision::HandOff(format!("e{i}"))).collect(),
    )
    .unwrap();
    let dump = store.dump("c").unwrap();
    let ids: Vec<&str> = dump
        .outbox
        .iter()
        .map(|r| r.get_str("_id").unwrap())
        .collect();
    assert_eq!(ids, ["c/e0", "c/e1", "c/e2"]);
    assert_eq!(
        dump.checkpoint.unwrap().get_document("token").unwrap(),
        &token(3)
    );
}

/// A recorded stream watched as a database stream would be: collections named `state_*` are
/// handoff's own.
struct Wide(ReplaySource);

impl handoff_domain::ChangeSource for Wide {
    fn deployment(&mut self) -> handoff_domain::error::Result<Deployment> {
        self.0.deployment()
    }
    fn open(&mut self, start: Start<Document>) -> Result<(), StreamError> {
        self.0.open(start)
    }
    fn next(&mut self) -> Result<Option<Document>, StreamError> {
        self.0.next()
    }
    fn is_wide(&self) -> bool {
        true
    }
    fn is_state(&mut self, _database: &str, collection: &str) -> Result<bool, StreamError> {
        Ok(collection.starts_with("state_"))
    }
    fn watermark(&self) -> Option<Document> {
        self.0.watermark()
    }
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}

#[test]
fn a_wide_stream_never_delivers_state_events_and_needs_every_events_namespace() {
    let events = [
        doc! {"_id": token(1), "operationType": "insert", "ns": {"db": "d", "coll": "orders"}, "documentKey": {"_id": 1}},
        // A reader deleting an outbox record: no document, only its key.
        doc! {"_id": token(2), "operationType": "delete", "ns": {"db": "d", "coll": "state_outbox"}, "documentKey": {"_id": "c/x"}},
        doc! {"_id": token(3), "operationType": "update", "ns": {"db": "e", "coll": "state_points"}, "documentKey": {"_id": "c"}},
        doc! {"_id": token(4), "operationType": "dropDatabase", "ns": {"db": "e"}},
        doc! {"_id": token(5), "operationType": "update", "documentKey": {"_id": 2}},
    ];
    let text: String = events
        .into_iter()
        .map(|e| format!("{}\n", bson::Bson::Document(e).into_relaxed_extjson()))
        .collect();
    let fixture = Arc::new(Fixture::parse(&text).expect("fixture"));
    let store: Arc<dyn CheckpointStore> = Arc::new(MemoryStore::new());
    let mut initial = handoff_domain::checkpoint::initial("c", "d", "0");
    initial.insert("token", bson::Bson::Null);
    store.ensure_checkpoint("c", initial).unwrap();
    let mut s = Session::new(
        Consumer {
            consumer: "c".into(),
            source: "d".into(),
        },
        Deployment::replica_set("rs", "0"),
        Checkpoint::at(None, Mode::ResumeAfter),
        Box::new(Wide(ReplaySource::new(fixture))),
        store,
        Instant::now() + Duration::from_secs(600),
    );
    s.open_stream(Start::Now).unwrap();
    let first = s.next_event().unwrap().expect("the application's insert");
    assert_eq!(first.namespace.as_deref(), Some("d.orders"));
    // The two state events are passed over; a database's own event is not state.
    let second = s.next_event().unwrap().expect("the database's drop");
    assert_eq!(second.token, canonical_text(&token(4)));
    assert_eq!(second.namespace.as_deref(), Some("e"));
    assert!(s.next_event().is_err());
    assert!(
        matches!(s.failure(), Some(HandoffError::StreamFatal(m)) if m.contains("namespace (ns)")),
        "{:?}",
        s.failure()
    );
}

/// A recording of inserts, grouped: `Some(n)` events of one source transaction (its
/// `txnNumber` the group's index), `None` one event no transaction wrote.
fn transactions_fixture(groups: &[Option<usize>]) -> Arc<Fixture> {
    let mut text = String::new();
    let mut seq = 0u32;
    for (number, group) in groups.iter().enumerate() {
        for _ in 0..group.unwrap_or(1) {
            seq += 1;
            let mut event = doc! {
                "_id": token(seq),
                "operationType": "insert",
                "ns": {"db": "d", "coll": "c"},
                "fullDocument": {"_id": seq},
            };
            if group.is_some() {
                event.insert("lsid", doc! {"id": {"s": 7}, "uid": "u"});
                event.insert("txnNumber", number as i64);
            }
            let json = bson::Bson::Document(event).into_relaxed_extjson();
            text.push_str(&json.to_string());
            text.push('\n');
        }
    }
    Arc::new(Fixture::parse(&text).expect("fixture"))
}

/// A session over `transactions_fixture(groups)` with its stream open, writing to a counting
/// store: where each source-transaction test begins.
fn transaction_session(groups: &[Option<usize>]) -> (Arc<Counting>, Session) {
    let store = Arc::new(Counting::default());
    let fixture = transactions_fixture(groups);
    let mut s = session(fixture, store.clone(), None, Mode::ResumeAfter);
    s.open_stream(Start::Now).unwrap();
    (store, s)
}

fn hand_off(tokens: &[String]) -> Vec<Decision> {
    tokens
        .iter()
        .map(|t| Decision::HandOff(hex::encode(Sha256::digest(t.as_bytes()))))
        .collect()
}

#[test]
fn a_source_transaction_is_read_whole_and_each_event_knows_its_place() {
    let (_, mut s) = transaction_session(&[None, Some(3), Some(2), None]);
    let tokens = deliver(&mut s, 2);
    assert_eq!(s.source_transaction_of(&tokens[0]), None);
    let first = s.source_transaction_of(&tokens[1]).expect("placed");
    assert_eq!((first.index, first.size), (0, Some(3)));
    // The rest of it is read: the stream's position is past it, the watermark is not.
    assert_eq!(s.watermark().as_deref(), Some(tokens[1].as_str()));
    let more = deliver(&mut s, 5);
    let third = s.source_transaction_of(&more[1]).expect("placed");
    assert_eq!((third.id.as_str(), third.index), (first.id.as_str(), 2));
    let next = s.source_transaction_of(&more[2]).expect("placed");
    assert_eq!((next.index, next.size), (0, Some(2)));
    assert_ne!(next.id, first.id, "another txnNumber, another transaction");
    assert_eq!(s.source_transaction_of(&more[3]).map(|t| t.index), Some(1));
    assert_eq!(s.source_transaction_of(&more[4]), None);
}

#[test]
fn a_commit_ending_inside_a_source_transaction_is_held_until_the_one_that_ends_it() {
    let (store, mut s) = transaction_session(&[Some(3), None]);
    let tokens = deliver(&mut s, 3);
    let ids = hand_off(&tokens);
    s.commit_batch(None, &tokens[0], Mode::ResumeAfter, ids[..1].to_vec())
        .unwrap();
    s.commit_batch(
        Some(&tokens[0]),
        &tokens[1],
        Mode::ResumeAfter,
        ids[1..2].to_vec(),
    )
    .unwrap();
    assert!(store.transactions.lock().unwrap().is_empty(), "held");
    assert_eq!(s.checkpoint().0, None, "the checkpoint has not moved");
    // The policy's `expected` is the token it committed last, held or not.
    let refused = s
        .commit_batch(None, &tokens[2], Mode::ResumeAfter, ids[2..].to_vec())
        .unwrap_err();
    assert!(refused.message.contains("expected"), "{refused:?}");
}

#[test]
fn the_held_events_are_written_in_one_transaction_with_the_rest() {
    let (store, mut s) = transaction_session(&[Some(3), None]);
    let tokens = deliver(&mut s, 3);
    let ids = hand_off(&tokens);
    for k in 0..3 {
        let expected = (k > 0).then(|| tokens[k - 1].as_str());
        s.commit_batch(expected, &tokens[k], Mode::ResumeAfter, ids[k..=k].to_vec())
            .unwrap();
    }
    assert_eq!(store.transactions.lock().unwrap().len(), 1);
    assert_eq!(store.transactions.lock().unwrap()[0].0, 3);
    assert_eq!(s.checkpoint().0.as_deref(), Some(tokens[2].as_str()));
    assert_eq!(s.committed().handed_off, 3);
    assert_eq!(s.committed().transactions.whole, 1);
}

#[test]
fn max_events_is_exceeded_to_finish_a_source_transaction_and_only_for_that() {
    let store = Arc::new(MemoryStore::new());
    let fixture = transactions_fixture(&[None, Some(3), None]);
    let mut s = session(fixture, store, None, Mode::ResumeAfter).with_max_events(2);
    s.open_stream(Start::Now).unwrap();
    deliver(&mut s, 4);
    let error = s.next_event().unwrap_err();
    assert!(error.message.contains("max_events = 2"), "{error:?}");
}

fn report(handed_off: u32, last: &str) -> PolicyReport {
    PolicyReport {
        status: if handed_off > 0 {
            Status::HandedOff
        } else {
            Status::Idle
        },
        events_handed_off: handed_off,
        last_event_id: last.to_string(),
    }
}

#[test]
fn a_run_that_ends_inside_a_source_transaction_writes_none_of_it() {
    let (store, mut s) = transaction_session(&[None, Some(3)]);
    let tokens = deliver(&mut s, 3);
    let ids = hand_off(&tokens);
    s.commit_batch(None, &tokens[0], Mode::ResumeAfter, ids[..1].to_vec())
        .unwrap();
    s.commit_batch(
        Some(&tokens[0]),
        &tokens[2],
        Mode::ResumeAfter,
        ids[1..3].to_vec(),
    )
    .unwrap();
    // The policy counts what it committed, the held events too; the host writes none of them.
    let last = hex::encode(Sha256::digest(tokens[2].as_bytes()));
    let summary = s.finish(Ok(report(3, &last))).unwrap();
    assert_eq!(summary.committed.handed_off, 1);
    assert_eq!(summary.committed.transactions.held_back, 2);
    assert_eq!(summary.status, Status::HandedOff);
    assert_eq!(store.dump("c").unwrap().outbox.len(), 1);
    assert_eq!(s.checkpoint().0.as_deref(), Some(tokens[0].as_str()));
}

#[test]
fn a_transaction_larger_than_a_run_is_written_when_it_began_the_run() {
    let (store, mut s) = transaction_session(&[Some(4)]);
    // A policy built before contract 1.5 stops at its max_events, inside the transaction.
    let tokens = deliver(&mut s, 2);
    let ids = hand_off(&tokens);
    s.commit_batch(None, &tokens[1], Mode::ResumeAfter, ids.clone())
        .unwrap();
    let last = hex::encode(Sha256::digest(tokens[1].as_bytes()));
    let summary = s.finish(Ok(report(2, &last))).unwrap();
    assert_eq!(summary.committed.handed_off, 2);
    assert_eq!(summary.committed.transactions.split, 1);
    assert_eq!(store.dump("c").unwrap().outbox.len(), 2);
}

#[test]
fn a_stopped_run_writes_none_of_the_transaction_it_was_inside() {
    let (store, mut s) = transaction_session(&[Some(3)]);
    let tokens = deliver(&mut s, 2);
    s.commit_batch(None, &tokens[1], Mode::ResumeAfter, hand_off(&tokens))
        .unwrap();
    s.stop().request();
    assert!(s.next_event().is_err());
    let summary = s.finish(Err("stopping".into())).unwrap();
    assert!(summary.stopped);
    assert_eq!(summary.committed.handed_off, 0);
    assert!(store.dump("c").unwrap().outbox.is_empty());
}

#[test]
fn the_watermark_never_passes_an_event_read_ahead() {
    let (_, mut s) = transaction_session(&[Some(2), None]);
    let tokens = deliver(&mut s, 2);
    s.commit_batch(None, &tokens[1], Mode::ResumeAfter, hand_off(&tokens))
        .unwrap();
    // The event after the transaction was read to find its end, not delivered.
    assert_eq!(s.watermark().as_deref(), Some(tokens[1].as_str()));
    s.advance_watermark(Some(&tokens[1]), &tokens[1]).unwrap();
    assert_eq!(s.checkpoint().0.as_deref(), Some(tokens[1].as_str()));
    let after = deliver(&mut s, 1);
    assert_eq!(s.source_transaction_of(&after[0]), None);
}

#[test]
fn a_split_event_ending_a_transaction_never_lets_the_watermark_skip_what_was_read_ahead() {
    let store = Arc::new(Counting::default());
    let mut events = with_split_event();
    for fragment in &mut events[1..4] {
        fragment.insert("lsid", doc! {"id": {"s": 7}, "uid": "u"});
        fragment.insert("txnNumber", 1i64);
    }
    let mut s = split_session(events, store.clone());
    let first = deliver(&mut s, 1);
    s.commit_batch(None, &first[0], Mode::ResumeAfter, hand_off(&first))
        .unwrap();
    let split = deliver(&mut s, 1);
    let place = s.source_transaction_of(&split[0]).expect("placed");
    assert_eq!(place.size, Some(1));
    s.commit_batch(
        Some(&first[0]),
        &split[0],
        Mode::ResumeAfter,
        hand_off(&split),
    )
    .unwrap();
    // Event 5 was read to find the transaction's end: the watermark is the split event, and
    // saving it moves nothing past event 5.
    let mark = s.watermark().expect("a watermark");
    assert_eq!(mark, split[0]);
    s.advance_watermark(Some(&split[0]), &mark).unwrap();
    let last = deliver(&mut s, 1);
    s.commit_batch(
        Some(&split[0]),
        &last[0],
        Mode::ResumeAfter,
        hand_off(&last),
    )
    .unwrap();
    assert_eq!(store.dump("c").unwrap().outbox.len(), 1 + 3 + 1);
}

#[test]
fn what_precedes_a_transaction_in_a_commit_is_written_and_only_the_transaction_held() {
    let (store, mut s) = transaction_session(&[None, None, Some(3)]);
    let tokens = deliver(&mut s, 4);
    s.commit_batch(None, &tokens[3], Mode::ResumeAfter, hand_off(&tokens))
        .unwrap();
    // The two events before the transaction are written; its two delivered events are held.
    assert_eq!(store.dump("c").unwrap().outbox.len(), 2);
    assert_eq!(s.checkpoint().0.as_deref(), Some(tokens[1].as_str()));
    // The run ends there: the transaction, which did not begin the run, is left whole.
    let last = hex::encode(Sha256::digest(tokens[3].as_bytes()));
    let summary = s.finish(Ok(report(4, &last))).unwrap();
    assert_eq!(summary.committed.handed_off, 2);
    assert_eq!(summary.committed.transactions.held_back, 2);
    assert_eq!(summary.committed.transactions.split, 0);
    assert_eq!(store.dump("c").unwrap().outbox.len(), 2);
}

#[test]
fn a_transaction_of_exactly_the_bound_has_a_size_and_one_past_it_none() {
    for (size, expected) in [
        (MAX_SOURCE_TRANSACTION, Some(MAX_SOURCE_TRANSACTION as u32)),
        (MAX_SOURCE_TRANSACTION + 1, None),
    ] {
        let store = Arc::new(MemoryStore::new());
        let fixture = transactions_fixture(&[Some(size), None]);
        let mut s = session(fixture, store, None, Mode::ResumeAfter);
        s.open_stream(Start::Now).unwrap();
        let first = deliver(&mut s, 1);
        let place = s.source_transaction_of(&first[0]).expect("placed");
        assert_eq!(place.size, expected, "a transaction of {size}");
    }
}

#[test]
fn a_transaction_whose_events_arrive_apart_is_never_a_second_whole_one() {
    let store = Arc::new(Counting::default());
    // txnNumber 0 twice with another transaction between (the fixture numbers by group).
    let mut events = Vec::new();
    for (seq, number) in [(1u32, 0i64), (2, 1), (3, 0)] {
        events.push(doc! {
            "_id": token(seq), "operationType": "insert", "ns": {"db": "d", "coll": "c"},
            "fullDocument": {"_id": seq}, "lsid": {"id": {"s": 7}, "uid": "u"}, "txnNumber": number,
        });
    }
    let mut s = session(recording(events), store, None, Mode::ResumeAfter);
    s.open_stream(Start::Now).unwrap();
    let tokens = deliver(&mut s, 3);
    let again = s.source_transaction_of(&tokens[2]).expect("placed");
    assert_eq!(again.id, s.source_transaction_of(&tokens[0]).unwrap().id);
    assert_eq!(again.size, None);
}
