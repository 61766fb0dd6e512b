//! `policy diff`: two policies decide the same events in the replay sandbox, and what differs is
//! told per event.
//!
//! Each case (a recorded stream, a folder's cases, or the events of a consumer's outbox made a
//! stream) is run once per policy, as `policy test` runs it ([`Case::execute`]): a fresh
//! in-memory store, the case's runs. The records each policy wrote are then taken event by
//! event (by the token a record carries; the fragments of a split event are one event) and
//! compared:
//! - the decision: handed off, quarantined, skipped, or not reached by the case's runs;
//! - records added or removed: one policy writes more records of the event than the other;
//! - a changed ID: a record of the event under another ID, which a reader takes for another
//!   event (the event handed off again, a re-delivery risk);
//! - a changed shape: the record's field paths and their BSON types differ (values differing
//!   is not a shape change).

use bson::Document;
use serde_json::{Map, Value, json};

use handoff_backend::replay::{DEFAULT_REPLICA_SET_ID, DEFAULT_SET_NAME};
use handoff_domain::Deployment;
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::fixture::{Entry, Fixture, RecordedDeployment};
use handoff_domain::token::canonical_text;
use handoff_runtime::{Policy, PolicySource, Runtime};

use crate::cases::Case;

mod compare;
mod report;
mod shape;

use compare::compare_case;

pub use shape::{ShapeChange, shape_changes};

/// Events one run decides at most in a diff of a stream (the largest `--max-events`).
const EVENTS_PER_RUN: usize = 500;
/// The most runs a case holds.
const MAX_RUNS: usize = 100;

/// One side of a diff: a policy's file and the policy loaded from it.
pub struct Side<'a> {
    pub source: &'a PolicySource,
    pub policy: &'a Policy,
}

/// What a policy did with one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    HandOff,
    Quarantine,
    Skip,
    /// The case's runs ended before the event.
    NotReached,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::HandOff => "hand off",
            Decision::Quarantine => "quarantine",
            Decision::Skip => "skip",
            Decision::NotReached => "not reached",
        }
    }

    /// The name JSON and JUnit use.
    pub fn key(self) -> &'static str {
        match self {
            Decision::HandOff => "handed_off",
            Decision::Quarantine => "quarantined",
            Decision::Skip => "skipped",
            Decision::NotReached => "not_reached",
        }
    }
}

/// How an event's records differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A record under another ID: the event would be handed off again.
    Id,
    Shape,
    Decision,
    Added,
    Removed,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Id,
        Kind::Shape,
        Kind::Decision,
        Kind::Added,
        Kind::Removed,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Kind::Id => "id",
            Kind::Shape => "shape",
            Kind::Decision => "decision",
            Kind::Added => "added",
            Kind::Removed => "removed",
        }
    }
}

/// One policy's decision on an event and the IDs of the records it wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    pub decision: Decision,
    /// The outbox records' IDs (quarantine records' for a quarantined event), in order.
    pub ids: Vec<String>,
}

/// One event as both policies decided it.
#[derive(Clone, Debug)]
pub struct EventDiff {
    pub case: String,
    /// The event's number in its case's stream, from 1.
    pub number: usize,
    pub operation: String,
    pub old: Decided,
    pub new: Decided,
    /// What differs, in [`Kind`] order; empty when nothing does.
    pub kinds: Vec<Kind>,
    /// `(old, new)` for each record whose ID changed.
    pub id_changes: Vec<(String, String)>,
    /// The field paths whose types differ, over the records compared.
    pub shape: Vec<ShapeChange>,
    /// Records the new policy writes of the event beyond the old one's, and the reverse.
    pub added: usize,
    pub removed: usize,
}

/// A whole diff.
#[derive(Clone, Debug)]
pub struct Report {
    /// `(origin, sha256)` of each policy.
    pub old: (String, String),
    pub new: (String, String),
    /// What the events came from.
    pub source: String,
    pub cases: usize,
    /// Every event, in order, differing or not.
    pub events: Vec<EventDiff>,
}

impl Report {
    /// How many events differ in `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        self.events
            .iter()
            .filter(|e| e.kinds.contains(&kind))
            .count()
    }

    /// The events that differ in any way.
    pub fn differing(&self) -> impl Iterator<Item = &EventDiff> {
        self.events.iter().filter(|e| !e.kinds.is_empty())
    }
}

/// A case of one recorded stream, with runs enough to reach its end (`EVENTS_PER_RUN` events
/// each, one more per invalidation and one to find it idle), for consumer `consumer`.
pub fn stream_case(name: &str, fixture: Fixture, consumer: Option<&str>) -> Result<Case> {
    let events = fixture
        .entries
        .iter()
        .filter(|e| matches!(e, Entry::Event { .. }))
        .count();
    let invalidate = |entry: &&Entry| match entry {
        Entry::Event { event, .. } => event.get_str("operationType").ok() == Some("invalidate"),
        _ => false,
    };
    let invalidations = fixture.entries.iter().filter(invalidate).count();
    let runs = events.div_ceil(EVENTS_PER_RUN) + invalidations + 1;
    if runs > MAX_RUNS {
        return Err(HandoffError::BadInput(format!(
            "{name}: {events} events with {invalidations} invalidations need {runs} runs, over \
             the {MAX_RUNS} a diff makes: diff a shorter stretch"
        )));
    }
    let mut inputs = Map::new();
    inputs.insert("max_events".into(), json!(EVENTS_PER_RUN.to_string()));
    if let Some(consumer) = consumer {
        inputs.insert("consumer_id".into(), json!(consumer));
    }
    let mut spec = Map::new();
    spec.insert("description".into(), json!(name));
    spec.insert("runs".into(), json!(runs));
    spec.insert("inputs".into(), Value::Object(inputs));
    Ok(Case {
        name: name.to_string(),
        dir: name.into(),
        spec,
        fixture,
    })
}

/// The shipped sample stream (inserts, an update and a delete, the stream `policy new` gives a
/// project's first case) as a case: what `policy check --against` diffs over.
pub fn sample_case() -> Result<Case> {
    stream_case(
        "sample",
        Fixture::parse(crate::scaffold::SAMPLE_STREAM)?,
        None,
    )
}

/// A stream of `events` (change events as an outbox stores them, in order), as from `source`
/// (`db.coll`): each event once (a token met again is left out).
pub fn stream_of(events: Vec<Document>, source: &str) -> Fixture {
    let mut seen = std::collections::HashSet::new();
    let entries = events
        .into_iter()
        .filter_map(|event| {
            let token_text = canonical_text(event.get_document("_id").ok()?);
            seen.insert(token_text.clone())
                .then_some(Entry::Event { event, token_text })
        })
        .collect();
    Fixture {
        deployment: Some(RecordedDeployment {
            deployment: Deployment::replica_set(DEFAULT_SET_NAME, DEFAULT_REPLICA_SET_ID),
            source: source.to_string(),
        }),
        entries,
    }
}

/// Runs `cases` under both policies and compares them event by event. `params` (`KEY=VALUE`,
/// over each case's own) go to each policy that reads them; one neither reads is refused. A
/// policy that fails a run fails the diff (exit 9).
pub fn diff(
    runtime: &Runtime,
    old: &Side<'_>,
    new: &Side<'_>,
    cases: &[Case],
    params: &[(String, String)],
    source: &str,
) -> Result<Report> {
    let mut events = Vec::new();
    for case in cases {
        let mut given = case.params()?;
        for (key, value) in params {
            given.retain(|(k, _)| k != key);
            given.push((key.clone(), value.clone()));
        }
        let reads = |side: &Side<'_>| -> Vec<(String, String)> {
            given
                .iter()
                .filter(|p| runtime.check_params(side.policy, &[(*p).clone()]).is_ok())
                .cloned()
                .collect()
        };
        let (old_params, new_params) = (reads(old), reads(new));
        if let Some((key, _)) = given
            .iter()
            .find(|p| !old_params.contains(p) && !new_params.contains(p))
        {
            return Err(HandoffError::BadInput(format!(
                "{}: neither policy reads the parameter {}",
                case.name,
                handoff_domain::text::escape_untrusted(key, 80)
            )));
        }
        let (old_dump, old_failures) = run_side(runtime, old, case, old_params)?;
        let (new_dump, new_failures) = run_side(runtime, new, case, new_params)?;
        if let Some(failure) = failed(
            case,
            [("old", old, &old_failures), ("new", new, &new_failures)],
        ) {
            return Err(failure);
        }
        events.extend(compare_case(case, &old_dump, &new_dump));
    }
    Ok(Report {
        old: (old.source.origin.clone(), old.source.sha256.clone()),
        new: (new.source.origin.clone(), new.source.sha256.clone()),
        source: source.to_string(),
        cases: cases.len(),
        events,
    })
}

/// The store after `case` ran under one policy, given `params`, and the errors of its runs
/// that failed.
fn run_side(
    runtime: &Runtime,
    side: &Side<'_>,
    case: &Case,
    params: Vec<(String, String)>,
) -> Result<(handoff_domain::Dump, Vec<HandoffError>)> {
    let mut spec = case.spec.clone();
    spec.insert(
        "params".into(),
        Value::Object(params.into_iter().map(|(k, v)| (k, json!(v))).collect()),
    );
    let run = Case {
        name: case.name.clone(),
        dir: case.dir.clone(),
        spec,
        fixture: case.fixture.clone(),
    };
    let execution = run.execute(runtime, side.policy)?;
    Ok((execution.dump, execution.failures))
}

/// A policy that failed a run the other did not fail alike, as the diff's failure. Runs ending
/// alike for both (the stream's lost history, a case built to make the policy fail) are part of
/// the case.
fn failed(case: &Case, sides: [(&str, &Side<'_>, &[HandoffError]); 2]) -> Option<HandoffError> {
    let [(_, _, a), (_, _, b)] = sides;
    let alike = a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.kind() == y.kind() && x.to_string() == y.to_string());
    if alike {
        return None;
    }
    sides.into_iter().find_map(|(role, side, failures)| {
        let failure = failures
            .iter()
            .find(|f| matches!(f, HandoffError::Policy(_) | HandoffError::BadInput(_)))?;
        let message = format!(
            "the {role} policy {} failed on {}: {failure}",
            side.source.origin, case.name
        );
        Some(match failure {
            HandoffError::BadInput(_) => HandoffError::BadInput(message),
            _ => HandoffError::Policy(message),
        })
    })
}

#[cfg(test)]
mod tests;
