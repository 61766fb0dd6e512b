//! Checkpoint, outbox and quarantine in an embedded ACID store on disk (redb).
//!
//! The file mirrors the MongoDB layout: a table per collection, named like it, holding each
//! document as BSON under its `_id`; a companion table per record collection keeps the commit
//! order. Every commit (and the lease's renewal and release) is one redb write transaction with
//! immediate durability, so a crash at any point leaves either the whole step or none of it.
//!
//! One process at a time holds the file (redb's lock), so the lease a run claims here only records
//! the holder: the claim is committed without waiting for the disk, and the run's first durable
//! write (a commit, or the release at its end) makes it durable. A process killed before either
//! leaves the store as it found it instead of holding the consumer for the lease's length.

use std::path::Path;
use std::time::{Duration, Instant};

use bson::{DateTime, Document, RawDocumentBuf};
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
    WriteTransaction,
};

use handoff_domain::error::HandoffError;
use handoff_domain::store::{
    admit_events, apply_claim, apply_release, compare_and_set, lookups, record_ids,
};
use handoff_domain::{Applied, CheckpointStore, Claim, Collections, Commit, CommitError, Dump};

type DocTable<'a> = TableDefinition<'a, &'static str, &'static [u8]>;
type OrderTable<'a> = TableDefinition<'a, u64, &'static str>;

pub struct RedbStore {
    db: Database,
    checkpoints: String,
    outbox: (String, String),
    quarantine: (String, String),
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

/// Inserts records in commit order. An event the table holds under its ID, whole or in
/// fragments, is skipped and added to `duplicates` (see [`admit_events`]); a record there of
/// another event aborts the whole transaction.
fn insert_ordered(
    txn: &WriteTransaction,
    (records, order): (&str, &str),
    docs: &[RawDocumentBuf],
    duplicates: &mut Vec<String>,
) -> Result<(), CommitError> {
    if docs.is_empty() {
        return Ok(());
    }
    let ids = record_ids(docs)?;
    let mut table = txn
        .open_table(DocTable::new(records))
        .map_err(unavailable)?;
    let mut order = txn
        .open_table(OrderTable::new(order))
        .map_err(unavailable)?;
    let mut position = order
        .last()
        .map_err(unavailable)?
        .map_or(0, |(key, _)| key.value() + 1);
    let mut held = Vec::new();
    for lookup in lookups(docs)? {
        if let Some(guard) = table.get(lookup.key.as_str()).map_err(unavailable)? {
            held.push(decode(guard.value())?);
        }
        let range = lookup.fragments.start.as_str()..lookup.fragments.end.as_str();
        for entry in table.range(range).map_err(unavailable)? {
            let (_, guard) = entry.map_err(unavailable)?;
            held.push(decode(guard.value())?);
        }
    }
    let admitted = admit_events(docs, &held, duplicates)?;
    for ((id, doc), insert) in ids.iter().zip(docs).zip(admitted) {
        if !insert {
            continue;
        }
        table
            .insert(id.as_str(), doc.as_bytes())
            .map_err(unavailable)?;
        order.insert(position, id.as_str()).map_err(unavailable)?;
        position += 1;
    }
    Ok(())
}

/// A consumer's records in commit order (none when the tables do not exist yet).
fn read_ordered(
    txn: &ReadTransaction,
    (records, order): (&str, &str),
    consumer: &str,
) -> Result<Vec<Document>, CommitError> {
    let (table, order) = match (
        txn.open_table(DocTable::new(records)),
        txn.open_table(OrderTable::new(order)),
    ) {
        (Ok(table), Ok(order)) => (table, order),
        (Err(redb::TableError::TableDoesNotExist(_)), _)
        | (_, Err(redb::TableError::TableDoesNotExist(_))) => {
            return Ok(Vec::new());
        }
        (Err(e), _) | (_, Err(e)) => return Err(unavailable(e)),
    };
    let mut out = Vec::new();
    for entry in order.iter().map_err(unavailable)? {
        let (_, id) = entry.map_err(unavailable)?;
        if let Some(guard) = table.get(id.value()).map_err(unavailable)? {
            let record = decode(guard.value())?;
            if record.get_str("consumer").ok() == Some(consumer) {
                out.push(record);
            }
        }
    }
    Ok(out)
}

impl RedbStore {
    /// Opens (or creates) the state file. Another process holding it is waited for up to
    /// `lock_timeout`, then reported as a conflict.
    pub fn open(
        path: &Path,
        collections: &Collections,
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
        let ordered = |name: &str| (name.to_string(), format!("{name}.$order"));
        Ok(RedbStore {
            db,
            checkpoints: collections.checkpoints.clone(),
            outbox: ordered(&collections.outbox),
            quarantine: ordered(&collections.quarantine),
        })
    }

    /// The file's database, for what is kept beside the checkpoint and outbox (delivery
    /// ledgers).
    pub(crate) fn database(&self) -> &Database {
        &self.db
    }

    /// The consumers whose checkpoints the store holds, at most `limit` of them.
    pub fn consumers(&self, limit: usize) -> Result<Vec<String>, HandoffError> {
        let failed = |e: &dyn std::fmt::Display| {
            HandoffError::Unavailable(format!("Cannot read the state store's consumers: {e}"))
        };
        let txn = self.db.begin_read().map_err(|e| failed(&e))?;
        let table = match txn.open_table(self.checkpoint_table()) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(failed(&e)),
        };
        let mut names = Vec::new();
        for entry in table.iter().map_err(|e| failed(&e))?.take(limit) {
            let (key, _) = entry.map_err(|e| failed(&e))?;
            names.push(key.value().to_string());
        }
        Ok(names)
    }

    fn checkpoint_table(&self) -> DocTable<'_> {
        TableDefinition::new(&self.checkpoints)
    }

    /// Replaces the consumer's checkpoint with what `change` makes of it (`None`: leave it), in
    /// one transaction committed with `durability`; a missing checkpoint is a conflict.
    fn update_checkpoint(
        &self,
        consumer: &str,
        durability: Durability,
        change: impl FnOnce(&Document) -> Result<Option<Document>, CommitError>,
    ) -> Result<(), CommitError> {
        let mut txn = self.db.begin_write().map_err(unavailable)?;
        // Refused only for persistent savepoints and in redb's multi-process modes, neither of
        // which this store uses; a refused setting leaves the transaction durable.
        let _ = txn.set_durability(durability);
        {
            let mut table = txn
                .open_table(self.checkpoint_table())
                .map_err(unavailable)?;
            let stored = table
                .get(consumer)
                .map_err(unavailable)?
                .map(|guard| decode(guard.value()))
                .ok_or(CommitError::Conflict)??;
            match change(&stored)? {
                Some(updated) => {
                    table
                        .insert(consumer, encode(&updated)?.as_slice())
                        .map_err(unavailable)?;
                }
                None => return Ok(()),
            }
        }
        txn.commit().map_err(unavailable)
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
        txn.commit().map_err(unavailable)?;
        Ok(doc)
    }

    fn commit(&self, commit: &Commit<'_>) -> Result<Applied, CommitError> {
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
        }
        // An error below drops the transaction, which aborts it: nothing of this step is written.
        let mut applied = Applied::default();
        insert_ordered(
            &txn,
            (&self.outbox.0, &self.outbox.1),
            &commit.outbox,
            &mut applied.duplicates,
        )?;
        insert_ordered(
            &txn,
            (&self.quarantine.0, &self.quarantine.1),
            &commit.quarantine,
            &mut applied.duplicates,
        )?;
        txn.commit().map_err(unavailable)?;
        Ok(applied)
    }

    fn claim(&self, consumer: &str, claim: &Claim) -> Result<(), CommitError> {
        // Not durable by itself (see the module's note): the next durable commit writes it.
        self.update_checkpoint(consumer, Durability::None, |stored| {
            apply_claim(stored, claim).map(Some)
        })
    }

    fn release(&self, consumer: &str, owner: &str, at: DateTime) -> Result<(), CommitError> {
        self.update_checkpoint(consumer, Durability::Immediate, |stored| {
            Ok(apply_release(stored, owner, at))
        })
    }

    fn dump(&self, consumer: &str) -> Result<Dump, CommitError> {
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
        Ok(Dump {
            checkpoint,
            outbox: read_ordered(&txn, (&self.outbox.0, &self.outbox.1), consumer)?,
            quarantine: read_ordered(&txn, (&self.quarantine.0, &self.quarantine.1), consumer)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use handoff_domain::checkpoint;
    use handoff_domain::{Consumer, Mode};

    use crate::checks::temp_store as open;

    fn record(token: &str) -> Document {
        doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "event": { "_id": { "_data": token } } }
    }

    #[test]
    fn a_record_held_for_the_same_hand_off_is_counted_and_another_events_refuses_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        let consumer = Consumer {
            consumer: "c".into(),
            source: "db.coll".into(),
        };
        store
            .ensure_checkpoint("c", checkpoint::initial("c", "db.coll", "rs"))
            .unwrap();
        let (t1, t2, t3) = (
            doc! { "_data": "8201" },
            doc! { "_data": "8202" },
            doc! { "_data": "8203" },
        );
        let commit = |expected: Option<&Document>, next: &Document, outbox: Vec<Document>| {
            store.commit(&Commit {
                consumer: &consumer,
                expected,
                next,
                mode: Mode::ResumeAfter,
                outbox: outbox.iter().map(|r| r.try_into().unwrap()).collect(),
                quarantine: vec![],
                lease: None,
                policy: None,
            })
        };
        assert!(
            commit(None, &t1, vec![record("8201")])
                .unwrap()
                .duplicates
                .is_empty()
        );
        // The same record again (a checkpoint moved back): left as it is, counted, and the
        // checkpoint still moves.
        let applied = commit(Some(&t1), &t2, vec![record("8201")]).unwrap();
        assert_eq!(applied.duplicates, ["c/1"]);
        // A record of another event under that `_id`: nothing of the commit is written.
        assert!(matches!(
            commit(Some(&t2), &t3, vec![record("8299")]),
            Err(CommitError::Duplicate(id)) if id == "c/1"
        ));
        let dump = store.dump("c").unwrap();
        assert_eq!(dump.outbox, [record("8201")]);
        assert_eq!(dump.checkpoint.unwrap().get_document("token").unwrap(), &t2);
    }

    #[test]
    fn a_split_event_is_one_event_however_split() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        crate::checks::a_split_event_is_one_event_however_split(&store);
    }
}
