//! Write a `handoff` policy as decisions only.
//!
//! A handoff policy is a WebAssembly component that the `handoff` host runs to move MongoDB
//! change events into a durable outbox. The host owns the stream, every transaction and the
//! checkpoint; the policy drives the run through the host's imports. This crate owns that run
//! loop, exactly as the default policy (the baseline task) runs it, so a policy supplies only what
//! is its own:
//!
//! - [`Policy::decide`]: what becomes of each delivered event — hand it off under an ID
//!   ([`Decision::HandOff`]), as a shaped domain event ([`Decision::Record`]), skip it
//!   ([`Decision::Skip`]) or quarantine it ([`Decision::Quarantine`]) — given the event (token,
//!   operation type, namespace, cluster time, and any field through [`Delivered::field`]) and
//!   its baseline ID;
//! - snapshot events too: `backfill` and `reconcile --repair` hand the watched collection's
//!   documents to the same [`Policy::decide`], as events whose operation type is `snapshot`
//!   ([`Event::is_snapshot`]; `fullDocument` is the document, `null` for one the source no longer
//!   holds), through the same run loop ([`RunKind`] tells the runs apart);
//! - source transactions: the events one MongoDB transaction wrote are committed together, in
//!   one transaction, and a run reads past `max_events` rather than end inside one
//!   ([`Delivered::source_transaction`] tells where an event stands in its transaction);
//! - optionally [`Policy::batch_size`] (events per transaction, default 1), construction from the
//!   run's [`Settings`] ([`FromSettings`], for parameters) and [`Policy::finish`] (end of run).
//!
//! [`run`] drives one bounded run: resume from the checkpoint (`resumeAfter`, or `startAfter`
//! after an invalidation, or now when there is none), commit events in delivery order (a batch is
//! committed when full, when the stream is caught up, at an invalidation and at the end of the
//! run), skip every invalidation and end the run there (saved with `startAfter`), stop after
//! `max_events` or `max_wait_ms` without an event, save the idle watermark without ever leaving
//! an uncheckpointed gap, and report.
//!
//! The loop is plain Rust over the [`Host`] trait, so a whole run unit-tests natively against
//! [`fake::FakeHost`]. Built for `wasm32`, `export_policy!` exports a policy as the component's
//! `handoff:policy/policy.run`, on the contract's bindings generated here from `wit/policy.wit`.
//!
//! # Example
//!
//! A policy that hands off everything but deletes, tested over a whole run:
//!
//! ```
//! use handoff_policy_sdk::fake::FakeHost;
//! use handoff_policy_sdk::{Decision, Delivered, Policy, Settings, Status, event_id};
//!
//! #[derive(Default)]
//! pub struct NoDeletes;
//!
//! impl Policy for NoDeletes {
//!     fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
//!         if event.operation_type == "delete" {
//!             Decision::Skip("deletes are not published".into())
//!         } else {
//!             Decision::HandOff(id)
//!         }
//!     }
//! }
//!
//! // In the component: handoff_policy_sdk::export_policy!(NoDeletes);
//!
//! let mut host = FakeHost::new()
//!     .event("A", "insert")
//!     .event("B", "delete")
//!     .event("C", "update")
//!     .watermark("W");
//! let report = handoff_policy_sdk::run::<NoDeletes>(&mut host, &Settings::new(50, 3000)).unwrap();
//! assert_eq!(report.status, Status::HandedOff);
//! assert_eq!(report.events_handed_off, 2);
//! assert_eq!(host.handed_off(), vec![event_id("A"), event_id("C")]);
//! assert_eq!(host.token(), Some("W")); // the idle watermark was saved
//! ```

#[cfg(target_arch = "wasm32")]
pub mod component;
pub mod fake;

use sha2::{Digest, Sha256};

mod function;
mod types;
pub use types::*;

/// Everything the host grants a policy (the `host` interface of `wit/policy.wit`). On wasm32,
/// `component::WitHost` implements it over the imports; [`fake::FakeHost`] implements it
/// natively for tests.
pub trait Host {
    /// The deployment this run is pinned to.
    fn deployment(&mut self) -> Deployment;
    /// The checkpoint as loaded before the run started.
    fn load_checkpoint(&mut self) -> Checkpoint;
    /// What this run reads (contract 1.3).
    fn run_kind(&mut self) -> RunKind {
        RunKind::Changes
    }
    /// Opens the change stream (at most one per run). A token in `start` must be the
    /// checkpoint's.
    fn open(&mut self, start: Start) -> Result<(), StreamError>;
    /// The next event, waiting at most the stream's await bound; `None` when caught up for now.
    fn next(&mut self) -> Result<Option<Event>, StreamError>;
    /// The stream's current resume position, `None` before the server reported one.
    fn watermark(&mut self) -> Option<String>;
    /// A field of a delivered event by dotted path, as relaxed Extended JSON text.
    fn field(&mut self, token: &str, path: &str) -> Option<String>;
    /// Whether the run follows the stream until the host stops it (contract 1.5, `run
    /// --follow`): neither `max_events` nor the idle timer ends it.
    fn follows(&mut self) -> bool {
        false
    }
    /// Where a delivered event stands in the source transaction that wrote it (contract 1.5);
    /// `None` when no transaction wrote it.
    fn source_transaction(&mut self, token: &str) -> Option<SourceTransaction> {
        let _ = token;
        None
    }
    /// Commits the next delivered event (contract 1.0): an outbox record under `outbox_id`, or
    /// none for an invalidation.
    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), CommitError>;
    /// Commits the next delivered events, one decision each in delivery order ending with the
    /// event whose token is `next`, in one transaction (contract 1.1; with [`Decision::Record`],
    /// 1.2). A record the outbox already holds for the same event (a checkpoint moved back) is
    /// not written twice: the host counts it as a suppressed duplicate.
    fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        decisions: Vec<Decision>,
    ) -> Result<(), CommitError>;
    /// Saves the stream's watermark as the checkpoint (`resumeAfter`), once every delivered
    /// event is committed.
    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), CommitError>;
    /// Milliseconds on a monotonic clock (virtual against a replay backend).
    fn now_ms(&mut self) -> u64;
    /// A structured log line through the host's logger (messages are cut at 1 KiB).
    fn log(&mut self, level: Level, message: &str, fields: &[(&str, &str)]);
}

/// A delivered event while the policy decides about it: the [`Event`] (it dereferences to it)
/// and what the policy may ask of the host meanwhile. The run loop keeps the stream and the
/// commits to itself.
pub struct Delivered<'a> {
    event: &'a Event,
    host: &'a mut dyn Host,
}

impl<'a> Delivered<'a> {
    /// The event as delivered by `host` (for tests of [`Policy::decide`] alone).
    pub fn new(event: &'a Event, host: &'a mut dyn Host) -> Delivered<'a> {
        Delivered { event, host }
    }

    /// The event.
    pub fn event(&self) -> &Event {
        self.event
    }

    /// A field of the event by dotted path (e.g. `fullDocument.status`), as relaxed Extended
    /// JSON text; `None` when absent.
    pub fn field(&mut self, path: &str) -> Option<String> {
        self.host.field(&self.event.token, path)
    }

    /// Where the event stands in the MongoDB transaction that wrote it; `None` when none did.
    /// The host commits all of a transaction's events in one transaction.
    pub fn source_transaction(&mut self) -> Option<SourceTransaction> {
        self.host.source_transaction(&self.event.token)
    }

    /// A structured log line through the host's logger.
    pub fn log(&mut self, level: Level, message: &str, fields: &[(&str, &str)]) {
        self.host.log(level, message, fields);
    }

    /// The deployment this run is pinned to.
    pub fn deployment(&mut self) -> Deployment {
        self.host.deployment()
    }

    /// What this run reads: the change stream, or a snapshot's documents.
    pub fn run_kind(&mut self) -> RunKind {
        self.host.run_kind()
    }

    /// Milliseconds on the host's monotonic clock.
    pub fn now_ms(&mut self) -> u64 {
        self.host.now_ms()
    }
}

impl std::ops::Deref for Delivered<'_> {
    type Target = Event;

    fn deref(&self) -> &Event {
        self.event
    }
}

/// How a policy is built from the run's settings. Every `Default` type has it (parameters are
/// then ignored); a policy with parameters implements it instead of `Default`, returning a clear
/// message for a bad parameter (the run fails with it before the stream opens). (A type cannot
/// have both: implementing it for a `Default` type conflicts with this blanket implementation.)
///
/// ```
/// use handoff_policy_sdk::{FromSettings, Settings};
///
/// struct Prefixed {
///     prefix: String,
/// }
///
/// impl FromSettings for Prefixed {
///     fn from_settings(settings: &Settings) -> Result<Prefixed, String> {
///         match settings.param("prefix") {
///             Some(p) if !p.is_empty() && p.len() <= 20 => Ok(Prefixed { prefix: p.into() }),
///             Some(p) => Err(format!("prefix must be 1-20 characters, not {p:?}")),
///             None => Err("the prefix parameter is required".into()),
///         }
///     }
/// }
///
/// assert!(Prefixed::from_settings(&Settings::default()).is_err());
/// let settings = Settings::default().param_set("prefix", "shop");
/// assert_eq!(Prefixed::from_settings(&settings).unwrap().prefix, "shop");
/// ```
pub trait FromSettings: Sized {
    fn from_settings(settings: &Settings) -> Result<Self, String>;
}

impl<T: Default> FromSettings for T {
    fn from_settings(_settings: &Settings) -> Result<T, String> {
        Ok(T::default())
    }
}

/// A policy's decisions; [`run`] drives everything else.
pub trait Policy: FromSettings {
    /// The parameters the policy reads (`--policy-param NAME=VALUE`), each with what it changes
    /// in one line. The host refuses a run given any other, before anything is written; a policy
    /// that reads none keeps the default.
    const PARAMETERS: &'static [(&'static str, &'static str)] = &[];

    /// What becomes of one delivered event, given its baseline ID ([`event_id`] of its token).
    /// Never called for an invalidation: the run skips it and ends there.
    fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision;

    /// How many events one transaction commits, 1 to [`MAX_BATCH`] (default 1). A batch is
    /// also committed when the stream is caught up, at an invalidation and at the end of the
    /// run, so events are never held back; it is cut only where a source transaction ends, so
    /// a batch grows past this size to take the rest of one.
    fn batch_size(&self) -> usize {
        1
    }

    /// The effect of an outbox record on a delivery's sink (`handoff deliver`, contract 1.6).
    /// It depends on the record alone (every attempt, in every process, must make the same
    /// effect); no run exists and the host's functions are not available. By default the
    /// host's: see [`Effect::Default`].
    fn effect(record: &DeliveryRecord) -> Effect
    where
        Self: Sized,
    {
        let _ = record;
        Effect::Default
    }

    /// What becomes of a failed delivery attempt; `None` (the default): what the host does
    /// (transient failures retried, others dead).
    fn classify(failure: &Failure) -> Option<Verdict>
    where
        Self: Sized,
    {
        let _ = failure;
        None
    }

    /// Called once after a successful run, every commit and the idle watermark done, with the
    /// report the run returns. An error fails the run (what was committed stays).
    fn finish(&mut self, host: &mut dyn Host, report: &Report) -> Result<(), String> {
        let _ = (host, report);
        Ok(())
    }
}

/// One bounded run of the policy `P`, built from `settings` ([`FromSettings`]).
pub fn run<P: Policy>(host: &mut dyn Host, settings: &Settings) -> Result<Report, String> {
    let mut policy = P::from_settings(settings)?;
    run_policy(&mut policy, host, settings)
}

/// How often a run that follows the stream saves its idle watermark, in milliseconds: a run
/// killed while idle reads at most this much of the stream again (events it never hands off).
pub const FOLLOW_WATERMARK_MS: u64 = 5_000;

/// How long, in milliseconds, the first event of a batch waits for others in a run that
/// follows the stream before what has arrived is committed (the stream going quiet commits it
/// sooner).
pub const FOLLOW_FLUSH_MS: u64 = 2;

/// Delivered events not yet committed, with their decisions.
#[derive(Default)]
struct Batch {
    /// When its first event arrived (the host's monotonic clock).
    since: u64,
    /// The token of the last one and the mode saved with it.
    last: Option<(String, Mode)>,
    decisions: Vec<Decision>,
}

impl Batch {
    /// Commits the pending decisions, if any, moving `token` to the last one.
    fn flush(&mut self, host: &mut dyn Host, token: &mut Option<String>) -> Result<(), String> {
        if let Some((next, mode)) = self.last.take() {
            let decisions = std::mem::take(&mut self.decisions);
            host.commit_batch(token.as_deref(), &next, mode, decisions)?;
            *token = Some(next);
        }
        Ok(())
    }
}

/// One bounded run of an already built policy: the baseline's loop with the policy's decisions.
pub fn run_policy<P: Policy>(
    policy: &mut P,
    host: &mut dyn Host,
    settings: &Settings,
) -> Result<Report, String> {
    let size = policy.batch_size();
    if !(1..=MAX_BATCH).contains(&size) {
        return Err(format!(
            "the batch size must be from 1 to {MAX_BATCH}, not {size}"
        ));
    }
    let checkpoint = host.load_checkpoint();
    let mut token = checkpoint.token.clone();
    let (mut events, mut handed_off) = (0u32, 0u32);
    let mut last_event_id = String::new();
    let mut invalidated = false;
    let mut batch = Batch::default();

    let follow = host.follows();
    host.open(stream_start(&checkpoint))?;
    let mut deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    // The last delivered event is inside a source transaction: the run reads past
    // `max_events` to finish it, and a batch is committed only where one ends.
    let mut inside = false;
    // A run that follows the stream saves its idle watermark as it goes, at most this often.
    let mut watermark_saved_at = host.now_ms();
    // Inside a source transaction its rest is already read: neither bound ends the run there.
    while follow || inside || (events < settings.max_events && host.now_ms() < deadline) {
        let Some(event) = host.next()? else {
            // Caught up for now: do not hold delivered events back.
            batch.flush(host, &mut token)?;
            if follow && host.now_ms().saturating_sub(watermark_saved_at) >= FOLLOW_WATERMARK_MS {
                if let Some(mark) = host.watermark()
                    && token.as_deref() != Some(mark.as_str())
                {
                    host.advance_watermark(token.as_deref(), &mark)?;
                    token = Some(mark);
                }
                watermark_saved_at = host.now_ms();
            }
            continue;
        };
        events += 1;
        if event.is_invalidate() {
            // Never handed off; saved with `startAfter`, it ends the batch and the run, which
            // reports the invalidate event's own ID, as the baseline does.
            batch.decisions.push(Decision::Skip("invalidate".into()));
            last_event_id = event_id(&event.token);
            batch.last = Some((event.token, Mode::StartAfter));
            invalidated = true;
            break;
        }
        inside = host
            .source_transaction(&event.token)
            .is_some_and(|txn| !txn.is_last());
        let id = event_id(&event.token);
        let decision = policy.decide(&mut Delivered::new(&event, host), id);
        if let Some(id) = decision.handed_off() {
            handed_off += 1;
            last_event_id = id.to_string();
        }
        if batch.decisions.is_empty() {
            batch.since = host.now_ms();
        }
        batch.decisions.push(decision);
        batch.last = Some((event.token, Mode::ResumeAfter));
        // Following the stream, what has arrived is committed once its first event has waited
        // FOLLOW_FLUSH_MS, without waiting for the batch to fill.
        let waited = follow && host.now_ms().saturating_sub(batch.since) >= FOLLOW_FLUSH_MS;
        if ((batch.decisions.len() >= size || waited) && !inside)
            || batch.decisions.len() >= MAX_BATCH
        {
            batch.flush(host, &mut token)?;
        }
        deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    }
    batch.flush(host, &mut token)?;
    if events < settings.max_events && !invalidated {
        save_idle_watermark(host, token.as_deref())?;
    }
    let report = Report {
        status: status(handed_off, invalidated),
        events_handed_off: handed_off,
        last_event_id,
    };
    policy.finish(host, &report)?;
    Ok(report)
}

/// Saves the idle watermark after a run that neither hit `max_events` nor was invalidated, as the
/// baseline does: nothing to save when it equals the token, an error when there is no token at all.
pub fn save_idle_watermark(host: &mut dyn Host, token: Option<&str>) -> Result<(), String> {
    match (host.watermark(), token) {
        (None, None) => Err(
            "MongoDB did not provide an idle resume token; refusing to leave an uncheckpointed gap"
                .to_string(),
        ),
        (Some(mark), current) if current != Some(mark.as_str()) => {
            Ok(host.advance_watermark(current, &mark)?)
        }
        _ => Ok(()),
    }
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
    if event.is_invalidate() {
        Mode::StartAfter
    } else {
        Mode::ResumeAfter
    }
}

#[cfg(test)]
mod tests;
