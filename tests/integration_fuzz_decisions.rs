//! Property tests of the host's validation of policy decisions: random sequences of session calls
//! (opens from right or forged tokens, reads, commits and batch commits of right, reordered,
//! stale, forged or undelivered tokens with random IDs and modes, watermark saves, and another
//! run moving the checkpoint underneath) over random recorded streams, against the in-memory
//! store. After every call:
//! - the checkpoint only ever moves to delivered tokens, in delivery order, or to the stream's
//!   watermark once nothing delivered is pending;
//! - each commit writes exactly the records its decisions ask for, of the events it covers;
//! - outbox IDs are unique;
//! - a refused decision writes nothing, and after the first failure nothing more is written.

use crate::support;

use std::sync::Arc;

use bson::{Document, doc};
use handoff::backend::memory::MemoryStore;
use handoff::backend::replay::Fixture;
use handoff::backend::replay::ReplaySource;
use handoff::domain::token::canonical_text;
use handoff::domain::{
    Checkpoint, CheckpointStore, Commit, Consumer, Deployment, Dump, Mode, Start,
};
use handoff::session::{Decision, PolicyReport, Session, Shaped, Status};
use proptest::prelude::*;
use serde_json::Value;

const CONSUMER: &str = "fuzz";
const SOURCE: &str = "change_demo.orders";

/// One line of a generated recording.
#[derive(Clone, Debug)]
enum Line {
    Event(&'static str),
    PostBatch,
    Error(i32),
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        6 => prop::sample::select(vec!["insert", "update", "replace", "delete"]).prop_map(Line::Event),
        2 => Just(Line::PostBatch),
        1 => Just(Line::Event("invalidate")),
        1 => prop::sample::select(vec![286, 260, 280, 6]).prop_map(Line::Error),
    ]
}

/// A recording and the token documents it holds (events and post-batch tokens), in order.
struct Recording {
    fixture: Arc<Fixture>,
    tokens: Vec<Document>,
}

fn json_doc(value: &Value) -> Document {
    Document::try_from(value.as_object().unwrap().clone()).unwrap()
}

fn record(lines: &[Line]) -> Recording {
    let mut text = String::new();
    let mut tokens = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let seq = i as u32 + 1;
        let value = match line {
            Line::Event(op) => {
                tokens.push(json_doc(&support::token(seq)));
                support::event(seq, op)
            }
            Line::PostBatch => {
                let mark = support::batch_end(seq);
                tokens.push(json_doc(&mark["$postBatchResumeToken"]));
                mark
            }
            Line::Error(code) => {
                serde_json::json!({"$error": {"code": code, "codeName": "Injected", "errmsg": "injected"}})
            }
        };
        text.push_str(&format!("{value}\n"));
    }
    Recording {
        fixture: Arc::new(Fixture::parse(&text).unwrap()),
        tokens,
    }
}

/// Which token a call names.
#[derive(Clone, Debug)]
enum Tok {
    /// The first delivered event waiting for its commit.
    Head,
    /// The n-th delivered event waiting for its commit.
    Pending(usize),
    /// The last event delivered.
    LastDelivered,
    /// The token the checkpoint holds now.
    Current,
    /// The stream's watermark.
    Watermark,
    /// Any token of the recording, delivered or not.
    Recorded(usize),
    /// A token the recording never held.
    Forged(String),
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        5 => Just(Tok::Head),
        2 => (0..4usize).prop_map(Tok::Pending),
        1 => Just(Tok::LastDelivered),
        1 => Just(Tok::Current),
        1 => Just(Tok::Watermark),
        2 => (0..24usize).prop_map(Tok::Recorded),
        1 => "[ -~]{0,24}".prop_map(Tok::Forged),
    ]
}

/// Which `expected` token a call claims.
#[derive(Clone, Debug)]
enum Expected {
    Current,
    None,
    /// The checkpoint's token before the last commit of this run.
    Stale,
    Recorded(usize),
}

fn expected() -> impl Strategy<Value = Expected> {
    prop_oneof![
        8 => Just(Expected::Current),
        1 => Just(Expected::None),
        1 => Just(Expected::Stale),
        1 => (0..24usize).prop_map(Expected::Recorded),
    ]
}

#[derive(Clone, Debug)]
enum Id {
    Fresh,
    /// An ID this run already committed.
    Reused,
    Long(usize),
    Text(String),
}

fn id() -> impl Strategy<Value = Id> {
    prop_oneof![
        8 => Just(Id::Fresh),
        1 => Just(Id::Reused),
        1 => (199..203usize).prop_map(Id::Long),
        1 => "[ -~]{0,8}".prop_map(Id::Text),
    ]
}

#[derive(Clone, Debug)]
enum Choice {
    HandOff(Id),
    /// A hand-off with a policy-shaped record (contract 1.2).
    Record(Id),
    Skip,
    Quarantine(Id),
}

/// A well-formed shaped record under `id`.
fn shaped(id: String) -> Decision {
    Decision::HandOffRecord(Box::new(Shaped {
        id,
        event_type: "OrderCreated".into(),
        schema_version: 1,
        aggregate_id: "\"o-1\"".into(),
        aggregate_version: Some("3".into()),
        payload: r#"{"total": 5}"#.into(),
    }))
}

fn choice() -> impl Strategy<Value = Choice> {
    prop_oneof![
        5 => id().prop_map(Choice::HandOff),
        1 => id().prop_map(Choice::Record),
        1 => Just(Choice::Skip),
        1 => id().prop_map(Choice::Quarantine),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    /// Opens as a well-behaved policy does: from the checkpoint, with its mode.
    OpenRight,
    /// Commits the next `n` delivered events as a well-behaved policy does (fresh IDs; an
    /// invalidation skipped and saved with `startAfter`); `n` = 1 uses `commit`.
    CommitRight(usize, Vec<Choice>),
    /// Saves the stream's watermark as a well-behaved policy does.
    WatermarkRight,
    Open(u8, Tok),
    Next,
    Commit(Expected, Tok, Mode, Option<Id>),
    Batch(Expected, Tok, Mode, Vec<Choice>),
    Watermark(Expected, Tok),
    /// Another run moves the checkpoint to a token of its own.
    Interloper,
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![4 => Just(Mode::ResumeAfter), 1 => Just(Mode::StartAfter)]
}

fn op() -> impl Strategy<Value = Op> {
    let right_choice = prop_oneof![
        5 => Just(Choice::HandOff(Id::Fresh)),
        1 => Just(Choice::Record(Id::Fresh)),
        1 => Just(Choice::Skip),
        1 => Just(Choice::Quarantine(Id::Fresh)),
    ];
    prop_oneof![
        // Well-behaved calls, so that runs get far…
        10 => Just(Op::Next),
        8 => Just(Op::CommitRight(1, vec![Choice::HandOff(Id::Fresh)])),
        3 => (1..4usize, prop::collection::vec(right_choice, 3))
            .prop_map(|(n, c)| Op::CommitRight(n, c)),
        2 => Just(Op::WatermarkRight),
        1 => Just(Op::OpenRight),
        // …and hostile ones, mostly wrong in one respect.
        1 => (0..3u8, tok()).prop_map(|(k, t)| Op::Open(k, t)),
        1 => (expected(), tok(), mode(), prop::option::weighted(0.85, id()))
            .prop_map(|(e, t, m, i)| Op::Commit(e, t, m, i)),
        1 => (expected(), tok(), mode(), prop::collection::vec(choice(), 0..4))
            .prop_map(|(e, t, m, c)| Op::Batch(e, t, m, c)),
        1 => (expected(), tok()).prop_map(|(e, t)| Op::Watermark(e, t)),
        1 => Just(Op::Interloper),
    ]
}

/// Call sequences; most open the stream as a policy should, so that later calls get far.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    (
        prop::bool::weighted(0.8),
        prop::collection::vec(op(), 0..48),
    )
        .prop_map(|(open, mut ops)| {
            if open {
                ops.insert(0, Op::OpenRight);
            }
            ops
        })
}

/// Where the consumer's checkpoint stands before the run.
#[derive(Clone, Debug)]
enum Begin {
    Fresh,
    At(usize, Mode),
    Unknown,
}

fn begin() -> impl Strategy<Value = Begin> {
    prop_oneof![
        3 => Just(Begin::Fresh),
        3 => (0..24usize, mode()).prop_map(|(i, m)| Begin::At(i, m)),
        1 => Just(Begin::Unknown),
    ]
}

/// What the harness knows of the run, to name tokens and check each step.
struct Model {
    delivered: Vec<String>,
    delivered_docs: Vec<Document>,
    /// How many delivered events the session committed.
    committed: usize,
    /// The checkpoint's token text before the session's last write.
    previous: Option<String>,
    ids: Vec<String>,
    fresh: usize,
    failed: bool,
}

impl Model {
    fn pending(&self) -> &[String] {
        &self.delivered[self.committed..]
    }

    fn token(&self, t: &Tok, session: &Session, rec: &Recording) -> String {
        let pending = self.pending();
        let forged = || "{\"_data\": \"82FFFF\"}".to_string();
        match t {
            Tok::Head => pending.first().cloned().unwrap_or_else(forged),
            Tok::Pending(n) => pending.get(*n).cloned().unwrap_or_else(forged),
            Tok::LastDelivered => self.delivered.last().cloned().unwrap_or_else(forged),
            Tok::Current => session.checkpoint().0.unwrap_or_else(forged),
            Tok::Watermark => session.watermark().unwrap_or_else(forged),
            Tok::Recorded(i) => rec
                .tokens
                .get(*i)
                .map(canonical_text)
                .unwrap_or_else(forged),
            Tok::Forged(text) => text.clone(),
        }
    }

    fn expected(&self, e: &Expected, session: &Session, rec: &Recording) -> Option<String> {
        match e {
            Expected::Current => session.checkpoint().0,
            Expected::None => None,
            Expected::Stale => self.previous.clone(),
            Expected::Recorded(i) => rec.tokens.get(*i).map(canonical_text),
        }
    }

    fn id(&mut self, i: &Id) -> String {
        match i {
            Id::Fresh => {
                self.fresh += 1;
                format!("evt-{}", self.fresh)
            }
            Id::Reused => self
                .ids
                .last()
                .cloned()
                .unwrap_or_else(|| "evt-0".to_string()),
            Id::Long(n) => "x".repeat(*n),
            Id::Text(t) => t.clone(),
        }
    }
}

fn dump(store: &MemoryStore) -> Dump {
    store.dump(CONSUMER).unwrap()
}

fn checkpoint_text(dump: &Dump) -> Option<String> {
    dump.checkpoint
        .as_ref()
        .and_then(|c| c.get_document("token").ok())
        .map(canonical_text)
}

fn record_ids(records: &[Document]) -> Vec<String> {
    records
        .iter()
        .map(|r| r.get_str("_id").unwrap().to_string())
        .collect()
}

/// What a successful write must have done, given the decisions it carried (`None` for a
/// watermark save).
fn check_write(
    model: &mut Model,
    before: &Dump,
    after: &Dump,
    decisions: Option<&[Decision]>,
    mode: Mode,
    watermark: Option<String>,
) -> Result<(), TestCaseError> {
    let moved_to = checkpoint_text(after);
    let stored_mode = after
        .checkpoint
        .as_ref()
        .and_then(|c| c.get_str("mode").ok())
        .map(str::to_string);
    match decisions {
        Some(decisions) => {
            let k = decisions.len();
            prop_assert!(k >= 1 && model.committed + k <= model.delivered.len());
            let covered = model.committed..model.committed + k;
            // The checkpoint moved to the last covered delivered event, in delivery order.
            prop_assert_eq!(moved_to, Some(model.delivered[covered.end - 1].clone()));
            prop_assert_eq!(stored_mode.as_deref(), Some(mode.as_str()));
            // Exactly the requested records, of the covered events, in order.
            let new_outbox = &after.outbox[before.outbox.len()..];
            let new_quarantine = &after.quarantine[before.quarantine.len()..];
            prop_assert_eq!(&after.outbox[..before.outbox.len()], &before.outbox[..]);
            let (mut o, mut q) = (0, 0);
            for (decision, index) in decisions.iter().zip(covered.clone()) {
                let event = &model.delivered_docs[index];
                match decision {
                    Decision::HandOff(id) => {
                        let record = &new_outbox[o];
                        prop_assert_eq!(record.get_str("_id").unwrap(), format!("{CONSUMER}/{id}"));
                        prop_assert_eq!(record.get_document("event").unwrap(), event);
                        model.ids.push(id.clone());
                        o += 1;
                    }
                    Decision::Quarantine { id, .. } => {
                        let record = &new_quarantine[q];
                        prop_assert_eq!(record.get_str("_id").unwrap(), format!("{CONSUMER}/{id}"));
                        prop_assert_eq!(record.get_document("event").unwrap(), event);
                        q += 1;
                    }
                    Decision::HandOffRecord(record) => {
                        let stored = &new_outbox[o];
                        prop_assert_eq!(
                            stored.get_str("_id").unwrap(),
                            format!("{CONSUMER}/{}", record.id)
                        );
                        prop_assert_eq!(stored.get_str("eventType").unwrap(), "OrderCreated");
                        prop_assert_eq!(
                            stored.get_document("payload").unwrap(),
                            &doc! {"total": 5}
                        );
                        prop_assert_eq!(stored.get_document("event").unwrap(), event);
                        model.ids.push(record.id.clone());
                        o += 1;
                    }
                    Decision::Skip(_) => {}
                }
            }
            prop_assert_eq!((o, q), (new_outbox.len(), new_quarantine.len()));
            model.committed += k;
        }
        None => {
            // A watermark is saved only when nothing delivered is pending, and it is the
            // stream's own.
            prop_assert!(model.pending().is_empty());
            prop_assert_eq!(&moved_to, &watermark);
            prop_assert_eq!(stored_mode.as_deref(), Some("resumeAfter"));
            prop_assert_eq!(&after.outbox, &before.outbox);
            prop_assert_eq!(&after.quarantine, &before.quarantine);
        }
    }
    model.previous = checkpoint_text(before);
    Ok(())
}

/// Runs the calls and checks every step; returns the final state and whether the run failed.
fn run_case(lines: Vec<Line>, begin: Begin, ops: Vec<Op>) -> Result<(Dump, bool), TestCaseError> {
    let rec = record(&lines);
    let store = Arc::new(MemoryStore::new());
    let (token, mode) = match &begin {
        Begin::Fresh => (None, Mode::ResumeAfter),
        Begin::At(i, m) => match rec.tokens.get(*i) {
            Some(t) => (Some(t.clone()), *m),
            None => (None, Mode::ResumeAfter),
        },
        Begin::Unknown => (Some(doc! {"_data": "8200000000"}), Mode::ResumeAfter),
    };
    let mut initial =
        handoff::domain::checkpoint::initial(CONSUMER, SOURCE, "000000000000000000000000");
    if let Some(t) = &token {
        initial.insert("token", t.clone());
        initial.insert("mode", mode.as_str());
    }
    store.ensure_checkpoint(CONSUMER, initial).unwrap();
    let consumer = Consumer {
        consumer: CONSUMER.into(),
        source: SOURCE.into(),
    };
    let deployment = Deployment::replica_set("rs0", "000000000000000000000000");
    let mut session = Session::new(
        consumer.clone(),
        deployment,
        Checkpoint::at(token, mode),
        Box::new(ReplaySource::new(rec.fixture.clone())),
        store.clone(),
        std::time::Instant::now() + std::time::Duration::from_secs(600),
    );
    let mut model = Model {
        delivered: Vec::new(),
        delivered_docs: Vec::new(),
        committed: 0,
        previous: None,
        ids: Vec::new(),
        fresh: 0,
        failed: false,
    };
    let mut interlopers = 0;
    for op in &ops {
        let before = dump(&store);
        let held = session.checkpoint().0;
        let mut write: Option<(Option<Vec<Decision>>, Mode, Option<String>)> = None;
        // Well-behaved calls adapt to the run: nothing to commit means read; events pending
        // mean no watermark yet.
        let adapted;
        let op = match op {
            Op::CommitRight(..) if model.pending().is_empty() => {
                adapted = Op::Next;
                &adapted
            }
            Op::WatermarkRight if !model.pending().is_empty() => {
                adapted = Op::CommitRight(1, vec![Choice::HandOff(Id::Fresh)]);
                &adapted
            }
            other => other,
        };
        let outcome: Result<(), String> = match op {
            Op::OpenRight => {
                let start = match session.checkpoint() {
                    (None, _) => Start::Now,
                    (Some(t), Mode::ResumeAfter) => Start::ResumeAfter(t),
                    (Some(t), Mode::StartAfter) => Start::StartAfter(t),
                };
                session.open_stream(start).map_err(|e| format!("{e:?}"))
            }
            Op::CommitRight(n, choices) => {
                let pending = model.pending().len();
                let n = (*n).min(pending).max(1);
                let head_invalidate = |model: &Model, index: usize| {
                    model
                        .delivered_docs
                        .get(index)
                        .is_some_and(|d| d.get_str("operationType").ok() == Some("invalidate"))
                };
                // Stop at an invalidation: it ends what a commit may cover.
                let n = (0..n)
                    .find(|i| head_invalidate(&model, model.committed + i))
                    .map_or(n, |i| i + 1);
                let last = model.committed + n - 1;
                let invalidate = head_invalidate(&model, last);
                let mode = if invalidate {
                    Mode::StartAfter
                } else {
                    Mode::ResumeAfter
                };
                let expected = session.checkpoint().0;
                let next = model.token(&Tok::Pending(n - 1), &session, &rec);
                let mut decisions: Vec<Decision> = (0..n)
                    .map(
                        |i| match (&choices[i % choices.len()], i + 1 == n && invalidate) {
                            (_, true) => Decision::Skip("invalidate".into()),
                            (Choice::HandOff(id), _) => Decision::HandOff(model.id(id)),
                            (Choice::Record(id), _) => shaped(model.id(id)),
                            (Choice::Quarantine(id), _) => Decision::Quarantine {
                                id: model.id(id),
                                reason: "fuzz".into(),
                            },
                            (Choice::Skip, _) => Decision::Skip("fuzz".into()),
                        },
                    )
                    .collect();
                if n == 1 && !matches!(decisions[0], Decision::Quarantine { .. }) {
                    let id = match &decisions[0] {
                        Decision::HandOff(id) => Some(id.clone()),
                        _ if invalidate => None,
                        _ => {
                            let id = model.id(&Id::Fresh);
                            decisions[0] = Decision::HandOff(id.clone());
                            Some(id)
                        }
                    };
                    write = Some((Some(decisions), mode, None));
                    session
                        .commit(expected.as_deref(), &next, mode, id.as_deref())
                        .map_err(|e| format!("{e:?}"))
                } else {
                    write = Some((Some(decisions.clone()), mode, None));
                    session
                        .commit_batch(expected.as_deref(), &next, mode, decisions)
                        .map_err(|e| format!("{e:?}"))
                }
            }
            Op::WatermarkRight => {
                let expected = session.checkpoint().0;
                let next = model.token(&Tok::Watermark, &session, &rec);
                write = Some((None, Mode::ResumeAfter, Some(next.clone())));
                session
                    .advance_watermark(expected.as_deref(), &next)
                    .map_err(|e| format!("{e:?}"))
            }
            Op::Open(kind, t) => {
                let text = model.token(t, &session, &rec);
                let start = match kind {
                    0 => Start::Now,
                    1 => Start::ResumeAfter(text),
                    _ => Start::StartAfter(text),
                };
                session.open_stream(start).map_err(|e| format!("{e:?}"))
            }
            Op::Next => match session.next_event() {
                Ok(Some(view)) => {
                    let doc = rec
                        .fixture
                        .entries
                        .iter()
                        .find_map(|e| match e {
                            handoff::backend::replay::Entry::Event { event, token_text }
                                if *token_text == view.token =>
                            {
                                Some(event.clone())
                            }
                            _ => None,
                        })
                        .expect("a delivered event comes from the recording");
                    prop_assert!(
                        !model.delivered.contains(&view.token),
                        "an event was delivered twice"
                    );
                    model.delivered.push(view.token);
                    model.delivered_docs.push(doc);
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(e) => Err(format!("{e:?}")),
            },
            Op::Commit(e, t, m, i) => {
                let expected = model.expected(e, &session, &rec);
                let next = model.token(t, &session, &rec);
                let id = i.as_ref().map(|i| model.id(i));
                let decision = match &id {
                    Some(id) => Decision::HandOff(id.clone()),
                    None => Decision::Skip("invalidate".into()),
                };
                write = Some((Some(vec![decision]), *m, None));
                session
                    .commit(expected.as_deref(), &next, *m, id.as_deref())
                    .map_err(|e| format!("{e:?}"))
            }
            Op::Batch(e, t, m, choices) => {
                let expected = model.expected(e, &session, &rec);
                let next = model.token(t, &session, &rec);
                let decisions: Vec<Decision> = choices
                    .iter()
                    .map(|c| match c {
                        Choice::HandOff(i) => Decision::HandOff(model.id(i)),
                        Choice::Record(i) => shaped(model.id(i)),
                        Choice::Skip => Decision::Skip("fuzz".into()),
                        Choice::Quarantine(i) => Decision::Quarantine {
                            id: model.id(i),
                            reason: "fuzz".into(),
                        },
                    })
                    .collect();
                write = Some((Some(decisions.clone()), *m, None));
                session
                    .commit_batch(expected.as_deref(), &next, *m, decisions)
                    .map_err(|e| format!("{e:?}"))
            }
            Op::Watermark(e, t) => {
                let expected = model.expected(e, &session, &rec);
                let next = model.token(t, &session, &rec);
                write = Some((None, Mode::ResumeAfter, Some(next.clone())));
                session
                    .advance_watermark(expected.as_deref(), &next)
                    .map_err(|e| format!("{e:?}"))
            }
            Op::Interloper => {
                interlopers += 1;
                let next = doc! {"_data": format!("82EEEE{interlopers:04}")};
                let current = before
                    .checkpoint
                    .as_ref()
                    .and_then(|c| c.get_document("token").ok())
                    .cloned();
                store
                    .commit(&Commit {
                        consumer: &consumer,
                        expected: current.as_ref(),
                        next: &next,
                        mode: Mode::ResumeAfter,
                        outbox: Vec::new(),
                        quarantine: Vec::new(),
                        lease: None,
                        policy: None,
                    })
                    .unwrap();
                continue;
            }
        };
        let after = dump(&store);
        // Outbox IDs stay unique.
        let ids = record_ids(&after.outbox);
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        prop_assert_eq!(unique.len(), ids.len());
        if model.failed {
            prop_assert!(outcome.is_err(), "{op:?} succeeded after a failure");
        }
        match outcome {
            Err(_) => {
                // Refused or failed: nothing written, and the run is over.
                prop_assert_eq!(&after, &before, "a refused {:?} wrote", op);
                prop_assert!(session.failure().is_some());
                model.failed = true;
            }
            Ok(()) if after == before => {
                // Only reads and a watermark save at the token the run already holds write
                // nothing.
                let no_op_watermark = matches!(op, Op::Watermark(..) | Op::WatermarkRight)
                    && write.as_ref().and_then(|w| w.2.clone()) == held;
                prop_assert!(
                    matches!(op, Op::OpenRight | Op::Open(..) | Op::Next) || no_op_watermark,
                    "{op:?} succeeded without writing"
                );
            }
            Ok(()) => {
                let Some((decisions, mode, watermark)) = write else {
                    return Err(TestCaseError::fail(format!("{op:?} wrote")));
                };
                check_write(
                    &mut model,
                    &before,
                    &after,
                    decisions.as_deref(),
                    mode,
                    watermark,
                )?;
            }
        }
    }
    // The run's end: a failure is reported as such; otherwise a true report is accepted.
    let committed = session.committed().clone();
    let report = PolicyReport {
        status: if committed.invalidated {
            Status::Invalidated
        } else if committed.handed_off > 0 {
            Status::HandedOff
        } else {
            Status::Idle
        },
        events_handed_off: committed.handed_off,
        last_event_id: committed.last_event_id.clone(),
    };
    let summary = session.finish(Ok(report));
    prop_assert_eq!(summary.is_err(), model.failed);
    Ok((dump(&store), model.failed))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn random_decisions_never_break_the_guarantees(
        lines in prop::collection::vec(line(), 0..16),
        begin in begin(),
        ops in ops(),
    ) {
        run_case(lines, begin, ops)?;
    }
}

/// The generated cases reach deep: many commit events, some save watermarks, many are refused.
#[test]
fn the_generated_cases_reach_commits_watermarks_and_refusals() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (prop::collection::vec(line(), 0..16), begin(), ops());
    let (mut committed, mut refused, mut watermarks) = (0, 0, 0);
    let cases = 400;
    for _ in 0..cases {
        let (lines, begin, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let (state, failed) = run_case(lines, begin, ops).unwrap();
        committed += usize::from(!state.outbox.is_empty());
        refused += usize::from(failed);
        let at_mark = state
            .checkpoint
            .as_ref()
            .and_then(|c| c.get_document("token").ok())
            .and_then(|t| t.get_str("_data").ok())
            .is_some_and(|d| d.ends_with("0429296E1404"));
        watermarks += usize::from(at_mark);
    }
    eprintln!(
        "{cases} cases: {committed} committed, {watermarks} ended at a watermark, {refused} refused"
    );
    assert!(committed >= cases / 10, "{committed}");
    assert!(watermarks >= 1, "{watermarks}");
    assert!(refused >= cases / 4, "{refused}");
}

/// A policy that opens right and commits every event in order with fresh IDs: the property
/// harness above must accept it, so that its refusals are the host's, not the harness's.
#[test]
fn a_well_behaved_sequence_passes_the_harness_and_commits_everything() {
    let lines = vec![
        Line::Event("insert"),
        Line::Event("update"),
        Line::PostBatch,
        Line::Event("delete"),
        Line::PostBatch,
    ];
    let mut ops = vec![Op::Open(0, Tok::Head)];
    for _ in 0..3 {
        ops.push(Op::Next);
        ops.push(Op::Commit(
            Expected::Current,
            Tok::Head,
            Mode::ResumeAfter,
            Some(Id::Fresh),
        ));
    }
    ops.push(Op::Next);
    ops.push(Op::Watermark(Expected::Current, Tok::Watermark));
    let (state, failed) = run_case(lines, Begin::Fresh, ops).unwrap();
    assert!(!failed);
    assert_eq!(
        record_ids(&state.outbox),
        ["fuzz/evt-1", "fuzz/evt-2", "fuzz/evt-3"]
    );
    assert_eq!(
        state.checkpoint.unwrap().get_document("token").unwrap(),
        &json_doc(&support::batch_end(5)["$postBatchResumeToken"])
    );
}
