//! Each event of a case as both policies' stores hold it: its decision and records, compared.

use std::collections::HashMap;

use bson::Document;

use handoff_domain::Dump;
use handoff_domain::fixture::{Entry, Fixture};
use handoff_domain::token::canonical_text;

use super::{Decided, Decision, EventDiff, Kind, shape_changes};
use crate::cases::Case;

/// One event of a stream: its number, operation and tokens (a split event's fragments).
pub(super) struct Event {
    pub(super) number: usize,
    pub(super) operation: String,
    pub(super) tokens: Vec<String>,
}

/// The events of a stream, each split event's fragments as one.
pub(super) fn events_of(fixture: &Fixture) -> (Vec<Event>, HashMap<String, usize>) {
    let mut events: Vec<Event> = Vec::new();
    // Where each token stands among the entries, for the checkpoint's position.
    let mut positions = HashMap::new();
    for (index, entry) in fixture.entries.iter().enumerate() {
        match entry {
            Entry::Event { event, token_text } => {
                positions.insert(token_text.clone(), index);
                // `splitEvent: {fragment: k, of: n}`: a fragment after the first continues
                // the event before it.
                let later_fragment = event
                    .get_document("splitEvent")
                    .ok()
                    .and_then(|s| match s.get("fragment") {
                        Some(bson::Bson::Int32(k)) => Some(i64::from(*k)),
                        Some(bson::Bson::Int64(k)) => Some(*k),
                        _ => None,
                    })
                    .is_some_and(|k| k > 1);
                match events.last_mut() {
                    Some(last) if later_fragment => last.tokens.push(token_text.clone()),
                    _ => events.push(Event {
                        number: events.len() + 1,
                        operation: event
                            .get_str("operationType")
                            .unwrap_or("fragment")
                            .to_string(),
                        tokens: vec![token_text.clone()],
                    }),
                }
            }
            Entry::PostBatch { token_text, .. } => {
                positions.insert(token_text.clone(), index);
            }
            Entry::Error(_) => {}
        }
    }
    (events, positions)
}

/// The token a record carries (`token`, else its event's `_id`), as canonical text.
fn record_token(record: &Document) -> Option<String> {
    record
        .get_document("token")
        .or_else(|_| {
            record
                .get_document("event")
                .and_then(|e| e.get_document("_id"))
        })
        .ok()
        .map(canonical_text)
}

/// A record's ID less its consumer (`<consumer>/<id>`).
fn record_id(record: &Document) -> String {
    let id = record.get_str("_id").unwrap_or_default();
    id.split_once('/').map_or(id, |(_, rest)| rest).to_string()
}

/// Each token's records, in the order the store holds them.
fn by_token(records: &[Document]) -> HashMap<String, Vec<&Document>> {
    let mut map: HashMap<String, Vec<&Document>> = HashMap::new();
    for record in records {
        if let Some(token) = record_token(record) {
            map.entry(token).or_default().push(record);
        }
    }
    map
}

/// What one policy's store says of each event.
struct Decisions<'a> {
    outbox: HashMap<String, Vec<&'a Document>>,
    quarantine: HashMap<String, Vec<&'a Document>>,
    /// The entries up to this index were passed (the checkpoint's position).
    reached: Option<usize>,
}

impl<'a> Decisions<'a> {
    fn of(dump: &'a Dump, positions: &HashMap<String, usize>) -> Self {
        let reached = dump
            .checkpoint
            .as_ref()
            .and_then(|c| c.get_document("token").ok())
            .and_then(|t| positions.get(&canonical_text(t)).copied());
        Decisions {
            outbox: by_token(&dump.outbox),
            quarantine: by_token(&dump.quarantine),
            reached,
        }
    }

    fn records(map: &HashMap<String, Vec<&'a Document>>, event: &Event) -> Vec<&'a Document> {
        event
            .tokens
            .iter()
            .flat_map(|t| map.get(t).into_iter().flatten().copied())
            .collect()
    }

    /// The decision and the records of the outbox (or of the quarantine) for `event`.
    fn decide(
        &self,
        event: &Event,
        positions: &HashMap<String, usize>,
    ) -> (Decision, Vec<&'a Document>) {
        let outbox = Self::records(&self.outbox, event);
        if !outbox.is_empty() {
            return (Decision::HandOff, outbox);
        }
        let quarantine = Self::records(&self.quarantine, event);
        if !quarantine.is_empty() {
            return (Decision::Quarantine, quarantine);
        }
        let passed = event
            .tokens
            .first()
            .and_then(|t| positions.get(t))
            .is_some_and(|at| self.reached.is_some_and(|reached| *at <= reached));
        let decision = if passed {
            Decision::Skip
        } else {
            Decision::NotReached
        };
        (decision, Vec::new())
    }
}

/// Every event of `case`, as each policy's store holds it.
pub(super) fn compare_case(case: &Case, old: &Dump, new: &Dump) -> Vec<EventDiff> {
    let (events, positions) = events_of(&case.fixture);
    let (old, new) = (
        Decisions::of(old, &positions),
        Decisions::of(new, &positions),
    );
    events
        .iter()
        .map(|event| {
            let (old_decision, old_records) = old.decide(event, &positions);
            let (new_decision, new_records) = new.decide(event, &positions);
            compare_event(
                case,
                event,
                (old_decision, &old_records),
                (new_decision, &new_records),
            )
        })
        .collect()
}

fn compare_event(
    case: &Case,
    event: &Event,
    (old_decision, old_records): (Decision, &[&Document]),
    (new_decision, new_records): (Decision, &[&Document]),
) -> EventDiff {
    let mut kinds = Vec::new();
    let mut id_changes = Vec::new();
    let mut shape = Vec::new();
    // Records are compared pairwise, in order, when both policies hand the event off.
    let (mut added, mut removed) = (0, 0);
    if old_decision == new_decision && old_decision == Decision::HandOff {
        for (a, b) in old_records.iter().zip(new_records) {
            let (a_id, b_id) = (record_id(a), record_id(b));
            if a_id != b_id {
                id_changes.push((a_id, b_id));
            }
            for change in shape_changes(a, b) {
                if !shape.contains(&change) {
                    shape.push(change);
                }
            }
        }
        added = new_records.len().saturating_sub(old_records.len());
        removed = old_records.len().saturating_sub(new_records.len());
    } else if old_decision != new_decision {
        kinds.push(Kind::Decision);
        if new_decision == Decision::HandOff {
            added = new_records.len();
        }
        if old_decision == Decision::HandOff {
            removed = old_records.len();
        }
    }
    if !id_changes.is_empty() {
        kinds.push(Kind::Id);
    }
    if !shape.is_empty() {
        kinds.push(Kind::Shape);
    }
    if added > 0 {
        kinds.push(Kind::Added);
    }
    if removed > 0 {
        kinds.push(Kind::Removed);
    }
    kinds.sort();
    EventDiff {
        case: case.name.clone(),
        number: event.number,
        operation: event.operation.clone(),
        old: Decided {
            decision: old_decision,
            ids: old_records.iter().map(|r| record_id(r)).collect(),
        },
        new: Decided {
            decision: new_decision,
            ids: new_records.iter().map(|r| record_id(r)).collect(),
        },
        kinds,
        id_changes,
        shape,
        added,
        removed,
    }
}
