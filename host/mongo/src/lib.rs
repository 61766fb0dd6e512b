//! MongoDB through the official driver: the live change stream and the checkpoint + outbox
//! transaction, and every read and write of the operator's commands. Nothing outside this
//! module names the driver.
//!
//! The driver is async; the policy runtime is not. A connection owns a small tokio runtime and
//! every trait method blocks on it, so the policy's host calls stay plain function calls.
//!
//! What the baseline task does, in its order: URI scheme check, a 3 s server selection timeout,
//! `hello` must name a replica set, `replSetGetConfig` must give `settings.replicaSetId`; or
//! `hello` answers as a sharded cluster's `mongos` (`msg: "isdbgrid"`) and `config.version` gives
//! its `clusterId`, which pins the checkpoints instead. The stream
//! uses `fullDocument: updateLookup` and a 1 s max await. Each commit is one transaction
//! (checkpoint compare-and-set on `{_id, token, source}` and the outbox and quarantine records: one
//! ordered `bulkWrite` on MongoDB 8.0 and later, else, or when decoding a large batch's records
//! for the driver's `bulkWrite` model would cost more than the round trips it saves, an `update`
//! and one ordered `insertMany` per collection), retried on `TransientTransactionError` and
//! `UnknownTransactionCommitResult` a bounded number of times; a failed attempt never leaves its
//! transaction open. Change events are kept as the BSON documents the server sent, never rebuilt
//! through JSON.
//!
//! Whatever the URI says, every read and write here goes to the primary, writes wait for a
//! majority, reads outside a transaction read majority-committed data and transactions read a
//! snapshot: the checkpoint and the outbox are only as safe as their weakest concern.
//!
//! - `connection`: the client, its runtime, the deployment's identity and the run's deadline;
//! - `redaction`: credentials removed from every text before it is printed or logged;
//! - `registry`: the state collections listed in their database's registry before they are written;
//! - `errors`: driver errors as server errors and the run's failure classes, or as the
//!   [`OperationError`] the operator's commands report;
//! - `source`: the watched collection's change stream ([`ChangeSource`](handoff_domain::ChangeSource));
//! - `store`: the checkpoint and record transaction ([`CheckpointStore`](handoff_domain::CheckpointStore));
//! - `transaction`: the one transaction runner every write goes through (runs, resets, backfill,
//!   reconcile's repair);
//! - `window`: the deployment's cluster time and oplog window (lag and margin figures);
//! - `events`: the change streams an operator's command reads itself (current positions, keys
//!   changed after a checkpoint, a backfill's watermarks);
//! - `operator`: the operator's commands' common reads (a checkpoint, a collection's documents
//!   and size), `status`'s outbox figures and `checkpoint reset`'s position and compare-and-set;
//! - `backfill`: a backfill's state, watermarks, checkpoint start, chunks and chunk commits;
//! - `reconcile`: a consumer's outbox records and a repair's correction records;
//! - `delivery`: a delivery's position, ledger, admissions, claims, settlements, projection
//!   writes and audited changes of dead entries; `ledger`: those as the delivery's
//!   [`Ledger`](handoff_domain::ledger::Ledger), and `admit`: the outbox's records admitted
//!   into it from the outbox's own change stream.

pub mod admit;
pub mod backfill;
mod connection;
pub mod delivery;
mod errors;
pub mod events;
pub mod ledger;
pub mod operator;
pub mod reconcile;
mod redaction;
pub mod registry;
mod source;
mod store;
pub mod transaction;
pub mod uri;
pub mod window;

use std::time::Duration;

use mongodb::options::{
    DatabaseOptions, ReadConcern, ReadPreference, SelectionCriteria, TransactionOptions,
    WriteConcern,
};
use mongodb::{Client, Database};

pub use connection::{Connection, DeadlinePassed, Pool};
pub use errors::OperationError;
pub use redaction::Redactor;
pub use source::MongoSource;
pub use store::MongoStore;
pub use uri::UNPARSABLE_URI;

/// The change stream's await bound (`maxAwaitTimeMS`), as the baseline sets it.
pub const MAX_AWAIT: Duration = Duration::from_secs(1);
/// The await bound of a run that follows the stream: a policy that groups events commits what
/// has arrived at most this long after the stream went quiet (an idle stream then costs one
/// `getMore` per bound).
pub const FOLLOW_AWAIT: Duration = Duration::from_millis(20);
/// Server selection timeout, as the baseline sets it.
pub const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts of one commit on `UnknownTransactionCommitResult`.
pub const TRANSACTION_ATTEMPTS: u32 = 5;
/// The server's `transactionLifetimeLimitSeconds` when it does not say (MongoDB's default).
pub const DEFAULT_TRANSACTION_LIFETIME: Duration = Duration::from_secs(60);
/// How much longer than the transaction lifetime a commit is retried on
/// `TransientTransactionError`: a transaction a killed run left open holds the checkpoint until
/// the server expires it, which its periodic reaper does a little after the lifetime.
pub const TRANSIENT_RETRY_MARGIN: Duration = Duration::from_secs(15);
/// How long closing the connection (ending its sessions) may take at the end of a run.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// MongoDB's document limit (`maxBsonObjectSize`).
pub const MAX_DOCUMENT_BYTES: usize = 16 * 1024 * 1024;

/// Majority-acknowledged writes.
pub(crate) fn majority_writes() -> WriteConcern {
    WriteConcern::majority()
}

/// The primary, whatever the URI's read preference.
pub(crate) fn primary() -> SelectionCriteria {
    SelectionCriteria::ReadPreference(ReadPreference::Primary)
}

/// Snapshot reads, majority writes, on the primary: every checkpoint and outbox transaction.
pub(crate) fn transaction_options() -> TransactionOptions {
    TransactionOptions::builder()
        .read_concern(ReadConcern::snapshot())
        .write_concern(majority_writes())
        .selection_criteria(primary())
        .build()
}

/// A database handle that ignores the URI's concerns and read preference.
pub(crate) fn guarded_database(client: &Client, name: &str) -> Database {
    client.database_with_options(
        name,
        DatabaseOptions::builder()
            .selection_criteria(primary())
            .read_concern(ReadConcern::majority())
            .write_concern(majority_writes())
            .build(),
    )
}

/// `commitTransaction`, retried alone on `UnknownTransactionCommitResult` (the commit may or may
/// not have applied; committing again is how a driver learns which), `attempts` times at most in
/// all; `retried` is told of each retry.
pub async fn commit_retrying(
    session: &mut mongodb::ClientSession,
    attempts: u32,
    mut retried: impl FnMut(),
) -> mongodb::error::Result<()> {
    let mut commits = 0;
    loop {
        commits += 1;
        match session.commit_transaction().await {
            Ok(()) => return Ok(()),
            Err(e)
                if e.contains_label(mongodb::error::UNKNOWN_TRANSACTION_COMMIT_RESULT)
                    && commits < attempts =>
            {
                tracing::warn!(
                    attempt = commits,
                    "commit result unknown; retrying the commit"
                );
                retried();
            }
            Err(e) => return Err(e),
        }
    }
}
