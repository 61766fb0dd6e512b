//! Checkpoint and outbox in an embedded ACID store on disk (redb).
//!
//! The file mirrors the MongoDB layout: a table per collection, named like it, holding each
//! document as BSON under its `_id`; a companion table keeps the outbox's commit order. Every
//! commit is one redb write transaction with immediate durability, so a crash at any point
//! leaves either the whole step or none of it.

use std::path::Path;
use std::time::{Duration, Instant};

use bson::Document;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{CheckpointStore, Commit, CommitError, compare_and_set, outbox_id};
use crate::error::HandoffError;

pub struct RedbStore {
    db: Database,
    checkpoints: String,
    outbox: String,
    order: String,
}

fn unavailable(error: impl std::fmt::Display) -> CommitError {
    CommitError::Unavailable(format!("state store: {error}"))
}

fn decode(bytes: &[u8]) -> Result<Document, CommitError> {
    Document::from_reader(bytes).map_err(|e| unavailable(format!("undecodable document: {e}")))
}

fn encode(doc: &Document) -> Result<Vec<u8>, CommitError> {
    doc.to_vec().map_err(unavailable)
}

impl RedbStore {
    /// Opens (or creates) the state file. Another process holding it is waited for up to
    /// `lock_timeout`, then reported as a conflict.
    pub fn open(
        path: &Path,
        checkpoint_collection: &str,
        outbox_collection: &str,
        lock_timeout: Duration,
    ) -> Result<Self, HandoffError> {
        let started = Instant::now();
        let db = loop {
            match Database::builder().create(path) {
                Ok(db) => break db,
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
                    if started.elapsed() < lock_timeout =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                    return Err(HandoffError::Conflict(format!(
                        "The state store {} is in use by another run of this consumer; retry when it has finished",
                        path.display()
                    )));
                }
                Err(e) => {
                    return Err(HandoffError::Unavailable(format!(
                        "Cannot open the state store {}: {e}",
                        path.display()
                    )));
                }
            }
        };
        Ok(RedbStore {
            db,
            checkpoints: checkpoint_collection.to_string(),
            outbox: outbox_collection.to_string(),
            order: format!("{outbox_collection}.$order"),
        })
    }

    fn checkpoint_table(&self) -> TableDefinition<'_, &'static str, &'static [u8]> {
        TableDefinition::new(&self.checkpoints)
    }

    fn outbox_table(&self) -> TableDefinition<'_, &'static str, &'static [u8]> {
        TableDefinition::new(&self.outbox)
    }

    fn order_table(&self) -> TableDefinition<'_, u64, &'static str> {
        TableDefinition::new(&self.order)
    }
}

impl CheckpointStore for RedbStore {
    fn ensure_checkpoint(
        &self,
        consumer: &str,
        initial: Document,
    ) -> Result<Document, CommitError> {
        // The common case, an existing consumer, needs no write (and no fsync).
        if let Ok(txn) = self.db.begin_read()
            && let Ok(table) = txn.open_table(self.checkpoint_table())
            && let Ok(Some(guard)) = table.get(consumer)
        {
            return decode(guard.value());
        }
        let txn = self.db.begin_write().map_err(unavailable)?;
        let doc = {
            let mut table = txn
                .open_table(self.checkpoint_table())
                .map_err(unavailable)?;
            let existing = table
                .get(consumer)
                .map_err(unavailable)?
                .map(|guard| decode(guard.value()));
            match existing {
                Some(doc) => doc?,
                None => {
                    table
                        .insert(consumer, encode(&initial)?.as_slice())
                        .map_err(unavailable)?;
                    initial
                }
            }
        };
        // Outbox tables exist from the start so that `inspect` works on a fresh store.
        txn.open_table(self.outbox_table()).map_err(unavailable)?;
        txn.open_table(self.order_table()).map_err(unavailable)?;
        txn.commit().map_err(unavailable)?;
        Ok(doc)
    }

    fn commit(&self, commit: &Commit<'_>) -> Result<(), CommitError> {
        let txn = self.db.begin_write().map_err(unavailable)?;
        {
            let mut checkpoints = txn
                .open_table(self.checkpoint_table())
                .map_err(unavailable)?;
            let stored = checkpoints
                .get(commit.consumer.consumer.as_str())
                .map_err(unavailable)?
                .map(|guard| decode(guard.value()))
                .ok_or(CommitError::Conflict)??;
            let updated = compare_and_set(&stored, commit)?;
            checkpoints
                .insert(
                    commit.consumer.consumer.as_str(),
                    encode(&updated)?.as_slice(),
                )
                .map_err(unavailable)?;
            if let (Some(id), Some(record)) = (outbox_id(commit)?, &commit.outbox) {
                let mut outbox = txn.open_table(self.outbox_table()).map_err(unavailable)?;
                if outbox.get(id.as_str()).map_err(unavailable)?.is_some() {
                    // Dropping the transaction aborts it: nothing of this step is written.
                    return Err(CommitError::Duplicate(id));
                }
                outbox
                    .insert(id.as_str(), encode(record)?.as_slice())
                    .map_err(unavailable)?;
                let mut order = txn.open_table(self.order_table()).map_err(unavailable)?;
                let next = order
                    .last()
                    .map_err(unavailable)?
                    .map_or(0, |(key, _)| key.value() + 1);
                order.insert(next, id.as_str()).map_err(unavailable)?;
            }
        }
        txn.commit().map_err(unavailable)
    }

    fn dump(&self, consumer: &str) -> Result<(Option<Document>, Vec<Document>), CommitError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let checkpoint = match txn.open_table(self.checkpoint_table()) {
            Ok(table) => table
                .get(consumer)
                .map_err(unavailable)?
                .map(|guard| decode(guard.value()))
                .transpose()?,
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(unavailable(e)),
        };
        let mut records = Vec::new();
        let (order, outbox) = match (
            txn.open_table(self.order_table()),
            txn.open_table(self.outbox_table()),
        ) {
            (Ok(order), Ok(outbox)) => (order, outbox),
            (Err(redb::TableError::TableDoesNotExist(_)), _)
            | (_, Err(redb::TableError::TableDoesNotExist(_))) => return Ok((checkpoint, records)),
            (Err(e), _) | (_, Err(e)) => return Err(unavailable(e)),
        };
        for entry in order.iter().map_err(unavailable)? {
            let (_, id) = entry.map_err(unavailable)?;
            if let Some(guard) = outbox.get(id.value()).map_err(unavailable)? {
                let record = decode(guard.value())?;
                if record.get_str("consumer").ok() == Some(consumer) {
                    records.push(record);
                }
            }
        }
        Ok((checkpoint, records))
    }
}
