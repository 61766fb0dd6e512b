//! A scripted [`Host`] for native tests of a whole run.
//!
//! [`FakeHost`] delivers the events it was given, one per `next`, then reports the stream caught
//! up; its clock advances one await bound ([`FakeHost::await_ms`], 1 s as against MongoDB) on every
//! empty poll, like the host's replay backend, so a run ends `max_wait_ms` after its last event.
//! It enforces the contract's main rules as the host does — commits in delivery order from the
//! checkpoint the run holds, an invalidation only skipped and saved with `startAfter`, the
//! watermark saved only once everything delivered is committed — and records every write:
//!
//! ```
//! use handoff_policy_sdk::fake::FakeHost;
//! use handoff_policy_sdk::{Decision, Delivered, Mode, Policy, Settings};
//!
//! #[derive(Default)]
//! struct Everything;
//!
//! impl Policy for Everything {
//!     fn decide(&mut self, _event: &mut Delivered<'_>, id: String) -> Decision {
//!         Decision::HandOff(id)
//!     }
//!     fn batch_size(&self) -> usize {
//!         2
//!     }
//! }
//!
//! let mut host = FakeHost::new()
//!     .event("A", "insert")
//!     .event("B", "insert")
//!     .event("C", "invalidate");
//! handoff_policy_sdk::run::<Everything>(&mut host, &Settings::new(50, 3000)).unwrap();
//! assert_eq!(host.commits.len(), 2); // [A, B], then the invalidation
//! assert_eq!(host.commits[1].decisions, vec![Decision::Skip("invalidate".into())]);
//! assert_eq!((host.token(), host.mode()), (Some("C"), Mode::StartAfter));
//! ```

use std::collections::{HashMap, VecDeque};

use crate::{
    Checkpoint, CommitError, Decision, Deployment, Event, Host, Level, Mode, RunKind,
    SourceTransaction, Start, StreamError,
};

/// One commit the run made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub expected: Option<String>,
    pub next: String,
    pub mode: Mode,
    /// One per event it covers, in delivery order.
    pub decisions: Vec<Decision>,
}

/// One log line the run wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Log {
    pub level: Level,
    pub message: String,
    pub fields: Vec<(String, String)>,
}

/// A scripted host; see the [module documentation](self).
#[derive(Clone, Debug)]
pub struct FakeHost {
    /// What [`Host::deployment`] returns.
    pub deployment: Deployment,
    /// The checkpoint the run starts from (a fresh consumer by default).
    pub checkpoint: Checkpoint,
    /// The answers of `next`, in order; once they are used up, every poll is empty.
    pub answers: VecDeque<Result<Option<Event>, StreamError>>,
    /// The watermark the stream reports; when `None`, the last delivered event's token.
    pub watermark: Option<String>,
    /// How far the clock moves on an empty poll.
    pub await_ms: u64,
    /// The monotonic clock.
    pub clock: u64,
    /// Fails the stream's opening with this error.
    pub fail_open: Option<StreamError>,
    /// Fails the next commit with this error (once).
    pub fail_commit: Option<CommitError>,
    /// Where the run opened the stream.
    pub opened: Option<Start>,
    /// Every commit, in order.
    pub commits: Vec<Commit>,
    /// Every watermark advance: (expected, saved).
    pub advances: Vec<(Option<String>, String)>,
    /// Every log line.
    pub logs: Vec<Log>,
    /// What [`Host::run_kind`] returns.
    pub kind: RunKind,
    /// What [`Host::follows`] returns: end such a run's script with a failure (as the host's
    /// refusal once it stops the run), or it polls forever.
    pub follow: bool,
    fields: HashMap<(String, String), String>,
    transactions: HashMap<String, SourceTransaction>,
    delivered: Option<String>,
    pending: VecDeque<Event>,
    current: Checkpoint,
}

impl Default for FakeHost {
    fn default() -> FakeHost {
        FakeHost::new()
    }
}

impl FakeHost {
    /// A fresh consumer (no checkpoint token) with nothing to deliver.
    pub fn new() -> FakeHost {
        let checkpoint = Checkpoint {
            token: None,
            mode: Mode::ResumeAfter,
        };
        FakeHost {
            deployment: Deployment {
                consumer: "test-consumer".into(),
                source: "shop.orders".into(),
                replica_set_id: "6740a1b2c3d4e5f601234567".into(),
            },
            checkpoint: checkpoint.clone(),
            answers: VecDeque::new(),
            watermark: None,
            await_ms: 1000,
            clock: 0,
            fail_open: None,
            fail_commit: None,
            opened: None,
            commits: Vec::new(),
            advances: Vec::new(),
            logs: Vec::new(),
            kind: RunKind::Changes,
            follow: false,
            fields: HashMap::new(),
            transactions: HashMap::new(),
            delivered: None,
            pending: VecDeque::new(),
            current: checkpoint,
        }
    }

    /// A snapshot run of this kind: `snapshot` events are delivered with [`FakeHost::snapshot`].
    pub fn kind(mut self, kind: RunKind) -> FakeHost {
        self.kind = kind;
        self
    }

    /// Delivers a document as a snapshot event: `fullDocument` is `document` (Extended JSON
    /// text, `null` for one the source no longer holds), `documentKey._id` is `key`.
    pub fn snapshot(self, token: &str, key: &str, document: &str) -> FakeHost {
        self.event(token, crate::SNAPSHOT)
            .field(token, "documentKey._id", key)
            .field(token, "fullDocument", document)
    }

    /// Starts from this checkpoint.
    pub fn checkpoint(mut self, token: impl Into<String>, mode: Mode) -> FakeHost {
        self.checkpoint = Checkpoint {
            token: Some(token.into()),
            mode,
        };
        self.current = self.checkpoint.clone();
        self
    }

    /// Delivers an event with this token and operation type next (namespace `shop.orders`).
    pub fn event(self, token: &str, operation_type: &str) -> FakeHost {
        let mut event = Event::new(token, operation_type);
        event.namespace = Some("shop.orders".into());
        self.deliver(event)
    }

    /// Delivers this event next.
    pub fn deliver(mut self, event: Event) -> FakeHost {
        self.answers.push_back(Ok(Some(event)));
        self
    }

    /// Delivers the events `(token, operation type)` next as one source transaction `id`,
    /// whose events [`Host::source_transaction`] places (`size` `None` when `over`, as for a
    /// transaction of more than 500 events).
    pub fn transaction(mut self, id: &str, events: &[(&str, &str)], over: bool) -> FakeHost {
        let size = u32::try_from(events.len()).ok().filter(|_| !over);
        for (index, (token, operation_type)) in events.iter().enumerate() {
            self.transactions.insert(
                token.to_string(),
                SourceTransaction {
                    id: id.to_string(),
                    index: index as u32,
                    size,
                },
            );
            self = self.event(token, operation_type);
        }
        self
    }

    /// An empty poll next (the stream is caught up for one await bound).
    pub fn idle(mut self) -> FakeHost {
        self.answers.push_back(Ok(None));
        self
    }

    /// The stream fails with this error next.
    pub fn fail(mut self, error: StreamError) -> FakeHost {
        self.answers.push_back(Err(error));
        self
    }

    /// A field of the event with this token, as relaxed Extended JSON text.
    pub fn field(mut self, token: &str, path: &str, value: &str) -> FakeHost {
        self.fields
            .insert((token.to_string(), path.to_string()), value.to_string());
        self
    }

    /// The stream's watermark.
    pub fn watermark(mut self, token: &str) -> FakeHost {
        self.watermark = Some(token.to_string());
        self
    }

    /// The checkpoint token now.
    pub fn token(&self) -> Option<&str> {
        self.current.token.as_deref()
    }

    /// The checkpoint's resume mode now.
    pub fn mode(&self) -> Mode {
        self.current.mode
    }

    /// Every decision committed, in delivery order.
    pub fn decisions(&self) -> Vec<&Decision> {
        self.commits.iter().flat_map(|c| &c.decisions).collect()
    }

    /// The outbox IDs handed off (raw and shaped records), in order.
    pub fn handed_off(&self) -> Vec<String> {
        self.decisions()
            .into_iter()
            .filter_map(|d| d.handed_off().map(str::to_string))
            .collect()
    }

    /// The quarantined events as (ID, reason), in order.
    pub fn quarantined(&self) -> Vec<(String, String)> {
        self.decisions()
            .into_iter()
            .filter_map(|d| match d {
                Decision::Quarantine { id, reason } => Some((id.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// The skip reasons, in order.
    pub fn skipped(&self) -> Vec<String> {
        self.decisions()
            .into_iter()
            .filter_map(|d| match d {
                Decision::Skip(reason) => Some(reason.clone()),
                _ => None,
            })
            .collect()
    }

    fn rejected(message: &str) -> CommitError {
        CommitError::Rejected(message.to_string())
    }
}

impl Host for FakeHost {
    fn deployment(&mut self) -> Deployment {
        self.deployment.clone()
    }

    fn load_checkpoint(&mut self) -> Checkpoint {
        self.checkpoint.clone()
    }

    fn open(&mut self, start: Start) -> Result<(), StreamError> {
        if self.opened.is_some() {
            return Err(StreamError::Rejected("the stream is already open".into()));
        }
        if let Some(error) = self.fail_open.take() {
            return Err(error);
        }
        let expected = crate::stream_start(&self.checkpoint);
        if start != expected {
            return Err(StreamError::Rejected(format!(
                "the stream must open at {expected:?}, not {start:?}"
            )));
        }
        self.opened = Some(start);
        Ok(())
    }

    fn next(&mut self) -> Result<Option<Event>, StreamError> {
        if self.opened.is_none() {
            return Err(StreamError::Rejected("the stream is not open".into()));
        }
        match self.answers.pop_front() {
            Some(Ok(Some(event))) => {
                self.delivered = Some(event.token.clone());
                self.pending.push_back(event.clone());
                Ok(Some(event))
            }
            Some(Err(error)) => Err(error),
            Some(Ok(None)) | None => {
                self.clock += self.await_ms;
                Ok(None)
            }
        }
    }

    fn watermark(&mut self) -> Option<String> {
        self.watermark.clone().or_else(|| self.delivered.clone())
    }

    fn field(&mut self, token: &str, path: &str) -> Option<String> {
        self.fields
            .get(&(token.to_string(), path.to_string()))
            .cloned()
    }

    fn follows(&mut self) -> bool {
        self.follow
    }

    fn source_transaction(&mut self, token: &str) -> Option<SourceTransaction> {
        self.transactions.get(token).cloned()
    }

    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), CommitError> {
        let decision = match outbox_id {
            Some(id) => Decision::HandOff(id.to_string()),
            None if self.pending.front().is_some_and(Event::is_invalidate) => {
                Decision::Skip("invalidate".into())
            }
            None => {
                return Err(Self::rejected(
                    "every event but an invalidation needs an outbox record",
                ));
            }
        };
        self.commit_batch(expected, next, mode, vec![decision])
    }

    fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        decisions: Vec<Decision>,
    ) -> Result<(), CommitError> {
        if let Some(error) = self.fail_commit.take() {
            return Err(error);
        }
        if expected != self.current.token.as_deref() {
            return Err(CommitError::Conflict(
                "`expected` is not the checkpoint token".into(),
            ));
        }
        let count = decisions.len();
        if count == 0 || count > crate::MAX_BATCH {
            return Err(Self::rejected("a commit covers 1 to 500 events"));
        }
        if count > self.pending.len() || self.pending[count - 1].token != next {
            return Err(Self::rejected(
                "a commit must cover the delivered events in order, ending with `next`",
            ));
        }
        for (index, decision) in decisions.iter().enumerate() {
            if self.pending[index].is_invalidate()
                && (index != count - 1
                    || mode != Mode::StartAfter
                    || !matches!(decision, Decision::Skip(_)))
            {
                return Err(Self::rejected(
                    "an invalidate event is only skipped, last, and saved with startAfter",
                ));
            }
        }
        if mode == Mode::StartAfter && !self.pending[count - 1].is_invalidate() {
            return Err(Self::rejected(
                "only an invalidate token is saved with startAfter",
            ));
        }
        self.pending.drain(..count);
        self.current = Checkpoint {
            token: Some(next.to_string()),
            mode,
        };
        self.commits.push(Commit {
            expected: expected.map(str::to_string),
            next: next.to_string(),
            mode,
            decisions,
        });
        Ok(())
    }

    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), CommitError> {
        if expected != self.current.token.as_deref() {
            return Err(CommitError::Conflict(
                "`expected` is not the checkpoint token".into(),
            ));
        }
        if !self.pending.is_empty() {
            return Err(Self::rejected("delivered events are not committed yet"));
        }
        if self.watermark().as_deref() != Some(next) {
            return Err(Self::rejected("`next` is not the stream's watermark"));
        }
        self.current = Checkpoint {
            token: Some(next.to_string()),
            mode: Mode::ResumeAfter,
        };
        self.advances
            .push((expected.map(str::to_string), next.to_string()));
        Ok(())
    }

    fn now_ms(&mut self) -> u64 {
        self.clock
    }

    fn run_kind(&mut self) -> RunKind {
        self.kind
    }

    fn log(&mut self, level: Level, message: &str, fields: &[(&str, &str)]) {
        self.logs.push(Log {
            level,
            message: message.to_string(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
    }
}
