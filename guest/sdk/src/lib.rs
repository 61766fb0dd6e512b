//! What every handoff policy in this repository builds on.
//!
//! Decision logic is plain Rust over the [`Host`] trait, so it unit-tests and runs natively; the
//! baseline's helpers live here (event ID, resume mode, idle watermark, status). On wasm32,
//! `component` holds the contract's generated bindings (with a public `export!` macro) and
//! [`component::WitHost`], the adapter from the imports to [`Host`]: a policy crate only
//! implements `Guest::run` and calls `export!`.

#[cfg(target_arch = "wasm32")]
pub mod component;

use sha2::{Digest, Sha256};

/// How a stream resumes from a saved token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    ResumeAfter,
    StartAfter,
}

/// The checkpoint as the host loaded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub token: Option<String>,
    pub mode: Mode,
}

/// Where the stream opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    Now,
    ResumeAfter(String),
    StartAfter(String),
}

/// What the policy needs of a delivered event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub token: String,
    pub operation_type: String,
}

/// The run's outcome as reported to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Idle,
    HandedOff,
    Invalidated,
}

/// The limits of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub max_events: u32,
    pub max_wait_ms: u64,
    /// Policy parameters, `key=value` pairs given to the host.
    pub params: Vec<(String, String)>,
}

impl Settings {
    /// A policy parameter by key.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An outbox record shaped by the policy (contract 1.2): a domain event with a stable business
/// schema. `aggregate_id`, `aggregate_version` and `payload` are Extended JSON text (what
/// [`Host::field`] returns reads back as is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The event ID.
    pub id: String,
    /// `eventType`, e.g. `OrderCreated`: 1-100 characters from `[A-Za-z0-9._:-]`.
    pub event_type: String,
    pub schema_version: u32,
    /// One Extended JSON value, e.g. `"o-5"`; at most 1 KiB.
    pub aggregate_id: String,
    /// One Extended JSON value, when known.
    pub aggregate_version: Option<String>,
    /// One Extended JSON document (no `_id` at its top level, no `$` keys); at most 4 MiB.
    pub payload: String,
}

/// What a batched commit does with one delivered event (contract 1.1; `Record` 1.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An outbox record with this event ID.
    HandOff(String),
    /// This policy-shaped outbox record.
    Record(Box<Record>),
    /// No record; the checkpoint moves past the event.
    Skip(String),
    /// A quarantine record with this ID and reason.
    Quarantine { id: String, reason: String },
}

/// The report of a successful run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub status: Status,
    pub events_handed_off: u32,
    pub last_event_id: String,
}

/// The host primitives the policy drives. Errors are the host's messages; the host keeps the
/// classification of every failure it reported, so the policy only adds context.
pub trait Host {
    fn open(&mut self, start: Start) -> Result<(), String>;
    fn next(&mut self) -> Result<Option<Event>, String>;
    fn watermark(&mut self) -> Option<String>;
    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), String>;
    /// Commits the next delivered events, one decision each, in one transaction (contract 1.1;
    /// with [`Decision::Record`], 1.2). A record the outbox already holds for the same event (a
    /// checkpoint moved back) is not written twice: the host counts it as a suppressed duplicate.
    fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        decisions: Vec<Decision>,
    ) -> Result<(), String>;
    /// A field of a delivered event by dotted path, as relaxed Extended JSON text.
    fn field(&mut self, token: &str, path: &str) -> Option<String>;
    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), String>;
    fn now_ms(&mut self) -> u64;
}

/// Saves the idle watermark after a run that neither hit `max_events` nor was invalidated, as the
/// baseline does: nothing to save when it equals the token, an error when there is no token at all.
pub fn save_idle_watermark<H: Host>(host: &mut H, token: Option<&str>) -> Result<(), String> {
    match (host.watermark(), token) {
        (None, None) => Err(
            "MongoDB did not provide an idle resume token; refusing to leave an uncheckpointed gap"
                .to_string(),
        ),
        (Some(mark), current) if current != Some(mark.as_str()) => {
            host.advance_watermark(current, &mark)
        }
        _ => Ok(()),
    }
}

/// What a run has taken so far; [`Tally::finish`] ends it as the baseline does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The checkpoint token the run holds.
    pub token: Option<String>,
    /// Events taken from the stream (handed off, skipped or quarantined).
    pub events: u32,
    pub handed_off: u32,
    pub last_event_id: String,
    pub invalidated: bool,
}

impl Tally {
    pub fn new(checkpoint: &Checkpoint) -> Tally {
        Tally {
            token: checkpoint.token.clone(),
            ..Tally::default()
        }
    }

    /// Records the invalidation that ends the run; like the baseline, the run then reports the
    /// invalidate event's own ID as its last event ID.
    pub fn invalidate(&mut self, canonical_token: &str) {
        self.invalidated = true;
        self.last_event_id = event_id(canonical_token);
    }

    /// Records an event handed off under `id`.
    pub fn hand_off(&mut self, id: String) {
        self.handed_off += 1;
        self.last_event_id = id;
    }

    /// Saves the idle watermark unless the run hit `max_events` or was invalidated, then reports.
    pub fn finish<H: Host>(self, host: &mut H, settings: &Settings) -> Result<Report, String> {
        if self.events < settings.max_events && !self.invalidated {
            save_idle_watermark(host, self.token.as_deref())?;
        }
        Ok(Report {
            status: status(self.handed_off, self.invalidated),
            events_handed_off: self.handed_off,
            last_event_id: self.last_event_id,
        })
    }
}

/// The baseline's run with one commit per event, each event becoming what `decide` says (given
/// the event and its baseline ID). An invalidate is always skipped and ends the run, saved with
/// `startAfter`; the idle watermark and the report are the baseline's.
pub fn run_each<H: Host>(
    host: &mut H,
    checkpoint: Checkpoint,
    settings: &Settings,
    mut decide: impl FnMut(&mut H, &Event, String) -> Decision,
) -> Result<Report, String> {
    let mut tally = Tally::new(&checkpoint);
    host.open(stream_start(&checkpoint))?;
    let mut deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    while tally.events < settings.max_events && host.now_ms() < deadline {
        let Some(event) = host.next()? else { continue };
        let mode = mode_after(&event);
        let decision = if mode == Mode::StartAfter {
            Decision::Skip("invalidate".into())
        } else {
            decide(host, &event, event_id(&event.token))
        };
        let handed_off = match &decision {
            Decision::HandOff(id) => Some(id.clone()),
            Decision::Record(record) => Some(record.id.clone()),
            Decision::Skip(_) | Decision::Quarantine { .. } => None,
        };
        host.commit_batch(tally.token.as_deref(), &event.token, mode, vec![decision])?;
        tally.events += 1;
        if mode == Mode::StartAfter {
            tally.invalidate(&event.token);
            tally.token = Some(event.token);
            break;
        }
        tally.token = Some(event.token);
        if let Some(id) = handed_off {
            tally.hand_off(id);
        }
        deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    }
    tally.finish(host, settings)
}

/// The status a run reports, from what it committed.
pub fn status(handed_off: u32, invalidated: bool) -> Status {
    if invalidated {
        Status::Invalidated
    } else if handed_off > 0 {
        Status::HandedOff
    } else {
        Status::Idle
    }
}

/// The baseline's event ID: lowercase hex SHA-256 of the canonical token text.
pub fn event_id(canonical_token: &str) -> String {
    hex::encode(Sha256::digest(canonical_token.as_bytes()))
}

/// Resume-mode selection: no token starts now; otherwise the saved mode decides.
pub fn stream_start(checkpoint: &Checkpoint) -> Start {
    match (&checkpoint.token, checkpoint.mode) {
        (None, _) => Start::Now,
        (Some(token), Mode::ResumeAfter) => Start::ResumeAfter(token.clone()),
        (Some(token), Mode::StartAfter) => Start::StartAfter(token.clone()),
    }
}

/// The mode saved with an event's token: only an invalidation needs `startAfter`.
pub fn mode_after(event: &Event) -> Mode {
    if event.operation_type == "invalidate" {
        Mode::StartAfter
    } else {
        Mode::ResumeAfter
    }
}
