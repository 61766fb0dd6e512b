//! A delivery's ledger in the consumer's MongoDB database: [`Ledger`] over the reads and the
//! transactions of [`crate::delivery`], the outbox admitted from its own change stream
//! ([`crate::admit`]).

use std::collections::HashSet;
use std::time::Duration;

use bson::{DateTime, Document};
use handoff_domain::delivery::Status;
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::ledger::{Admit, DeadChange, Ledger, Names, Settlement};

use crate::Connection;
use crate::admit::{Admitter, unavailable};
use crate::delivery::{self, Failed};
use crate::transaction::Failure;

/// The ledgers of one deployment.
pub struct MongoLedger<'a> {
    connection: &'a Connection,
}

impl<'a> MongoLedger<'a> {
    pub fn new(connection: &'a Connection) -> MongoLedger<'a> {
        MongoLedger { connection }
    }

    fn run<T>(&self, future: impl Future<Output = Result<T, crate::OperationError>>) -> Result<T> {
        self.connection.block_on(future).map_err(unavailable)
    }
}

/// A transaction's failure as a delivery reports it (one whose commit is unknown may have
/// applied: the next read says).
fn failed(failure: Failed) -> HandoffError {
    match failure {
        Failure::Refused(never) => match never {},
        Failure::Failed(error) => unavailable(error),
        Failure::Unknown(error) => HandoffError::Unavailable(format!(
            "{}: {} (the change may have applied: read the ledger again)",
            error.what, error.message
        )),
    }
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Ledger for MongoLedger<'_> {
    fn kind(&self) -> &'static str {
        "mongodb"
    }

    fn open(&self, names: &Names, pin: &str) -> Result<Document> {
        self.run(delivery::ensure_indexes(self.connection, names))?;
        self.run(delivery::ensure_position(self.connection, names, pin))
    }

    fn admitter<'b>(
        &'b self,
        names: &'b Names,
        position: &Document,
        max_await: Duration,
    ) -> Result<Box<dyn Admit + 'b>> {
        Ok(Box::new(Admitter::start(
            self.connection,
            names,
            position,
            max_await,
        )?))
    }

    fn open_entries(&self, names: &Names, n: usize) -> Result<Vec<Document>> {
        self.run(delivery::open_entries(self.connection, names, limit(n)))
    }

    fn entries_of(
        &self,
        names: &Names,
        status: Status,
        after: Option<i64>,
        n: usize,
    ) -> Result<Vec<Document>> {
        self.run(delivery::entries_of(
            self.connection,
            names,
            status,
            after,
            limit(n),
        ))
    }

    fn count(&self, names: &Names, status: Status) -> Result<u64> {
        self.run(delivery::count(self.connection, names, status))
    }

    fn dead_lanes(&self, names: &Names, lanes: &[&str]) -> Result<HashSet<String>> {
        self.run(delivery::dead_lanes(self.connection, names, lanes))
    }

    fn records(&self, names: &Names, ids: &[&str]) -> Result<Vec<Document>> {
        self.run(delivery::records(self.connection, names, ids))
    }

    fn claim(
        &self,
        names: &Names,
        entries: &[&str],
        owner: &str,
        until: DateTime,
    ) -> Result<Vec<(String, u32)>> {
        self.connection
            .block_on(delivery::claim(
                self.connection,
                names,
                entries,
                owner,
                until,
            ))
            .map_err(failed)
    }

    fn settle(&self, names: &Names, owner: &str, settlements: &[Settlement]) -> Result<u64> {
        self.connection
            .block_on(delivery::settle(self.connection, names, owner, settlements))
            .map_err(failed)
    }

    fn positions(&self, names: &Names, n: usize) -> Result<Vec<Document>> {
        self.run(delivery::positions(self.connection, names, limit(n)))
    }

    fn change_dead(
        &self,
        names: &Names,
        changes: &[DeadChange<'_>],
        audit: &Document,
    ) -> Result<Vec<String>> {
        self.connection
            .block_on(delivery::change_dead(
                self.connection,
                names,
                changes,
                audit,
            ))
            .map_err(failed)
    }
}
