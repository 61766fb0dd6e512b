//! Driver errors as the server reported them, classified into the stream's and the run's
//! failure classes (credentials removed).

use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};

use super::SERVER_SELECTION_TIMEOUT;
use super::redaction::Redactor;
use crate::domain::stream::{BSON_OBJECT_TOO_LARGE, FRAGMENT_TOO_LARGE, NO_MATCHING_DOCUMENT};
use crate::domain::{ServerError, StreamError};
use crate::error::HandoffError;

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
