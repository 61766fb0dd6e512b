//! Driver errors as the server reported them, classified into the stream's and the run's
//! failure classes, or described in plain terms for the operator's commands (credentials
//! removed).

use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};

use super::redaction::Redactor;
use super::{Connection, SERVER_SELECTION_TIMEOUT};
use handoff_domain::error::HandoffError;
use handoff_domain::stream::{BSON_OBJECT_TOO_LARGE, FRAGMENT_TOO_LARGE, NO_MATCHING_DOCUMENT};
use handoff_domain::{ServerError, StreamError};

/// The server's view of a driver error: code, code name and message (credentials removed).
pub(super) fn server_error(error: &DriverError, redactor: &Redactor) -> ServerError {
    let (code, code_name, message) = match error.kind.as_ref() {
        ErrorKind::Command(e) => (Some(e.code), e.code_name.clone(), e.message.clone()),
        ErrorKind::Write(WriteFailure::WriteError(e)) => (
            Some(e.code),
            e.code_name.clone().unwrap_or_default(),
            e.message.clone(),
        ),
        ErrorKind::Write(WriteFailure::WriteConcernError(e)) => {
            (Some(e.code), e.code_name.clone(), e.message.clone())
        }
        ErrorKind::InsertMany(e) => match (&e.write_errors, &e.write_concern_error) {
            (Some(errors), _) if !errors.is_empty() => (
                Some(errors[0].code),
                errors[0].code_name.clone().unwrap_or_default(),
                errors[0].message.clone(),
            ),
            (_, Some(wce)) => (Some(wce.code), wce.code_name.clone(), wce.message.clone()),
            _ => (None, "DriverError".into(), error.to_string()),
        },
        // A bulkWrite: its first failed operation, else what ended it (a later command of a
        // split bulkWrite, or the results cursor), else its write concern error.
        ErrorKind::BulkWrite(e) => match e.write_errors.iter().min_by_key(|(index, _)| **index) {
            Some((_, w)) => (
                Some(w.code),
                w.code_name.clone().unwrap_or_default(),
                w.message.clone(),
            ),
            None => match (
                std::error::Error::source(error).and_then(|s| s.downcast_ref::<DriverError>()),
                e.write_concern_errors.first(),
            ) {
                (Some(source), _) => return server_error(source, redactor),
                (None, Some(wce)) => (Some(wce.code), wce.code_name.clone(), wce.message.clone()),
                (None, None) => (None, "DriverError".into(), error.to_string()),
            },
        },
        ErrorKind::ServerSelection { message, .. } => {
            (None, "ServerSelectionError".into(), message.clone())
        }
        ErrorKind::Io(e) => (None, "NetworkError".into(), e.to_string()),
        ErrorKind::Authentication { message, .. } => {
            (None, "AuthenticationFailed".into(), message.clone())
        }
        _ => (None, "DriverError".into(), error.to_string()),
    };
    ServerError {
        code,
        code_name: if code_name.is_empty() {
            "MongoError".into()
        } else {
            code_name
        },
        message: redactor.clean(&message),
    }
}

pub(super) fn classify_stream(error: &DriverError, redactor: &Redactor) -> StreamError {
    let detail = server_error(error, redactor);
    match detail.code {
        Some(
            286 | 260 | 280 | BSON_OBJECT_TOO_LARGE | FRAGMENT_TOO_LARGE | NO_MATCHING_DOCUMENT,
        ) => StreamError::from_server(detail),
        _ if detail.code_name == "BSONObjectTooLarge" => StreamError::TooLarge(detail),
        Some(_) if error.contains_label("NonResumableChangeStreamError") => {
            StreamError::Fatal(detail)
        }
        // Unauthorized, CommandNotSupportedOnView: retrying changes nothing.
        Some(13) | Some(166) => StreamError::Fatal(detail),
        _ => StreamError::Unavailable(detail),
    }
}

/// An operation of an operator's command that the server refused or the driver failed, in plain
/// terms (none of the driver's types): what was being done, the server's codes and the driver's
/// texts, the URI's credentials removed. The texts are not escaped: each command bounds and
/// escapes what it prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationError {
    /// What was being done (e.g. `reading the chunk`).
    pub what: &'static str,
    /// The code of the command the server refused (`ok: 0`), if it refused one.
    pub command_code: Option<i32>,
    /// The server's code for the command, else for its first failed write or its write concern;
    /// 18 (`AuthenticationFailed`) when the credentials were refused.
    pub code: Option<i32>,
    /// The server's message for a refused command, else the driver's text.
    pub message: String,
    /// The driver's whole text.
    pub text: String,
}

impl OperationError {
    /// `error`, met while doing `what`, described with `redactor`'s credentials removed.
    pub(super) fn of(what: &'static str, error: &DriverError, redactor: &Redactor) -> Self {
        let command = match error.kind.as_ref() {
            ErrorKind::Command(e) => Some(e),
            _ => None,
        };
        let code = match error.kind.as_ref() {
            ErrorKind::Command(e) => Some(e.code),
            ErrorKind::Write(WriteFailure::WriteError(e)) => Some(e.code),
            ErrorKind::Write(WriteFailure::WriteConcernError(e)) => Some(e.code),
            ErrorKind::InsertMany(e) => e
                .write_errors
                .as_ref()
                .and_then(|w| w.first())
                .map(|w| w.code),
            ErrorKind::Authentication { .. } => Some(18),
            _ => None,
        };
        let text = redactor.clean(&error.to_string());
        OperationError {
            what,
            command_code: command.map(|e| e.code),
            code,
            message: command.map_or_else(|| text.clone(), |e| redactor.clean(&e.message)),
            text,
        }
    }
}

impl Connection {
    /// How the driver's errors met while doing `what` are told to an operator's command.
    pub(super) fn failed(
        &self,
        what: &'static str,
    ) -> impl Fn(DriverError) -> OperationError + Copy {
        move |error| OperationError::of(what, &error, &self.redactor)
    }
}

/// Whether the server refused a write for a duplicate key (`DuplicateKey`, 11000).
pub(super) fn duplicate_key(error: &DriverError) -> bool {
    match error.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) => e.code == 11000,
        ErrorKind::Command(e) => e.code == 11000,
        _ => false,
    }
}

/// Fails connection-time errors into the run's classes.
pub(super) fn classify_connect(error: &DriverError, redactor: &Redactor) -> HandoffError {
    let detail = server_error(error, redactor);
    match error.kind.as_ref() {
        ErrorKind::Authentication { .. } => {
            HandoffError::Authentication(format!("MongoDB refused the credentials: {detail}"))
        }
        ErrorKind::Command(e) if e.code == 18 => {
            HandoffError::Authentication(format!("MongoDB refused the credentials: {detail}"))
        }
        ErrorKind::Command(e) if e.code == 13 => HandoffError::unauthorized(&detail.to_string()),
        _ => HandoffError::Unavailable(format!(
            "Cannot reach a MongoDB server (server selection timed out after {} s or the connection failed): {detail}",
            SERVER_SELECTION_TIMEOUT.as_secs()
        )),
    }
}
