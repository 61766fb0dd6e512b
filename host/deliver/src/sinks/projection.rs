//! `--sink mongodb:COLLECTION`: a projection in a MongoDB collection of the consumer's
//! deployment. The write, the ledger entry's success and nothing else commit in one transaction
//! through the one transaction runner: **exactly once**. Writes are guarded by version: the
//! projection's document keeps the version that wrote it (`_handoffVersion`) and a delete
//! leaves a tombstone in the ledger, so an older version never overwrites or revives a newer
//! one, whatever order replays come in.

use std::sync::Arc;

use bson::doc;
use handoff_domain::token::canonical_text;
use handoff_mongo::delivery::{self, Names, Projected, Projection as Written};
use handoff_mongo::transaction::Failure;
use handoff_mongo::{Connection, OperationError};

use crate::sink::{Attempt, Evidence, FailureClass, Outcome, Sink, SinkFailure};

/// Server codes a retry cannot mend: a bad value, a document over 16 MiB, a duplicate key of a
/// unique index of the projection, a key too large for an index, an unauthorized user.
const PERMANENT_CODES: [i32; 6] = [2, 10334, 11000, 17280, 13, 14];

/// A MongoDB collection written by key and version.
pub struct Projection {
    connection: Arc<Connection>,
    names: Names,
    database: String,
    collection: String,
}

impl Projection {
    /// The projection `target` names: `COLLECTION` (in the consumer's database) or
    /// `DATABASE.COLLECTION`. The names are checked by the caller.
    pub fn new(connection: Arc<Connection>, names: Names, target: &str) -> Projection {
        let (database, collection) = match target.split_once('.') {
            Some((database, collection)) => (database.to_string(), collection.to_string()),
            None => (names.database.clone(), target.to_string()),
        };
        Projection {
            connection,
            names,
            database,
            collection,
        }
    }

    /// The projection's database and collection.
    pub fn namespace(&self) -> (&str, &str) {
        (&self.database, &self.collection)
    }

    fn write(&self, attempts: &[Attempt<'_>]) -> Result<Vec<Written>, OperationError> {
        let keys: Vec<String> = attempts
            .iter()
            .map(|a| canonical_text(&doc! { "k": a.request.target.clone() }))
            .collect();
        let writes: Vec<Projected<'_>> = attempts
            .iter()
            .zip(&keys)
            .map(|(attempt, key)| Projected {
                entry: attempt.entry,
                attempts: attempt.number.saturating_sub(1),
                key,
                request: attempt.request,
            })
            .collect();
        let written = self.connection.block_on(delivery::project(
            &self.connection,
            &self.names,
            (&self.database, &self.collection),
            &writes,
        ));
        written.map_err(|failure| match failure {
            Failure::Refused(never) => match never {},
            Failure::Failed(error) | Failure::Unknown(error) => error,
        })
    }
}

/// A failed write as the ledger keeps it.
fn failure(error: &OperationError) -> SinkFailure {
    let class = match error.code {
        Some(code) if PERMANENT_CODES.contains(&code) => FailureClass::Permanent,
        _ => FailureClass::Transient,
    };
    SinkFailure {
        class,
        retry_after: None,
        text: format!("{}: {}", error.what, error.message),
        evidence: Evidence {
            status: None,
            outcome: error.code.map(|code| format!("server code {code}")),
        },
    }
}

fn accepted(written: Written) -> Outcome {
    Outcome::Accepted {
        evidence: Evidence {
            status: None,
            outcome: Some(written.as_str().to_string()),
        },
        settled: true,
    }
}

impl Sink for Projection {
    fn kind(&self) -> handoff_domain::effect::SinkKind {
        handoff_domain::effect::SinkKind::Projection
    }

    fn pin(&self) -> String {
        format!("mongodb:{}.{}", self.database, self.collection)
    }

    fn transactional(&self) -> bool {
        true
    }

    fn deliver(&self, attempt: &Attempt<'_>) -> Outcome {
        match self.write(std::slice::from_ref(attempt)) {
            Ok(written) => written
                .into_iter()
                .next()
                .map_or_else(|| Outcome::Failed(lost()), accepted),
            Err(error) => Outcome::Failed(failure(&error)),
        }
    }

    /// All in one transaction; when it fails, each alone, so that one record the server
    /// refuses fails by itself.
    fn deliver_all(&self, attempts: &[Attempt<'_>]) -> Vec<Outcome> {
        if attempts.len() > 1
            && let Ok(written) = self.write(attempts)
            && written.len() == attempts.len()
        {
            return written.into_iter().map(accepted).collect();
        }
        attempts
            .iter()
            .map(|attempt| self.deliver(attempt))
            .collect()
    }
}

/// A transaction that committed without an outcome for its write (never expected).
fn lost() -> SinkFailure {
    SinkFailure {
        class: FailureClass::Transient,
        retry_after: None,
        text: "the projection's transaction gave no outcome for the write".into(),
        evidence: Evidence::default(),
    }
}
