//! The default handoff policy.
//!
//! It reproduces the baseline task exactly: resume mode from the checkpoint, event ID = SHA-256 of
//! the canonical token text, one atomic commit per event, an invalidation saved with `startAfter`
//! and ending the run, and an idle watermark that never leaves an uncheckpointed gap.
//!
//! The decision logic ([`run`]) is plain Rust over the [`Host`] trait, so it is unit-tested natively
//! and can be measured natively; `component.rs` is the thin shell that binds it to the WIT contract
//! when built for `wasm32-wasip2`.

#[cfg(target_arch = "wasm32")]
mod component;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub max_events: u32,
    pub max_wait_ms: u64,
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
    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), String>;
    fn now_ms(&mut self) -> u64;
}

/// The seed-compatible event ID: lowercase hex SHA-256 of the canonical token text.
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

/// Drives one bounded run exactly as the baseline task does.
pub fn run<H: Host>(
    host: &mut H,
    checkpoint: Checkpoint,
    settings: &Settings,
) -> Result<Report, String> {
    let mut token = checkpoint.token.clone();
    let mut count: u32 = 0;
    let mut handed_off: u32 = 0;
    let mut last_id = String::new();
    let mut status = Status::Idle;

    host.open(stream_start(&checkpoint))?;
    let mut deadline = host.now_ms().saturating_add(settings.max_wait_ms);

    while count < settings.max_events && host.now_ms() < deadline {
        let Some(event) = host.next()? else {
            continue;
        };
        let id = event_id(&event.token);
        let mode = mode_after(&event);
        let outbox_id = (mode == Mode::ResumeAfter).then_some(id.as_str());
        host.commit(token.as_deref(), &event.token, mode, outbox_id)?;
        token = Some(event.token);
        count += 1;
        if mode == Mode::ResumeAfter {
            handed_off += 1;
            last_id = id;
            status = Status::HandedOff;
        } else {
            status = Status::Invalidated;
            break;
        }
        deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    }

    if count < settings.max_events && status != Status::Invalidated {
        let watermark = host.watermark();
        match (&watermark, &token) {
            (None, None) => {
                return Err(
                    "MongoDB did not provide an idle resume token; refusing to leave an uncheckpointed gap"
                        .to_string(),
                );
            }
            (Some(mark), current) if current.as_deref() != Some(mark.as_str()) => {
                host.advance_watermark(token.as_deref(), mark)?;
            }
            _ => {}
        }
    }

    Ok(Report {
        status,
        events_handed_off: handed_off,
        last_event_id: last_id,
    })
}

#[cfg(test)]
mod tests;
