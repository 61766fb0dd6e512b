//! The failure classes of a run and their exit codes.
//!
//! Callers (the CLI, the engine's `retry` and `errors` branches, operators) branch on the kind, so
//! every class has its own exit code. The message always says what to do next.

use std::process::ExitCode;

/// Guidance appended to failures that happen once a token exists (the baseline's wording).
pub const RECONCILE_GUIDANCE: &str = "Change-stream read or atomic handoff failed. Check MongoDB and the oplog window; \
     if the token cannot resume, reconcile from a verified snapshot before resetting this consumer.";

/// What to do about an event (or its outbox / quarantine record) over MongoDB's document limit.
pub const EVENT_TOO_LARGE_GUIDANCE: &str = "The change event exceeds MongoDB's 16 MiB document limit (BSONObjectTooLarge); \
     the checkpoint was not moved and nothing was written, so every run stops at this event. \
     Run with --split-large-events (MongoDB 7.0, 6.0.9 and later) to receive it in fragments, one outbox record each; \
     or reduce the document that produced it, or exclude it or its large fields from the stream with a pipeline \
     ($match / $project), accepting the change (--accept-config-change).";

/// What to do about an event `$changeStreamSplitLargeEvent` cannot split (MongoDB error 7182500):
/// one of its fields alone is too large for a fragment, so fragments cannot carry it either.
pub const FRAGMENT_TOO_LARGE_GUIDANCE: &str = "A change event holds a field too large for any fragment: \
     $changeStreamSplitLargeEvent (--split-large-events) cannot split it below MongoDB's 16 MiB document limit; \
     the checkpoint was not moved and nothing was written, so every run stops at this event. \
     Reduce the document that produced it, or leave its large field out of the stream with a pipeline \
     ($project / $unset, or $match to exclude the event), accepting the change (--accept-config-change).";

/// What to do about a pre- or post-image the stream requires and the server does not hold.
pub const IMAGE_MISSING_GUIDANCE: &str = "The change stream requires a pre- or post-image (--full-document required or \
     --full-document-before-change required) that MongoDB does not hold for this event: the checkpoint was not moved, so \
     every run stops here. Enable changeStreamPreAndPostImages on the collection (collMod) for the events to come, and \
     continue this consumer with whenAvailable (--accept-config-change) past the events that have none.";

/// The exit code of a run stopped by SIGTERM or SIGINT: what it reported as committed stands.
pub const STOPPED_EXIT_CODE: u8 = 12;

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// An input outside the accepted rules (names, limits, URI, fixture, policy file). Nothing was written.
    #[error("{0}")]
    BadInput(String),
    /// The checkpoint moved under this run (another run on the same consumer), or the state is in use.
    #[error("{0}")]
    Conflict(String),
    /// The checkpoint belongs to another source or replica set.
    #[error("{0}")]
    Mismatch(String),
    /// The checkpoint document is not one this tool or the baseline task writes.
    #[error("{0}")]
    MalformedCheckpoint(String),
    /// The saved token fell off the retained history (MongoDB code 286).
    #[error("{0}")]
    HistoryLost(String),
    /// The saved token cannot be used with its mode (MongoDB code 260).
    #[error("{0}")]
    InvalidToken(String),
    /// The server ended the stream for good (MongoDB code 280 and other non-resumable errors).
    #[error("{0}")]
    StreamFatal(String),
    /// The policy failed: trap, deadline, memory cap, rejected decision, error result, bad component.
    #[error("{0}")]
    Policy(String),
    /// The backend is unreachable or failed (network, server selection, storage).
    #[error("{0}")]
    Unavailable(String),
    /// The server refused the credentials.
    #[error("{0}")]
    Authentication(String),
    /// A change event, or the outbox / quarantine record that carries it, is over MongoDB's
    /// 16 MiB document limit (code 10334), or cannot be split below it (code 7182500). Nothing
    /// was written.
    #[error("{0}")]
    EventTooLarge(String),
    /// The stream requires a pre- or post-image the server does not hold for an event
    /// (MongoDB code 47). Nothing was written.
    #[error("{0}")]
    ImageMissing(String),
    /// A check an operator asked for found something to act on: a margin below
    /// `--min-margin`, documents the outbox describes otherwise than the source holds them
    /// (`reconcile`: missing, orphan or stale keys).
    #[error("{0}")]
    Attention(String),
    /// A delivery ended with dead records: effects that failed for good and wait for
    /// `deliver dead replay` or `deliver dead discard`. Every other record went on.
    #[error("{0}")]
    DeadRecords(String),
    /// A delivery's lag is over the bound a check was given (`status --max-delivery-lag`,
    /// `deliver status --max-lag-seconds`): its sink is slow or down, or nothing delivers.
    #[error("{0}")]
    DeliveryLag(String),
    /// Anything else: a defect of this tool.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// `message`, ended as a sentence, then `detail`: "Cannot resume. Evidence: …".
pub fn sentences(message: &str, detail: &str) -> String {
    let message = message.trim_end();
    if message.is_empty() || message.ends_with(['.', '!', '?', ':']) {
        format!("{message} {detail}")
    } else {
        format!("{message}. {detail}")
    }
}
impl HandoffError {
    /// The store refused an operation for the URI's user (MongoDB's `Unauthorized`).
    pub fn unauthorized(detail: &str) -> HandoffError {
        HandoffError::Authentication(format!(
            "MongoDB accepted the credentials but refused an operation this user is not allowed \
             to run: {detail}. Grant the role described in the README (Least privilege); nothing \
             was written by the refused operation"
        ))
    }

    /// The same failure, its message followed by `detail` (evidence, next steps).
    pub fn with_detail(self, detail: &str) -> HandoffError {
        use HandoffError::*;
        let add = |message: String| sentences(&message, detail);
        match self {
            BadInput(m) => BadInput(add(m)),
            Conflict(m) => Conflict(add(m)),
            Mismatch(m) => Mismatch(add(m)),
            MalformedCheckpoint(m) => MalformedCheckpoint(add(m)),
            HistoryLost(m) => HistoryLost(add(m)),
            InvalidToken(m) => InvalidToken(add(m)),
            StreamFatal(m) => StreamFatal(add(m)),
            Policy(m) => Policy(add(m)),
            Unavailable(m) => Unavailable(add(m)),
            Authentication(m) => Authentication(add(m)),
            EventTooLarge(m) => EventTooLarge(add(m)),
            ImageMissing(m) => ImageMissing(add(m)),
            Attention(m) => Attention(add(m)),
            DeadRecords(m) => DeadRecords(add(m)),
            DeliveryLag(m) => DeliveryLag(add(m)),
            Internal(e) => Internal(e.context(detail.to_string())),
        }
    }

    /// The process exit code of this class (documented in the README).
    pub fn exit_code(&self) -> u8 {
        match self {
            HandoffError::Internal(_) => 1,
            HandoffError::BadInput(_) => 2,
            HandoffError::Conflict(_) => 3,
            HandoffError::Mismatch(_) => 4,
            HandoffError::MalformedCheckpoint(_) => 5,
            HandoffError::HistoryLost(_) => 6,
            HandoffError::InvalidToken(_) => 7,
            HandoffError::StreamFatal(_) => 8,
            HandoffError::Policy(_) => 9,
            HandoffError::Unavailable(_) => 10,
            HandoffError::Authentication(_) => 11,
            HandoffError::EventTooLarge(_) => 13,
            HandoffError::ImageMissing(_) => 15,
            HandoffError::Attention(_) => 16,
            HandoffError::DeadRecords(_) => 17,
            HandoffError::DeliveryLag(_) => 18,
        }
    }

    /// A short machine-readable name of the class, used in logs and outputs.
    pub fn kind(&self) -> &'static str {
        match self {
            HandoffError::Internal(_) => "internal",
            HandoffError::BadInput(_) => "bad_input",
            HandoffError::Conflict(_) => "conflict",
            HandoffError::Mismatch(_) => "mismatch",
            HandoffError::MalformedCheckpoint(_) => "malformed_checkpoint",
            HandoffError::HistoryLost(_) => "history_lost",
            HandoffError::InvalidToken(_) => "invalid_token",
            HandoffError::StreamFatal(_) => "stream_fatal",
            HandoffError::Policy(_) => "policy",
            HandoffError::Unavailable(_) => "unavailable",
            HandoffError::Authentication(_) => "authentication",
            HandoffError::EventTooLarge(_) => "event_too_large",
            HandoffError::ImageMissing(_) => "image_missing",
            HandoffError::Attention(_) => "attention",
            HandoffError::DeadRecords(_) => "dead_records",
            HandoffError::DeliveryLag(_) => "delivery_lag",
        }
    }

    /// [`exit_code`](HandoffError::exit_code) as the process's exit status.
    pub fn to_exit_code(&self) -> ExitCode {
        ExitCode::from(self.exit_code())
    }
}

/// A result whose failure is one of the classes above.
pub type Result<T, E = HandoffError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_follows_a_whole_sentence() {
        assert_eq!(
            sentences("Cannot resume", "Evidence: x."),
            "Cannot resume. Evidence: x."
        );
        assert_eq!(
            sentences("Cannot resume. ", "Next: y."),
            "Cannot resume. Next: y."
        );
        assert_eq!(sentences("Why?", "Next: y."), "Why? Next: y.");
        let error = HandoffError::HistoryLost("gone".into()).with_detail("Evidence: z.");
        assert_eq!(error.to_string(), "gone. Evidence: z.");
    }
}
