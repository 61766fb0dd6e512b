//! Command errors and their wire representation `{ok: 0, errmsg, code, codeName, errorLabels}`.

use bson::{Bson, Document, doc};

/// Label telling drivers to retry the whole transaction.
pub const TRANSIENT_TXN: &str = "TransientTransactionError";
/// Label telling drivers the commit outcome is unknown and the commit alone may be retried.
pub const UNKNOWN_COMMIT: &str = "UnknownTransactionCommitResult";
/// Label telling drivers a retryable write may be retried.
pub const RETRYABLE_WRITE: &str = "RetryableWriteError";
/// Label telling drivers a change stream may resume.
pub const RESUMABLE_CS: &str = "ResumableChangeStreamError";
/// Label telling drivers a change stream must not resume.
pub const NON_RESUMABLE_CS: &str = "NonResumableChangeStreamError";

/// The largest document the server stores or returns (`maxBsonObjectSize`, 16 MiB).
pub const MAX_BSON_OBJECT_SIZE: usize = 16 * 1024 * 1024;

/// An error returned to the client as a command failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code_name} ({code}): {message}")]
pub struct CommandError {
    pub code: i32,
    pub code_name: String,
    pub message: String,
    /// Labels decided where the error arose. `None` lets the dispatcher compute them.
    pub labels: Option<Vec<String>>,
}

pub type CmdResult<T> = Result<T, CommandError>;

impl CommandError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        CommandError {
            code,
            code_name: code_name_of(code),
            message: message.into(),
            labels: None,
        }
    }

    pub fn with_labels(mut self, labels: &[&str]) -> Self {
        self.labels = Some(labels.iter().map(|s| s.to_string()).collect());
        self
    }

    pub fn bad_value(msg: impl Into<String>) -> Self {
        Self::new(2, msg)
    }
    pub fn failed_to_parse(msg: impl Into<String>) -> Self {
        Self::new(9, msg)
    }
    pub fn type_mismatch(msg: impl Into<String>) -> Self {
        Self::new(14, msg)
    }
    pub fn namespace_not_found(msg: impl Into<String>) -> Self {
        Self::new(26, msg)
    }
    /// A document over `maxBsonObjectSize`, as the server words it.
    pub fn object_too_large(size: usize, first_element: &str) -> Self {
        Self::new(
            10334,
            format!(
                "BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and {MAX_BSON_OBJECT_SIZE}(16MB) First element: {first_element}"
            ),
        )
    }
    pub fn write_conflict() -> Self {
        Self::new(
            112,
            "Write conflict during plan execution and yielding is disabled.",
        )
    }
    pub fn no_such_transaction(txn_number: i64) -> Self {
        Self::new(
            251,
            format!("Transaction with txnNumber {txn_number} has been aborted."),
        )
    }

    /// Labels to send: explicit ones, or the ones the code implies in this context.
    pub fn effective_labels(&self, ctx: LabelContext) -> Vec<String> {
        if let Some(l) = &self.labels {
            return l.clone();
        }
        let mut out = Vec::new();
        let code = self.code;
        let commit_or_abort = ctx.is_commit || ctx.is_abort;
        let transient = if commit_or_abort {
            is_transient_code(code) || code == 251
        } else {
            ctx.in_transaction
                && (is_transient_code(code) || is_retryable_code(code) || code == 251)
        };
        if transient {
            out.push(TRANSIENT_TXN.to_string());
        }
        if (ctx.retryable_write || commit_or_abort) && is_retryable_code(code) {
            out.push(RETRYABLE_WRITE.to_string());
        }
        if ctx.is_commit && (is_retryable_code(code) || matches!(code, 50 | 64)) {
            out.push(UNKNOWN_COMMIT.to_string());
        }
        if ctx.is_get_more && is_resumable_change_stream_code(code) {
            out.push(RESUMABLE_CS.to_string());
        }
        if matches!(code, 280 | 286) {
            out.push(NON_RESUMABLE_CS.to_string());
        }
        out
    }

    pub fn to_document(&self, ctx: LabelContext) -> Document {
        let mut d = doc! {
            "ok": 0.0,
            "errmsg": self.message.clone(),
            "code": self.code,
            "codeName": self.code_name.clone(),
        };
        let labels = self.effective_labels(ctx);
        if !labels.is_empty() {
            d.insert(
                "errorLabels",
                Bson::Array(labels.into_iter().map(Bson::String).collect()),
            );
        }
        d
    }
}

/// What the dispatcher knows about the command that failed, for computing labels.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabelContext {
    pub in_transaction: bool,
    pub is_commit: bool,
    pub is_abort: bool,
    pub retryable_write: bool,
    pub is_get_more: bool,
}

/// Codes for which a retryable write may be retried.
pub fn is_retryable_code(code: i32) -> bool {
    matches!(
        code,
        6 | 7 | 89 | 91 | 189 | 262 | 9001 | 10107 | 11600 | 11602 | 13435 | 13436 | 63 | 150
    )
}

/// Codes after which a whole transaction may be retried (besides NoSuchTransaction).
pub fn is_transient_code(code: i32) -> bool {
    // WriteConflict, LockTimeout, PreparedTransactionInProgress, snapshot errors.
    matches!(code, 112 | 24 | 267 | 246 | 239 | 241 | 117)
}

/// Codes after which a change stream may resume.
pub fn is_resumable_change_stream_code(code: i32) -> bool {
    is_retryable_code(code) || matches!(code, 43 | 133 | 234 | 13388)
}

/// The MongoDB name of an error code; codes without a name are `Location<code>`, as
/// MongoDB reports assertion codes.
pub fn code_name_of(code: i32) -> String {
    match code_name(code) {
        "UnknownError" if code != 8 => format!("Location{code}"),
        name => name.to_string(),
    }
}

/// The MongoDB name of an error code ("UnknownError" when it has none).
pub fn code_name(code: i32) -> &'static str {
    match code {
        1 => "InternalError",
        2 => "BadValue",
        6 => "HostUnreachable",
        7 => "HostNotFound",
        8 => "UnknownError",
        9 => "FailedToParse",
        11 => "UserNotFound",
        13 => "Unauthorized",
        14 => "TypeMismatch",
        18 => "AuthenticationFailed",
        20 => "IllegalOperation",
        27 => "IndexNotFound",
        28 => "PathNotViable",
        47 => "NoMatchingDocument",
        168 => "InvalidPipelineOperator",
        241 => "ConversionFailure",
        79 => "UnknownReplWriteConcern",
        100 => "UnsatisfiableWriteConcern",
        117 => "ConflictingOperationInProgress",
        239 => "SnapshotTooOld",
        246 => "SnapshotUnavailable",
        267 => "PreparedTransactionInProgress",
        11601 => "Interrupted",
        24 => "LockTimeout",
        26 => "NamespaceNotFound",
        40 => "ConflictingUpdateOperators",
        43 => "CursorNotFound",
        48 => "NamespaceExists",
        50 => "MaxTimeMSExpired",
        59 => "CommandNotFound",
        63 => "StaleShardVersion",
        64 => "WriteConcernFailed",
        66 => "ImmutableField",
        72 => "InvalidOptions",
        73 => "InvalidNamespace",
        76 => "NoReplicationEnabled",
        89 => "NetworkTimeout",
        91 => "ShutdownInProgress",
        112 => "WriteConflict",
        115 => "CommandNotSupported",
        133 => "FailedToSatisfyReadPreference",
        134 => "ReadConcernMajorityNotAvailableYet",
        150 => "StaleEpoch",
        189 => "PrimarySteppedDown",
        225 => "TransactionTooOld",
        234 => "RetryChangeStream",
        244 => "TransactionAborted",
        251 => "NoSuchTransaction",
        256 => "TransactionCommitted",
        260 => "InvalidResumeToken",
        262 => "ExceededTimeLimit",
        263 => "OperationNotSupportedInTransaction",
        280 => "ChangeStreamFatalError",
        286 => "ChangeStreamHistoryLost",
        9001 => "SocketException",
        10334 => "BSONObjectTooLarge",
        10107 => "NotWritablePrimary",
        11000 => "DuplicateKey",
        11600 => "InterruptedAtShutdown",
        11602 => "InterruptedDueToReplStateChange",
        13388 => "StaleConfig",
        13435 => "NotPrimaryNoSecondaryOk",
        13436 => "NotPrimaryOrSecondary",
        40324 => "Location40324",
        40573 => "Location40573",
        50865 => "Location50865",
        _ => "UnknownError",
    }
}
