//! The one transaction runner: every write to a consumer's state (a run's commit, a reset, a
//! backfill chunk, a reconcile repair) goes through [`run`], so every write path has the same
//! rules:
//!
//! - each attempt starts a transaction with the concerns every commit uses (snapshot reads,
//!   majority writes, the primary) and runs the caller's statements in it;
//! - statements that fail, or that decide to write nothing, leave no transaction open: it is
//!   aborted on the server;
//! - `commitTransaction` is retried alone on `UnknownTransactionCommitResult`,
//!   [`TRANSACTION_ATTEMPTS`] times in all; a commit that still fails is abandoned on the
//!   server (a new transaction number ends it) before anything else happens;
//! - `TransientTransactionError` starts the whole transaction again, with a growing pause, for
//!   the server's `transactionLifetimeLimitSeconds` plus [`super::TRANSIENT_RETRY_MARGIN`] (a
//!   transaction a killed process left open holds its documents until the server expires it);
//! - whatever ends without a commit says which way it ended ([`Failure`]), so that the caller
//!   can tell "nothing was written" from "it may have been written".
//!
//! The session is ended when the connection closes (`endSessions`, [`Connection::close`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use mongodb::error::{
    Error as DriverError, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT,
};
use mongodb::{ClientSession, Collection};

use super::errors::OperationError;
use super::{Connection, TRANSACTION_ATTEMPTS, transaction_options};

/// What one attempt's statements decided.
pub enum Decision<T, E> {
    /// Commit what the statements wrote; `T` is the transaction's result.
    Commit(T),
    /// Write nothing and end with `E` (e.g. a compare-and-set found another state).
    Refuse(E),
    /// Nothing is written and the reason is gone (e.g. the statements learned what to leave
    /// out): start again at once, not counted as a retry, at most [`MAX_AGAIN`] times in a row.
    Again,
}

/// How many times in a row statements may ask to start again ([`Decision::Again`]) before the
/// transaction fails: each asking means they learned something, and what there is to learn is
/// bounded (the store asks at most twice per commit).
pub const MAX_AGAIN: u32 = 4;

/// Why a transaction did not commit, or may not have; `D` is how the server's failure is told
/// (the driver's error, or [`OperationError`] for the operator's commands).
#[derive(Debug)]
pub enum Failure<E, D = DriverError> {
    /// The statements refused: nothing was written.
    Refused(E),
    /// The server failed the transaction (for good, or transiently for longer than the retry
    /// window): nothing was written.
    Failed(D),
    /// The commit's outcome is unknown after every retry: it may or may not have applied.
    Unknown(D),
}

impl<E> Failure<E> {
    /// The failure as an operator's command reports it: the driver's error described as met
    /// while doing `what`, the URI's credentials removed.
    pub(super) fn described(
        self,
        what: &'static str,
        connection: &Connection,
    ) -> Failure<E, OperationError> {
        let described = connection.failed(what);
        match self {
            Failure::Refused(refused) => Failure::Refused(refused),
            Failure::Failed(error) => Failure::Failed(described(error)),
            Failure::Unknown(error) => Failure::Unknown(described(error)),
        }
    }
}

/// Runs `statements` in a transaction under the rules above; `abandon_on` is a collection a
/// failed commit's transaction is ended through, `retries` counts every retry (transient
/// errors and unknown commit results).
pub async fn run<T, E>(
    connection: &Connection,
    abandon_on: &Collection<Document>,
    retries: &AtomicU32,
    mut statements: impl AsyncFnMut(&mut ClientSession) -> Result<Decision<T, E>, DriverError>,
) -> Result<T, Failure<E>> {
    let started = Instant::now();
    let mut attempt: u32 = 0;
    let mut agains: u32 = 0;
    let mut session: Option<ClientSession> = None;
    loop {
        attempt += 1;
        let failure = match one(
            connection,
            &mut session,
            abandon_on,
            retries,
            &mut statements,
        )
        .await
        {
            Ok(Decision::Commit(value)) => return Ok(value),
            Ok(Decision::Refuse(refused)) => return Err(Failure::Refused(refused)),
            Ok(Decision::Again) if agains < MAX_AGAIN => {
                agains += 1;
                attempt -= 1;
                continue;
            }
            Ok(Decision::Again) => {
                return Err(Failure::Failed(DriverError::custom(format!(
                    "the transaction's statements asked to start again {MAX_AGAIN} times in a \
                     row; nothing was written"
                ))));
            }
            Err(failure) => failure,
        };
        let transient = failure.contains_label(TRANSIENT_TRANSACTION_ERROR);
        if !transient || started.elapsed() >= connection.transient_retry_window().await {
            return Err(
                if failure.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) {
                    Failure::Unknown(failure)
                } else {
                    Failure::Failed(failure)
                },
            );
        }
        let code = match failure.kind.as_ref() {
            mongodb::error::ErrorKind::Command(command) => Some(command.code),
            _ => None,
        };
        tracing::warn!(attempt, ?code, "transient transaction error; retrying");
        retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(backoff(attempt)).await;
    }
}

/// The pause before the transaction's attempt after `attempt`: 20 ms doubling, at most 1 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(10 << attempt.min(7)).min(Duration::from_secs(1))
}

/// One attempt: the transaction started, the statements run, then the commit or the abort.
/// A commit's value is returned only once committed.
async fn one<T, E>(
    connection: &Connection,
    session: &mut Option<ClientSession>,
    abandon_on: &Collection<Document>,
    retries: &AtomicU32,
    statements: &mut impl AsyncFnMut(&mut ClientSession) -> Result<Decision<T, E>, DriverError>,
) -> Result<Decision<T, E>, DriverError> {
    let session = match session {
        Some(session) => session,
        None => session.insert(connection.client.start_session().await?),
    };
    session
        .start_transaction()
        .with_options(transaction_options())
        .await?;
    let decided = statements(&mut *session).await;
    match decided {
        Ok(Decision::Commit(value)) => {
            match super::commit_retrying(session, TRANSACTION_ATTEMPTS, || {
                retries.fetch_add(1, Ordering::Relaxed);
            })
            .await
            {
                Ok(()) => Ok(Decision::Commit(value)),
                Err(error) => {
                    abandon(session, abandon_on).await;
                    Err(error)
                }
            }
        }
        other => {
            // The driver still holds the transaction as in progress: abort it on the server.
            let _ = session.abort_transaction().await;
            other
        }
    }
}

/// Ends on the server a transaction whose commit failed. Once a commit was attempted the driver
/// refuses `abortTransaction`; a new transaction number on the same session makes the server
/// abort the old transaction, and that new transaction, opened by a read, is then aborted. (A
/// transaction that did commit is not affected.) If the server cannot be reached now, the
/// session is ended when the connection closes, or the server expires the transaction.
async fn abandon(session: &mut ClientSession, on: &Collection<Document>) {
    if session
        .start_transaction()
        .with_options(transaction_options())
        .await
        .is_err()
    {
        return;
    }
    let ended = on
        .find_one(doc! { "_id": Bson::Null })
        .session(&mut *session)
        .await;
    let _ = session.abort_transaction().await;
    match ended {
        Ok(_) => tracing::debug!("the failed commit's transaction was ended on the server"),
        Err(_) => tracing::debug!(
            "the failed commit's transaction could not be ended now; the session ends at close"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_grows_and_is_bounded() {
        assert_eq!(backoff(1), Duration::from_millis(20));
        assert!(backoff(2) > backoff(1));
        assert_eq!(backoff(7), Duration::from_secs(1));
        assert_eq!(backoff(40), Duration::from_secs(1));
    }
}
