//! The delivery loop: admit what the outbox stream brings, pick what is due, make the effects,
//! settle them in the ledger.
//!
//! - **Lanes.** Entries of one lane (one source document) are worked in admission order, one
//!   at a time for an external sink; different lanes go in parallel, `concurrency` workers at
//!   once. A transactional sink takes a lane's consecutive due entries in one transaction.
//! - **Retries never stall the stream.** A transient failure is retried after a backoff with
//!   jitter (at least the sink's `Retry-After`), up to `max_attempts`; then, or at once for a
//!   permanent failure, the entry is dead. A failed entry waits only in its lane; a dead one
//!   holds its lane back when `hold_dead_lanes` says so (by default), never another lane.
//! - **Bounded.** At most `max_in_flight` records and `max_in_flight_bytes` of them are being
//!   delivered; the ledger is read a window at a time; nothing queues without bound. A slow
//!   sink slows picking, and the open entries (the delivery's lag) grow where they are seen.
//! - **Admission beside delivery.** The outbox is read and admitted (by the ledger's admitter:
//!   the outbox's change stream, or the embedded store's commit order) on a thread of its
//!   own, so that waiting for new records never delays settling outcomes or picking what is
//!   due, and a group's commit never delays the next admission; the delivering thread wakes
//!   for either.
//! - **Leases.** An external sink's attempt is claimed first (in progress, owner, lease end, one
//!   attempt more), so a second deliverer never works it; a deliverer killed mid-attempt leaves
//!   a lease that ends, and the entry is tried again with the same idempotency key.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bson::{DateTime, Document};
use handoff_domain::StopSignal;
use handoff_domain::delivery::{Entry, MAX_ERROR_TEXT, Operation, Request, Status};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::ledger::{Admit, Ledger, Names, Settlement};
use handoff_domain::text::escape_untrusted;

use crate::retry::Backoff;
use crate::sink::{Attempt, Outcome, Sink, SinkFailure};
use handoff_domain::effect::{Decided, EffectPolicy, FailureNote, Verdict};

/// Open entries read per look at the ledger.
const WINDOW: usize = 1000;
/// Entries a transactional sink commits together.
const GROUP: usize = 100;
/// How long a pass waits for workers when nothing else is to be done.
const RESULT_WAIT: Duration = Duration::from_millis(20);

/// How a delivery runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub names: Names,
    /// Keep going until stopped (else: until drained and idle for `max_wait`).
    pub follow: bool,
    /// End after this many attempts were settled.
    pub max_records: Option<u64>,
    pub max_wait: Duration,
    pub max_attempts: u32,
    pub concurrency: usize,
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    pub lease: Duration,
    pub hold_dead_lanes: bool,
    pub backoff: Backoff,
    /// This deliverer's name in leases.
    pub owner: String,
    /// The outbox stream's await bound.
    pub max_await: Duration,
    pub deadline: Option<Instant>,
}

/// Why a delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Nothing was due and nothing came for `max_wait`.
    Drained,
    MaxRecords,
    Stopped,
    Deadline,
}

impl Ended {
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Drained => "DRAINED",
            Ended::MaxRecords => "MAX_RECORDS",
            Ended::Stopped => "STOPPED",
            Ended::Deadline => "DEADLINE",
        }
    }
}

/// What a delivery did, and where its ledger stands at the end.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub admitted: u64,
    pub attempts: u64,
    /// Effects the sink accepted.
    pub delivered: u64,
    /// Of those, writes a newer version made unnecessary (a projection).
    pub superseded: u64,
    /// Transient failures, to be tried again.
    pub retried: u64,
    /// Entries that went dead in this run.
    pub dead: u64,
    pub ignored: u64,
    /// The most records in flight at once.
    pub max_in_flight: usize,
    pub sweeps: u32,
    /// At the end: entries still open, and dead.
    pub open: u64,
    pub dead_total: u64,
    /// At the end: how long the oldest open entry has waited since its admission.
    pub lag_seconds: Option<f64>,
    pub ended: Option<Ended>,
}

/// Where a running delivery stands, for what watches it (the metrics endpoint).
pub struct Progress<'a> {
    /// What the run did so far (its counters only; the end figures are not read yet).
    pub report: &'a Report,
    pub in_flight: usize,
    pub in_flight_bytes: usize,
    /// When the oldest open entry was admitted, as last read (`None`: none was open).
    pub oldest_open: Option<DateTime>,
}

/// What watches a running delivery: told when its stream is open and how it stands after each
/// pass. Called on the delivering thread: it must not block.
pub trait Watch: Sync {
    fn opened(&self);
    fn progress(&self, progress: &Progress<'_>);
}

/// One job for a worker.
struct Job {
    entry: Entry,
    event_id: String,
    request: Request,
}

/// A worker's answer.
struct Done {
    entry: Entry,
    outcome: Outcome,
}

/// What wakes the delivering thread.
enum Wake {
    /// An attempt's outcome.
    Done(Box<Done>),
    /// Records were admitted (how many, and a failure of admission, are in [`Admissions`]).
    Admitted,
}

/// What the admitting thread tells the delivering one.
#[derive(Default)]
struct Admissions {
    /// Records admitted since the delivering thread last looked: one wake-up is sent when this
    /// leaves zero, so at most one is waiting however fast records come.
    came: AtomicUsize,
    admitted: AtomicU64,
    sweeps: AtomicU32,
    /// Why admission ended, when it failed.
    failed: Mutex<Option<HandoffError>>,
    /// Set when the delivery ends: admission stops after its current read.
    quit: AtomicBool,
}

/// Sets [`Admissions::quit`] when dropped, however the delivering thread leaves.
struct QuitOnDrop<'a>(&'a Admissions);

impl Drop for QuitOnDrop<'_> {
    fn drop(&mut self) {
        self.0.quit.store(true, Ordering::Release);
    }
}

/// The admitting thread: the outbox stream read (each read bounded by the stream's await) and
/// admitted until the delivery ends or admission fails.
fn admitting(admitter: &mut dyn Admit, shared: &Admissions, wake: &mpsc::Sender<Wake>) {
    while !shared.quit.load(Ordering::Acquire) {
        let polled = admitter.poll();
        shared
            .admitted
            .store(admitter.admitted(), Ordering::Relaxed);
        shared.sweeps.store(admitter.sweeps(), Ordering::Relaxed);
        match polled {
            Ok(0) => {}
            Ok(n) => {
                if shared.came.fetch_add(n, Ordering::AcqRel) == 0
                    && wake.send(Wake::Admitted).is_err()
                {
                    return;
                }
            }
            Err(error) => {
                if let Ok(mut failed) = shared.failed.lock() {
                    *failed = Some(error);
                }
                let _ = wake.send(Wake::Admitted);
                return;
            }
        }
    }
}

/// What woke the delivering thread in one look.
struct Woken {
    /// Records admitted since the last look.
    came: usize,
    done: Vec<Done>,
    /// Admission failed: the delivery ends with this once the outcomes are settled.
    failed: Option<HandoffError>,
}

/// The record's event ID (`<consumer>/<id>` less the consumer).
fn event_id(names: &Names, record: &str) -> String {
    record
        .strip_prefix(&format!("{}/", names.consumer))
        .unwrap_or(record)
        .to_string()
}

/// Runs a delivery of the consumer's outbox to `sink`, its ledger in `ledger`.
pub fn deliver(
    ledger: &dyn Ledger,
    sink: &dyn Sink,
    effects: &mut dyn EffectPolicy,
    options: &Options,
    stop: &StopSignal,
    watch: Option<&dyn Watch>,
) -> Result<Report> {
    let names = &options.names;
    let pin = sink.pin();
    let position = ledger.open(names, &pin)?;
    let pinned = position.get_str("sink").unwrap_or_default();
    if pinned != pin {
        return Err(HandoffError::Mismatch(format!(
            "delivery {} of consumer {} delivers to {}, not {}: a delivery keeps its sink (name \
             another delivery with --delivery for another sink)",
            escape_untrusted(&names.delivery, 80),
            escape_untrusted(&names.consumer, 200),
            escape_untrusted(pinned, 300),
            escape_untrusted(&pin, 300),
        )));
    }
    let mut admitter = ledger.admitter(names, &position, options.max_await)?;
    if let Some(watch) = watch {
        watch.opened();
    }
    let admissions = Admissions {
        admitted: AtomicU64::new(admitter.admitted()),
        sweeps: AtomicU32::new(admitter.sweeps()),
        ..Admissions::default()
    };
    let mut run = Run {
        admissions: &admissions,
        watch,
        oldest_open: None,
        ledger,
        sink,
        effects,
        options,
        report: Report::default(),
        flights: HashMap::new(),
        busy_lanes: HashSet::new(),
        settled: 0,
    };
    let ended = std::thread::scope(|scope| {
        let quit = QuitOnDrop(&admissions);
        let (wake, woken) = mpsc::channel::<Wake>();
        {
            let wake = wake.clone();
            let admissions = &admissions;
            let admitter = admitter.as_mut();
            scope.spawn(move || admitting(admitter, admissions, &wake));
        }
        let ended = if sink.transactional() {
            drop(wake);
            run.inline(&woken, stop)
        } else {
            let (jobs, inbox) = mpsc::sync_channel::<Job>(options.max_in_flight);
            let inbox = Arc::new(Mutex::new(inbox));
            for _ in 0..options.concurrency {
                let inbox = inbox.clone();
                let wake = wake.clone();
                scope.spawn(move || worker(sink, &inbox, &wake, &options.owner));
            }
            drop(wake);
            let ended = run.pooled(&woken, stop, &jobs);
            drop(jobs);
            ended
        };
        drop(quit);
        ended
    })?;
    run.report.admitted = admissions.admitted.load(Ordering::Relaxed);
    run.report.sweeps = admissions.sweeps.load(Ordering::Relaxed);
    run.report.ended = Some(ended);
    run.finish()?;
    Ok(run.report)
}

/// One worker: jobs in, outcomes out, until the jobs end.
fn worker(
    sink: &dyn Sink,
    inbox: &Mutex<mpsc::Receiver<Job>>,
    done: &mpsc::Sender<Wake>,
    owner: &str,
) {
    loop {
        let job = match inbox.lock() {
            Ok(inbox) => inbox.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let attempt = Attempt {
            entry: &job.entry.id,
            record: &job.entry.record,
            event_id: &job.event_id,
            number: job.entry.attempts + 1,
            owner,
            request: &job.request,
        };
        let outcome = sink.deliver(&attempt);
        if done
            .send(Wake::Done(Box::new(Done {
                entry: job.entry,
                outcome,
            })))
            .is_err()
        {
            return;
        }
    }
}

/// A record being delivered.
struct Flight {
    lane: String,
    bytes: usize,
}

/// A picked entry with its record.
struct Picked {
    entry: Entry,
    request: Request,
    bytes: usize,
}

struct Run<'a> {
    admissions: &'a Admissions,
    watch: Option<&'a dyn Watch>,
    /// The oldest open entry's admission, as last read.
    oldest_open: Option<DateTime>,
    ledger: &'a dyn Ledger,
    sink: &'a dyn Sink,
    effects: &'a mut dyn EffectPolicy,
    options: &'a Options,
    report: Report,
    /// In flight, by entry `_id`.
    flights: HashMap<String, Flight>,
    busy_lanes: HashSet<String>,
    /// Attempts settled (for `max_records`).
    settled: u64,
}

impl Run<'_> {
    fn names(&self) -> &Names {
        &self.options.names
    }

    /// Why the run should stop taking work now, if it should.
    fn ending(&self, stop: &StopSignal) -> Option<Ended> {
        if stop.requested() {
            return Some(Ended::Stopped);
        }
        if self.options.deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(Ended::Deadline);
        }
        if self.options.max_records.is_some_and(|m| self.settled >= m) {
            return Some(Ended::MaxRecords);
        }
        None
    }

    /// How many more attempts may start (in flight and `max_records`).
    fn room(&self) -> usize {
        let flight = self
            .options
            .max_in_flight
            .saturating_sub(self.flights.len());
        match self.options.max_records {
            Some(max) => {
                let left = max.saturating_sub(self.settled + self.flights.len() as u64);
                flight.min(usize::try_from(left).unwrap_or(usize::MAX))
            }
            None => flight,
        }
    }

    fn bytes_in_flight(&self) -> usize {
        self.flights.values().map(|f| f.bytes).sum()
    }

    /// Tells the watcher, if any, how the run stands.
    fn show(&self, in_flight: usize, in_flight_bytes: usize) {
        let Some(watch) = self.watch else {
            return;
        };
        let report = Report {
            admitted: self.admissions.admitted.load(Ordering::Relaxed),
            sweeps: self.admissions.sweeps.load(Ordering::Relaxed),
            ..self.report.clone()
        };
        watch.progress(&Progress {
            report: &report,
            in_flight,
            in_flight_bytes,
            oldest_open: self.oldest_open,
        });
    }

    /// The entries due now, at most `room`, in admission order: the first open entry of each
    /// lane not busy here and not held back by a dead entry (`per_lane`: how many consecutive
    /// due entries of a lane may be taken).
    fn due(&mut self, room: usize, per_lane: usize) -> Result<Vec<Picked>> {
        if room == 0 {
            return Ok(Vec::new());
        }
        let names = self.names().clone();
        // What is in flight here comes first (open, in admission order), then the rest.
        let window = (self.flights.len() + 2 * room + 32).min(WINDOW);
        let documents = self.ledger.open_entries(&names, window)?;
        self.oldest_open = documents
            .first()
            .and_then(|d| d.get_datetime("createdAt").ok())
            .copied();
        let held = self.held_lanes(&documents)?;
        let now = DateTime::now();
        let owner = self.options.owner.as_str();
        let mut closed_lanes: HashSet<String> = HashSet::new();
        let mut taken_of_lane: HashMap<String, usize> = HashMap::new();
        let mut picked = Vec::new();
        for document in &documents {
            let Some(entry) = Entry::from_document(document) else {
                tracing::warn!("a ledger entry this tool did not write is left as it is");
                continue;
            };
            if closed_lanes.contains(&entry.lane) {
                continue;
            }
            let taken = taken_of_lane.entry(entry.lane.clone()).or_default();
            let usable = !self.busy_lanes.contains(&entry.lane)
                && !held.contains(&entry.lane)
                && !self.flights.contains_key(&entry.id)
                && entry.is_due(owner, now)
                && *taken < per_lane;
            if !usable {
                closed_lanes.insert(entry.lane.clone());
                continue;
            }
            *taken += 1;
            picked.push(entry);
            if picked.len() >= room {
                break;
            }
        }
        self.with_records(picked)
    }

    /// The lanes of `documents` a dead entry holds back.
    fn held_lanes(&self, documents: &[Document]) -> Result<HashSet<String>> {
        if !self.options.hold_dead_lanes {
            return Ok(HashSet::new());
        }
        let lanes: HashSet<&str> = documents
            .iter()
            .filter_map(|d| d.get_str("lane").ok())
            .collect();
        let lanes: Vec<&str> = lanes.into_iter().collect();
        self.ledger.dead_lanes(self.names(), &lanes)
    }

    /// The picked entries with their records and the requests the policy makes of them; an
    /// entry whose record is gone, or which the policy refuses, is settled dead. A policy that
    /// fails (a trap, a bound, nonsense) ends the delivery: the entry stays for the next run.
    fn with_records(&mut self, entries: Vec<Entry>) -> Result<Vec<Picked>> {
        let ids: Vec<&str> = entries.iter().map(|e| e.record.as_str()).collect();
        let records = self.ledger.records(self.names(), &ids)?;
        let mut by_id: HashMap<String, Document> = records
            .into_iter()
            .filter_map(|r| Some((r.get_str("_id").ok()?.to_string(), r)))
            .collect();
        let mut picked = Vec::new();
        let mut dead = Vec::new();
        let kind = self.sink.kind();
        let dead_now = |entry: &Entry, class: &str, error: String| Settlement {
            entry: entry.id.clone(),
            status: Status::Dead,
            unclaimed_attempts: Some(entry.attempts),
            next_attempt: None,
            error_class: Some(class.into()),
            error: Some(error),
            evidence: None,
        };
        for entry in entries {
            let Some(record) = by_id.remove(&entry.record) else {
                dead.push(dead_now(
                    &entry,
                    "record_missing",
                    "the outbox no longer holds the record".into(),
                ));
                continue;
            };
            let bytes = bson::RawDocumentBuf::try_from(&record).map_or(0, |b| b.as_bytes().len());
            match self
                .effects
                .effect(&self.options.names.delivery, kind, &record)?
            {
                Decided::Request(request) => picked.push(Picked {
                    entry,
                    request: *request,
                    bytes,
                }),
                Decided::Refused(reason) => {
                    tracing::info!(entry_seq = entry.seq, "the policy refused a record");
                    let reason = escape_untrusted(&reason, MAX_ERROR_TEXT);
                    dead.push(dead_now(&entry, "policy_refused", reason));
                }
            }
        }
        if !dead.is_empty() {
            self.report.dead += dead.len() as u64;
            self.settled += dead.len() as u64;
            self.settle(&dead)?;
        }
        Ok(picked)
    }

    fn settle(&self, settlements: &[Settlement]) -> Result<u64> {
        if settlements.is_empty() {
            return Ok(0);
        }
        self.ledger
            .settle(self.names(), &self.options.owner, settlements)
    }

    /// The settlement of an attempt's outcome (`None`: the sink settled it itself).
    fn settlement(
        &mut self,
        entry: &Entry,
        outcome: &Outcome,
        claimed: bool,
    ) -> Result<Option<Settlement>> {
        self.report.attempts += 1;
        self.settled += 1;
        let unclaimed_attempts = (!claimed).then_some(entry.attempts);
        let attempts = entry.attempts + 1;
        match outcome {
            Outcome::Accepted { evidence, settled } => {
                self.report.delivered += 1;
                if evidence.outcome.as_deref() == Some("superseded") {
                    self.report.superseded += 1;
                }
                Ok((!settled).then(|| Settlement {
                    entry: entry.id.clone(),
                    status: Status::Succeeded,
                    unclaimed_attempts,
                    next_attempt: None,
                    error_class: None,
                    error: None,
                    evidence: Some(evidence.document()),
                }))
            }
            Outcome::Failed(failure) => self
                .failed(entry, failure, attempts, unclaimed_attempts)
                .map(Some),
        }
    }

    /// A failed attempt: retried later, dead or ignored, as the policy classifies it (by
    /// default: transient ones retried up to the attempts' bound, the others dead).
    fn failed(
        &mut self,
        entry: &Entry,
        failure: &SinkFailure,
        attempts: u32,
        unclaimed_attempts: Option<u32>,
    ) -> Result<Settlement> {
        let text: String = escape_untrusted(&failure.text, MAX_ERROR_TEXT);
        let transient = failure.class == crate::sink::FailureClass::Transient;
        let verdict = self.effects.classify(&FailureNote {
            record: &entry.record,
            sink: self.sink.kind(),
            attempt: attempts,
            transient,
            http_status: failure.evidence.status,
            message: &text,
        })?;
        if verdict == Some(Verdict::Ignore) {
            self.report.ignored += 1;
            tracing::info!(
                entry_seq = entry.seq,
                attempts,
                "the policy ignores a failed record"
            );
            return Ok(Settlement {
                entry: entry.id.clone(),
                status: Status::Ignored,
                unclaimed_attempts,
                next_attempt: None,
                error_class: Some("policy_ignored".into()),
                error: Some(text),
                evidence: Some(failure.evidence.document()),
            });
        }
        let permanent = match verdict {
            Some(Verdict::Dead) => true,
            Some(Verdict::Retry) => false,
            _ => !transient,
        };
        let out_of_attempts = attempts >= self.options.max_attempts;
        let (status, next_attempt, error) = if permanent || out_of_attempts {
            self.report.dead += 1;
            let error = if permanent {
                text
            } else {
                format!("gave up after {attempts} attempts: {text}")
            };
            (Status::Dead, None, error)
        } else {
            self.report.retried += 1;
            let pause = self.options.backoff.pause(attempts, failure.retry_after);
            let at = DateTime::from_millis(
                DateTime::now()
                    .timestamp_millis()
                    .saturating_add(i64::try_from(pause.as_millis()).unwrap_or(i64::MAX)),
            );
            (Status::Failed, Some(at), text)
        };
        tracing::info!(
            entry_seq = entry.seq,
            attempts,
            class = failure.class.as_str(),
            status = status.as_str(),
            "a delivery attempt failed"
        );
        Ok(Settlement {
            entry: entry.id.clone(),
            status,
            unclaimed_attempts,
            next_attempt,
            error_class: Some(failure.class.as_str().into()),
            error: Some(error),
            evidence: Some(failure.evidence.document()),
        })
    }

    /// The ignored entries among `picked` settled (no effect), the others returned.
    fn settle_ignored(&mut self, picked: Vec<Picked>, claimed: bool) -> Result<Vec<Picked>> {
        let (ignored, rest): (Vec<Picked>, Vec<Picked>) = picked
            .into_iter()
            .partition(|p| p.request.operation == Operation::Ignore);
        let settlements: Vec<Settlement> = ignored
            .iter()
            .map(|p| Settlement {
                entry: p.entry.id.clone(),
                status: Status::Ignored,
                unclaimed_attempts: (!claimed).then_some(p.entry.attempts),
                next_attempt: None,
                error_class: None,
                error: None,
                evidence: None,
            })
            .collect();
        self.report.ignored += settlements.len() as u64;
        self.settled += settlements.len() as u64;
        self.settle(&settlements)?;
        Ok(rest)
    }

    /// Whether a bounded run has been idle long enough to end.
    fn idle_over(&self, idle_since: Instant) -> bool {
        !self.options.follow && idle_since.elapsed() >= self.options.max_wait
    }

    /// What woke this thread: waiting at most `wait` for the first wake-up, then what else
    /// is there.
    fn look(&self, woken: &mpsc::Receiver<Wake>, wait: Duration) -> Result<Woken> {
        let first = if wait.is_zero() {
            woken.try_recv().ok()
        } else {
            match woken.recv_timeout(wait) {
                Ok(wake) => Some(wake),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(HandoffError::Internal(anyhow_lite(
                        "the delivery's admission and workers ended",
                    )));
                }
            }
        };
        let mut done = Vec::new();
        for wake in first.into_iter().chain(woken.try_iter()) {
            if let Wake::Done(d) = wake {
                done.push(*d);
            }
        }
        let failed = self
            .admissions
            .failed
            .lock()
            .ok()
            .and_then(|mut failed| failed.take());
        Ok(Woken {
            came: self.admissions.came.swap(0, Ordering::AcqRel),
            done,
            failed,
        })
    }

    /// A transactional sink: each pass picks a group and commits it in this thread, waiting
    /// for admission when nothing is due.
    fn inline(&mut self, woken: &mpsc::Receiver<Wake>, stop: &StopSignal) -> Result<Ended> {
        let mut idle_since = Instant::now();
        let mut backlog = true;
        loop {
            self.show(0, 0);
            if let Some(ended) = self.ending(stop) {
                return Ok(ended);
            }
            let wait = if backlog {
                Duration::ZERO
            } else {
                self.options.max_await
            };
            let look = self.look(woken, wait)?;
            if let Some(failed) = look.failed {
                return Err(failed);
            }
            let came = look.came;
            let room = self.room().min(GROUP);
            let picked = self.due(room, GROUP)?;
            backlog = room == 0 || picked.len() >= room;
            if picked.is_empty() && came == 0 {
                if self.idle_over(idle_since) {
                    return Ok(Ended::Drained);
                }
                if backlog {
                    // Room was zero: only the end conditions can change that.
                    backlog = false;
                }
                continue;
            }
            idle_since = Instant::now();
            let picked = self.settle_ignored(picked, false)?;
            if picked.is_empty() {
                continue;
            }
            self.report.max_in_flight = self.report.max_in_flight.max(picked.len());
            let event_ids: Vec<String> = picked
                .iter()
                .map(|p| event_id(self.names(), &p.entry.record))
                .collect();
            let attempts: Vec<Attempt<'_>> = picked
                .iter()
                .zip(&event_ids)
                .map(|(p, event_id)| Attempt {
                    entry: &p.entry.id,
                    record: &p.entry.record,
                    event_id,
                    number: p.entry.attempts + 1,
                    owner: &self.options.owner,
                    request: &p.request,
                })
                .collect();
            self.show(picked.len(), picked.iter().map(|p| p.bytes).sum());
            let outcomes = self.sink.deliver_all(&attempts);
            drop(attempts);
            let mut settlements: Vec<Settlement> = Vec::with_capacity(picked.len());
            for (p, outcome) in picked.iter().zip(&outcomes) {
                settlements.extend(self.settlement(&p.entry, outcome, false)?);
            }
            self.settle(&settlements)?;
        }
    }

    /// An external sink: claimed entries go to the workers; their outcomes are settled as they
    /// come.
    fn pooled(
        &mut self,
        woken: &mpsc::Receiver<Wake>,
        stop: &StopSignal,
        jobs: &mpsc::SyncSender<Job>,
    ) -> Result<Ended> {
        let mut idle_since = Instant::now();
        let mut ending = None;
        let mut backlog = true;
        loop {
            self.show(self.flights.len(), self.bytes_in_flight());
            // Outcomes first: they free lanes and room. Nothing more was due at the last look
            // (or there was no room): wait for an outcome or an admission.
            let wait = if backlog && self.room() > 0 && ending.is_none() {
                Duration::ZERO
            } else if self.flights.is_empty() {
                self.options.max_await
            } else {
                RESULT_WAIT
            };
            let Woken { came, done, failed } = self.look(woken, wait)?;
            if !done.is_empty() {
                idle_since = Instant::now();
                let mut settlements: Vec<Settlement> = Vec::with_capacity(done.len());
                for d in &done {
                    if let Some(flight) = self.flights.remove(&d.entry.id) {
                        self.busy_lanes.remove(&flight.lane);
                    }
                    settlements.extend(self.settlement(&d.entry, &d.outcome, true)?);
                }
                let settled = self.settle(&settlements)?;
                if settled < settlements.len() as u64 {
                    tracing::warn!(
                        lost = settlements.len() as u64 - settled,
                        "outcomes of entries whose lease another deliverer took over were not \
                         recorded (they are tried again there)"
                    );
                }
            }
            if let Some(failed) = failed {
                return Err(failed);
            }
            if ending.is_none() {
                ending = self.ending(stop);
            }
            if let Some(ended) = ending {
                if self.flights.is_empty() {
                    return Ok(ended);
                }
                continue;
            }
            let room = self.room();
            let mut picked = self.due(room, 1)?;
            backlog = room == 0 || picked.len() >= room;
            // The byte bound: the first record always goes.
            let mut bytes = self.bytes_in_flight();
            let mut kept = 0;
            for p in &picked {
                if kept > 0 && bytes + p.bytes > self.options.max_in_flight_bytes {
                    break;
                }
                bytes += p.bytes;
                kept += 1;
            }
            picked.truncate(if self.flights.is_empty() {
                kept.max(1).min(picked.len())
            } else {
                kept
            });
            if picked.is_empty() {
                if came == 0 && self.flights.is_empty() && self.idle_over(idle_since) {
                    return Ok(Ended::Drained);
                }
                if came > 0 {
                    idle_since = Instant::now();
                }
                continue;
            }
            idle_since = Instant::now();
            let picked = self.claimed(picked)?;
            let picked = self.settle_ignored(picked, true)?;
            for p in picked {
                self.busy_lanes.insert(p.entry.lane.clone());
                self.flights.insert(
                    p.entry.id.clone(),
                    Flight {
                        lane: p.entry.lane.clone(),
                        bytes: p.bytes,
                    },
                );
                let job = Job {
                    event_id: event_id(self.names(), &p.entry.record),
                    entry: p.entry,
                    request: p.request,
                };
                if jobs.send(job).is_err() {
                    return Err(HandoffError::Internal(anyhow_lite(
                        "the delivery workers ended",
                    )));
                }
            }
            self.report.max_in_flight = self.report.max_in_flight.max(self.flights.len());
        }
    }

    /// The picked entries this deliverer could claim (one transaction); the others were taken
    /// by another deliverer or changed since read.
    fn claimed(&mut self, picked: Vec<Picked>) -> Result<Vec<Picked>> {
        let claims: Vec<&str> = picked.iter().map(|p| p.entry.id.as_str()).collect();
        let until = DateTime::from_millis(
            DateTime::now()
                .timestamp_millis()
                .saturating_add(i64::try_from(self.options.lease.as_millis()).unwrap_or(i64::MAX)),
        );
        let claimed: HashMap<String, u32> = self
            .ledger
            .claim(self.names(), &claims, &self.options.owner, until)?
            .into_iter()
            .collect();
        Ok(picked
            .into_iter()
            .filter_map(|mut p| {
                // The attempts as claimed (another deliverer may have tried it since it was read).
                p.entry.attempts = *claimed.get(&p.entry.id)?;
                Some(p)
            })
            .collect())
    }

    /// The ledger's figures at the end.
    fn finish(&mut self) -> Result<()> {
        let names = self.names().clone();
        let ledger = self.ledger;
        let count = |status| ledger.count(&names, status);
        self.report.open =
            count(Status::Pending)? + count(Status::InProgress)? + count(Status::Failed)?;
        self.report.dead_total = count(Status::Dead)?;
        let oldest = ledger.open_entries(&names, 1)?;
        self.report.lag_seconds = oldest
            .first()
            .and_then(|d| d.get_datetime("createdAt").ok())
            .map(|created| {
                let waited = DateTime::now().timestamp_millis() - created.timestamp_millis();
                waited.max(0) as f64 / 1000.0
            });
        Ok(())
    }
}

/// An internal error with a fixed text.
fn anyhow_lite(text: &'static str) -> anyhow::Error {
    anyhow::Error::msg(text)
}
