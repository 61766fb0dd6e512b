//! The one trait every sink is behind: one attempt at one record's effect, and what came of it.

use std::time::Duration;

use bson::Document;
use handoff_domain::delivery::Request;
use handoff_domain::effect::SinkKind;

/// One attempt at one record's effect.
#[derive(Clone, Copy, Debug)]
pub struct Attempt<'a> {
    /// The ledger entry's `_id`.
    pub entry: &'a str,
    /// The outbox record's `_id` (`<consumer>/<event id>`).
    pub record: &'a str,
    /// The event's ID: the idempotency key the sink is given, stable across retries and
    /// restarts (`webhook-id`, a broker's message ID).
    pub event_id: &'a str,
    /// 1 for the first attempt.
    pub number: u32,
    /// The deliverer making it (the ledger lease's owner).
    pub owner: &'a str,
    pub request: &'a Request,
}

/// What the sink says of an accepted effect, kept in the ledger entry (`evidence`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// An HTTP sink's status code.
    pub status: Option<u16>,
    /// A short word on what happened (`applied`, `superseded`, `deleted`, …).
    pub outcome: Option<String>,
}

impl Evidence {
    pub fn document(&self) -> Document {
        let mut document = Document::new();
        if let Some(status) = self.status {
            document.insert("httpStatus", i32::from(status));
        }
        if let Some(outcome) = &self.outcome {
            document.insert("outcome", outcome.as_str());
        }
        document
    }
}

/// How a failure is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureClass {
    /// Worth trying again (a timeout, a refused connection, 5xx, 408, 429).
    Transient,
    /// Trying again changes nothing (another 4xx, a request the sink refuses): dead at once.
    Permanent,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Transient => "transient",
            FailureClass::Permanent => "permanent",
        }
    }
}

/// An attempt that did not make the effect (or may not have: a timeout after the request was
/// sent is transient, and the next attempt carries the same idempotency key).
#[derive(Clone, Debug, PartialEq)]
pub struct SinkFailure {
    pub class: FailureClass,
    /// How long the sink asked to be left alone (`Retry-After`), bounded by the caller.
    pub retry_after: Option<Duration>,
    /// What happened, without credentials, secrets or documents; bounded.
    pub text: String,
    pub evidence: Evidence,
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The sink accepted the effect. `settled`: the sink wrote the ledger entry's success
    /// together with the effect (a transactional sink); otherwise the caller records it.
    Accepted {
        evidence: Evidence,
        settled: bool,
    },
    Failed(SinkFailure),
}

/// A sink: where a delivery's effects go. One file each under `sinks/`.
pub trait Sink: Send + Sync {
    /// What the delivery is pinned to: the sink's kind and target, never a credential
    /// (`mongodb:db.projection`, `https://host/path`).
    fn pin(&self) -> String;
    /// What kind of sink it is: which operations it makes, what the default effect is.
    fn kind(&self) -> SinkKind;
    /// Whether the effect and the ledger entry commit together (exactly once). Such a sink's
    /// attempts need no lease: a second deliverer's attempt finds the entry settled.
    fn transactional(&self) -> bool {
        false
    }
    /// One attempt. Never panics on anything the sink or the network sends.
    fn deliver(&self, attempt: &Attempt<'_>) -> Outcome;
    /// Attempts in admission order, one outcome each in the same order. A transactional sink
    /// commits them together where it can; by default each is one [`Sink::deliver`].
    fn deliver_all(&self, attempts: &[Attempt<'_>]) -> Vec<Outcome> {
        attempts
            .iter()
            .map(|attempt| self.deliver(attempt))
            .collect()
    }
}
