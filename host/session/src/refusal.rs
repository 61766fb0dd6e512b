//! A refused call: what the policy sees, made from the run's failure when the refusal ends the
//! run, so that the policy's error and the run's outcome always say the same thing.

use handoff_domain::error::HandoffError;

/// The class of a refused call. The runtime maps it onto the contract's error variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// The saved token fell off the retained history.
    HistoryLost,
    /// The saved token cannot resume the stream.
    InvalidToken,
    /// The stream ended for good (including an event too large to pass).
    Fatal,
    /// The deployment or the store is unreachable.
    Unavailable,
    /// The checkpoint moved under this run, or a record already exists.
    Conflict,
    /// The call broke a rule of the session (or came after the run ended).
    Rejected,
}

/// Why the session refused a call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

impl Refusal {
    /// A refusal that does not end the run by itself (the run already failed or is stopping).
    pub fn rejected(message: impl Into<String>) -> Refusal {
        Refusal {
            kind: RefusalKind::Rejected,
            message: message.into(),
        }
    }

    /// What a run failure tells the policy.
    pub fn of(failure: &HandoffError) -> Refusal {
        let kind = match failure {
            HandoffError::HistoryLost(_) => RefusalKind::HistoryLost,
            HandoffError::InvalidToken(_) => RefusalKind::InvalidToken,
            HandoffError::StreamFatal(_)
            | HandoffError::EventTooLarge(_)
            | HandoffError::ImageMissing(_) => RefusalKind::Fatal,
            HandoffError::Unavailable(_) | HandoffError::Authentication(_) => {
                RefusalKind::Unavailable
            }
            HandoffError::Conflict(_) => RefusalKind::Conflict,
            _ => RefusalKind::Rejected,
        };
        Refusal {
            kind,
            message: failure.to_string(),
        }
    }
}

/// The text a refused policy decision carries.
pub(super) fn rejected(what: impl std::fmt::Display) -> String {
    format!("policy decision rejected: {what}")
}
