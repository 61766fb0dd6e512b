//! A delivery's ledger in the embedded store, beside the outbox it delivers: the same entries
//! and positions as the MongoDB ledger (BSON documents under the same `_id`s) in a table named
//! like the ledger collection, with a companion table that orders each delivery's entries by
//! status and admission (`<ledger>.$status`) and one of the lanes dead entries hold back
//! (`<ledger>.$deadLanes`), and the audit records of dead-record changes in a
//! table named like the audit collection.
//!
//! Every admission, claim, settlement and audited change is one redb write transaction (durable
//! at its commit): a crash leaves it whole or not at all. Admission reads the outbox's commit
//! order (`<outbox>.$order`) from the position's place in it, inside the transaction that admits
//! what it read and moves the position; the file is held by one process at a time, so nothing
//! writes the outbox while a delivery admits from it but that process itself.

use std::collections::HashSet;
use std::time::Duration;

use bson::{Bson, DateTime, Document};
use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition,
    WriteTransaction,
};

use handoff_domain::delivery::{Status, entry_id, position_id};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::ledger::{
    self, Admit, DeadChange, Ledger, Names, OPEN, Settlement, apply_claim, apply_dead_change,
    apply_settlement, claimable, lane_of, new_entry, settles,
};

use crate::redb_store::RedbStore;

type DocTable<'a> = TableDefinition<'a, &'static str, &'static [u8]>;
type OrderTable<'a> = TableDefinition<'a, u64, &'static str>;
/// (delivery, consumer, status, seq) → entry `_id`.
type StatusTable<'a> =
    TableDefinition<'a, (&'static str, &'static str, &'static str, u64), &'static str>;
/// (delivery, consumer, lane, seq) → entry `_id`, of dead entries only: the lanes a dead entry
/// holds back, found without reading the dead entries.
type DeadLaneTable<'a> = StatusTable<'a>;

/// Records admitted per transaction.
const ADMIT_BATCH: usize = 500;
/// The longest a poll that found nothing new waits before it reads again.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// The position's field: the outbox's commit order up to which every record was read.
const OUTBOX_AT: &str = "outboxAt";

/// The ledgers of one embedded store.
pub struct RedbLedger<'a> {
    db: &'a Database,
}

impl RedbStore {
    /// The delivery ledgers kept beside this store's outbox.
    pub fn ledger(&self) -> RedbLedger<'_> {
        RedbLedger {
            db: self.database(),
        }
    }
}

fn failed(what: &str, error: impl std::fmt::Display) -> HandoffError {
    HandoffError::Unavailable(format!("state store: {what}: {error}"))
}

fn decode(what: &str, bytes: &[u8]) -> Result<Document> {
    Document::from_reader(bytes).map_err(|e| failed(what, format!("undecodable document: {e}")))
}

fn encode(what: &str, document: &Document) -> Result<Vec<u8>> {
    document.to_vec().map_err(|e| failed(what, e))
}

fn status_table(names: &Names) -> String {
    format!("{}.$status", names.ledger)
}

fn dead_lane_table(names: &Names) -> String {
    format!("{}.$deadLanes", names.ledger)
}

fn order_table(names: &Names) -> String {
    format!("{}.$order", names.outbox)
}

/// An entry's `seq` as its place in the status table (`None`: not one this tool wrote).
fn seq_of(entry: &Document) -> Option<u64> {
    match entry.get("seq") {
        Some(Bson::Int64(n)) => u64::try_from(*n).ok(),
        Some(Bson::Int32(n)) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// Opens a table for reading; one never written reads as empty (`None`).
macro_rules! readable {
    ($txn:expr, $definition:expr, $what:expr) => {
        match $txn.open_table($definition) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(failed($what, e)),
        }
    };
}

impl RedbLedger<'_> {
    fn read(&self, what: &str) -> Result<ReadTransaction> {
        self.db.begin_read().map_err(|e| failed(what, e))
    }

    fn write(&self, what: &str) -> Result<WriteTransaction> {
        self.db.begin_write().map_err(|e| failed(what, e))
    }

    /// The entries of one status of the delivery in admission order: (`seq`, `_id`), from
    /// `from` on, at most `limit`.
    fn ids_of(
        &self,
        txn: &ReadTransaction,
        names: &Names,
        status: Status,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>> {
        let what = "reading the ledger";
        let name = status_table(names);
        let Some(table) = readable!(txn, StatusTable::new(&name), what) else {
            return Ok(Vec::new());
        };
        let (d, c, s) = (
            names.delivery.as_str(),
            names.consumer.as_str(),
            status.as_str(),
        );
        let mut ids = Vec::new();
        for item in table
            .range((d, c, s, from)..=(d, c, s, u64::MAX))
            .map_err(|e| failed(what, e))?
            .take(limit)
        {
            let (key, id) = item.map_err(|e| failed(what, e))?;
            ids.push((key.value().3, id.value().to_string()));
        }
        Ok(ids)
    }

    /// The documents of `ids` in the ledger table, in that order (those missing left out).
    fn documents(
        &self,
        txn: &ReadTransaction,
        names: &Names,
        ids: &[String],
    ) -> Result<Vec<Document>> {
        let what = "reading the ledger";
        let Some(table) = readable!(txn, DocTable::new(&names.ledger), what) else {
            return Ok(Vec::new());
        };
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(guard) = table.get(id.as_str()).map_err(|e| failed(what, e))? {
                found.push(decode(what, guard.value())?);
            }
        }
        Ok(found)
    }
}

/// One write transaction's view of a delivery's ledger: its documents and its status order.
struct Writing<'t> {
    entries: Table<'t, &'static str, &'static [u8]>,
    order: Table<'t, (&'static str, &'static str, &'static str, u64), &'static str>,
    dead_lanes: Table<'t, (&'static str, &'static str, &'static str, u64), &'static str>,
    what: &'static str,
}

impl<'t> Writing<'t> {
    fn open(txn: &'t WriteTransaction, names: &Names, what: &'static str) -> Result<Writing<'t>> {
        let status = status_table(names);
        let dead_lanes = dead_lane_table(names);
        Ok(Writing {
            entries: txn
                .open_table(DocTable::new(&names.ledger))
                .map_err(|e| failed(what, e))?,
            order: txn
                .open_table(StatusTable::new(&status))
                .map_err(|e| failed(what, e))?,
            dead_lanes: txn
                .open_table(DeadLaneTable::new(&dead_lanes))
                .map_err(|e| failed(what, e))?,
            what,
        })
    }

    fn get(&self, id: &str) -> Result<Option<Document>> {
        match self.entries.get(id).map_err(|e| failed(self.what, e))? {
            Some(guard) => decode(self.what, guard.value()).map(Some),
            None => Ok(None),
        }
    }

    fn put(&mut self, id: &str, document: &Document) -> Result<()> {
        let bytes = encode(self.what, document)?;
        self.entries
            .insert(id, bytes.as_slice())
            .map_err(|e| failed(self.what, e))?;
        Ok(())
    }

    /// An entry stored with its status order and dead lanes kept: `before` is its status as it
    /// was (`None`: a new entry; an entry's lane and `seq` never change).
    fn put_entry(
        &mut self,
        names: &Names,
        id: &str,
        entry: &Document,
        before: Option<Status>,
    ) -> Result<()> {
        let seq = seq_of(entry).ok_or_else(|| failed(self.what, "an entry without its seq"))?;
        let (d, c) = (names.delivery.as_str(), names.consumer.as_str());
        let lane = entry.get_str("lane").unwrap_or_default();
        let after = ledger::stored_status(entry);
        if let Some(before) = before {
            self.order
                .remove((d, c, before.as_str(), seq))
                .map_err(|e| failed(self.what, e))?;
            if before == Status::Dead {
                self.dead_lanes
                    .remove((d, c, lane, seq))
                    .map_err(|e| failed(self.what, e))?;
            }
        }
        if let Some(after) = after {
            self.order
                .insert((d, c, after.as_str(), seq), id)
                .map_err(|e| failed(self.what, e))?;
            if after == Status::Dead {
                self.dead_lanes
                    .insert((d, c, lane, seq), id)
                    .map_err(|e| failed(self.what, e))?;
            }
        }
        self.put(id, entry)
    }
}

/// The delivery's entry `id` as stored, with its status, when it is one of this delivery.
fn entry_of(writing: &Writing<'_>, names: &Names, id: &str) -> Result<Option<(Document, Status)>> {
    let Some(entry) = writing.get(id)? else {
        return Ok(None);
    };
    let ours = entry.get_str("delivery").ok() == Some(names.delivery.as_str())
        && entry.get_str("consumer").ok() == Some(names.consumer.as_str());
    match (ours, ledger::stored_status(&entry)) {
        (true, Some(status)) if seq_of(&entry).is_some() => Ok(Some((entry, status))),
        _ => Ok(None),
    }
}

impl Ledger for RedbLedger<'_> {
    fn kind(&self) -> &'static str {
        "embedded store"
    }

    fn open(&self, names: &Names, pin: &str) -> Result<Document> {
        let what = "opening the delivery's position";
        let id = position_id(&names.delivery, &names.consumer);
        {
            let txn = self.read(what)?;
            if let Some(table) = readable!(txn, DocTable::new(&names.ledger), what)
                && let Some(guard) = table.get(id.as_str()).map_err(|e| failed(what, e))?
            {
                return decode(what, guard.value());
            }
        }
        let txn = self.write(what)?;
        let position = {
            let mut writing = Writing::open(&txn, names, what)?;
            match writing.get(&id)? {
                Some(position) => position,
                None => {
                    let now = DateTime::now();
                    let position = bson::doc! {
                        "_id": &id, "delivery": &names.delivery, "consumer": &names.consumer,
                        "kind": "position", "sink": pin, "token": Bson::Null, "seq": 0_i64,
                        OUTBOX_AT: 0_i64, "createdAt": now, "updatedAt": now,
                    };
                    writing.put(&id, &position)?;
                    position
                }
            }
        };
        txn.commit().map_err(|e| failed(what, e))?;
        Ok(position)
    }

    fn admitter<'b>(
        &'b self,
        names: &'b Names,
        _position: &Document,
        max_await: Duration,
    ) -> Result<Box<dyn Admit + 'b>> {
        Ok(Box::new(RedbAdmitter {
            ledger: self,
            names,
            idle: max_await.min(IDLE_POLL),
            admitted: 0,
        }))
    }

    fn open_entries(&self, names: &Names, limit: usize) -> Result<Vec<Document>> {
        let txn = self.read("reading the ledger")?;
        let mut ids = Vec::new();
        for status in OPEN {
            ids.extend(self.ids_of(&txn, names, status, 0, limit)?);
        }
        ids.sort();
        ids.truncate(limit);
        let ids: Vec<String> = ids.into_iter().map(|(_, id)| id).collect();
        self.documents(&txn, names, &ids)
    }

    fn entries_of(
        &self,
        names: &Names,
        status: Status,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Document>> {
        let txn = self.read("reading the ledger")?;
        let from = after.map_or(0, |after| {
            u64::try_from(after).map_or(0, |a| a.saturating_add(1))
        });
        let ids: Vec<String> = self
            .ids_of(&txn, names, status, from, limit)?
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        self.documents(&txn, names, &ids)
    }

    fn count(&self, names: &Names, status: Status) -> Result<u64> {
        let txn = self.read("counting the ledger's entries")?;
        Ok(self.ids_of(&txn, names, status, 0, usize::MAX)?.len() as u64)
    }

    fn dead_lanes(&self, names: &Names, lanes: &[&str]) -> Result<HashSet<String>> {
        if lanes.is_empty() {
            return Ok(HashSet::new());
        }
        let what = "reading the ledger's dead lanes";
        let txn = self.read(what)?;
        let name = dead_lane_table(names);
        let Some(table) = readable!(txn, DeadLaneTable::new(&name), what) else {
            return Ok(HashSet::new());
        };
        let (d, c) = (names.delivery.as_str(), names.consumer.as_str());
        let mut held = HashSet::new();
        for lane in lanes {
            let mut range = table
                .range((d, c, *lane, 0)..=(d, c, *lane, u64::MAX))
                .map_err(|e| failed(what, e))?;
            if range
                .next()
                .transpose()
                .map_err(|e| failed(what, e))?
                .is_some()
            {
                held.insert((*lane).to_string());
            }
        }
        Ok(held)
    }

    fn records(&self, names: &Names, ids: &[&str]) -> Result<Vec<Document>> {
        let what = "reading outbox records";
        let txn = self.read(what)?;
        let Some(table) = readable!(txn, DocTable::new(&names.outbox), what) else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for id in ids {
            if let Some(guard) = table.get(*id).map_err(|e| failed(what, e))? {
                let record = decode(what, guard.value())?;
                if record.get_str("consumer").ok() == Some(names.consumer.as_str()) {
                    found.push(record);
                }
            }
        }
        Ok(found)
    }

    fn claim(
        &self,
        names: &Names,
        entries: &[&str],
        owner: &str,
        until: DateTime,
    ) -> Result<Vec<(String, u32)>> {
        let what = "claiming ledger entries";
        let txn = self.write(what)?;
        let mut claimed = Vec::new();
        {
            let mut writing = Writing::open(&txn, names, what)?;
            let now = DateTime::now();
            for id in entries {
                let Some((mut entry, before)) = entry_of(&writing, names, id)? else {
                    continue;
                };
                if !claimable(&entry, now) {
                    continue;
                }
                let attempts = ledger::stored_attempts(&entry).unwrap_or(0);
                apply_claim(&mut entry, owner, until, now);
                writing.put_entry(names, id, &entry, Some(before))?;
                claimed.push((id.to_string(), attempts));
            }
        }
        txn.commit().map_err(|e| failed(what, e))?;
        Ok(claimed)
    }

    fn settle(&self, names: &Names, owner: &str, settlements: &[Settlement]) -> Result<u64> {
        let what = "settling ledger entries";
        let txn = self.write(what)?;
        let mut settled = 0;
        {
            let mut writing = Writing::open(&txn, names, what)?;
            let now = DateTime::now();
            for settlement in settlements {
                let Some((mut entry, before)) = entry_of(&writing, names, &settlement.entry)?
                else {
                    continue;
                };
                if !settles(&entry, owner, settlement) {
                    continue;
                }
                apply_settlement(&mut entry, settlement, now);
                writing.put_entry(names, &settlement.entry, &entry, Some(before))?;
                settled += 1;
            }
        }
        txn.commit().map_err(|e| failed(what, e))?;
        Ok(settled)
    }

    fn positions(&self, names: &Names, limit: usize) -> Result<Vec<Document>> {
        let what = "reading the deliveries";
        let txn = self.read(what)?;
        let Some(table) = readable!(txn, DocTable::new(&names.ledger), what) else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for item in table
            .range("@position/".."@position0")
            .map_err(|e| failed(what, e))?
        {
            let (_, bytes) = item.map_err(|e| failed(what, e))?;
            let position = decode(what, bytes.value())?;
            if position.get_str("consumer").ok() == Some(names.consumer.as_str()) {
                found.push(position);
            }
        }
        found.sort_by(|a, b| {
            a.get_str("delivery")
                .unwrap_or_default()
                .cmp(b.get_str("delivery").unwrap_or_default())
        });
        found.truncate(limit);
        Ok(found)
    }

    fn change_dead(
        &self,
        names: &Names,
        changes: &[DeadChange<'_>],
        audit: &Document,
    ) -> Result<Vec<String>> {
        let what = "changing dead entries";
        let txn = self.write(what)?;
        let mut changed = Vec::new();
        {
            let mut writing = Writing::open(&txn, names, what)?;
            let now = DateTime::now();
            for change in changes {
                let Some((mut entry, before)) = entry_of(&writing, names, change.entry)? else {
                    continue;
                };
                if before != Status::Dead {
                    continue;
                }
                apply_dead_change(&mut entry, change, now);
                writing.put_entry(names, change.entry, &entry, Some(before))?;
                changed.push(change.entry.to_string());
            }
        }
        if !changed.is_empty() {
            let key = match audit.get("_id") {
                Some(Bson::ObjectId(id)) => id.to_hex(),
                Some(Bson::String(id)) => id.clone(),
                _ => bson::oid::ObjectId::new().to_hex(),
            };
            let bytes = encode(what, audit)?;
            let mut records = txn
                .open_table(DocTable::new(&names.audit))
                .map_err(|e| failed(what, e))?;
            records
                .insert(key.as_str(), bytes.as_slice())
                .map_err(|e| failed(what, e))?;
        }
        txn.commit().map_err(|e| failed(what, e))?;
        Ok(changed)
    }
}

/// Admission from the embedded outbox: its commit order read from the position's place on.
struct RedbAdmitter<'a> {
    ledger: &'a RedbLedger<'a>,
    names: &'a Names,
    /// How long a poll that found nothing waits.
    idle: Duration,
    admitted: u64,
}

impl RedbAdmitter<'_> {
    /// Where the position stands in the outbox's commit order, and whether the outbox holds
    /// records after it (one read, no write).
    fn behind(&self) -> Result<bool> {
        let what = "reading the outbox";
        let names = self.names;
        let txn = self.ledger.read(what)?;
        let at = match readable!(txn, DocTable::new(&names.ledger), what) {
            Some(table) => match table
                .get(position_id(&names.delivery, &names.consumer).as_str())
                .map_err(|e| failed(what, e))?
            {
                Some(guard) => outbox_at(&decode(what, guard.value())?),
                None => 0,
            },
            None => 0,
        };
        let order_name = order_table(names);
        let Some(order) = readable!(txn, OrderTable::new(&order_name), what) else {
            return Ok(false);
        };
        Ok(order
            .range(at..)
            .map_err(|e| failed(what, e))?
            .next()
            .is_some())
    }

    /// One admission transaction: up to [`ADMIT_BATCH`] records after the position, each
    /// given an entry unless it has one, the position moved past them. Returns how many of
    /// the consumer's records were read.
    fn admit(&mut self) -> Result<usize> {
        let what = "admitting outbox records";
        let names = self.names;
        let id = position_id(&names.delivery, &names.consumer);
        let txn = self.ledger.write(what)?;
        let (read, new) = {
            let mut writing = Writing::open(&txn, names, what)?;
            let mut position = writing.get(&id)?.ok_or_else(|| {
                HandoffError::Conflict("the delivery's position was removed while it ran".into())
            })?;
            let at = outbox_at(&position);
            let mut seq = position.get_i64("seq").unwrap_or(0);
            let order_name = order_table(names);
            let order = txn
                .open_table(OrderTable::new(&order_name))
                .map_err(|e| failed(what, e))?;
            let outbox = txn
                .open_table(DocTable::new(&names.outbox))
                .map_err(|e| failed(what, e))?;
            let mut next = at;
            let (mut read, mut new) = (0, 0);
            let now = DateTime::now();
            for item in order
                .range(at..)
                .map_err(|e| failed(what, e))?
                .take(ADMIT_BATCH)
            {
                let (key, record_id) = item.map_err(|e| failed(what, e))?;
                next = key.value().saturating_add(1);
                let Some(guard) = outbox.get(record_id.value()).map_err(|e| failed(what, e))?
                else {
                    continue;
                };
                let record = decode(what, guard.value())?;
                if record.get_str("consumer").ok() != Some(names.consumer.as_str()) {
                    continue;
                }
                read += 1;
                let record_id = record_id.value();
                let entry = entry_id(&names.delivery, record_id);
                if writing.get(&entry)?.is_some() {
                    continue;
                }
                let document = new_entry(names, &entry, record_id, &lane_of(&record), seq, now);
                writing.put_entry(names, &entry, &document, None)?;
                seq += 1;
                new += 1;
            }
            position.insert(OUTBOX_AT, i64::try_from(next).unwrap_or(i64::MAX));
            position.insert("seq", seq);
            position.insert("updatedAt", now);
            writing.put(&id, &position)?;
            (read, new)
        };
        txn.commit().map_err(|e| failed(what, e))?;
        self.admitted += new;
        Ok(read)
    }
}

/// The position's place in the outbox's commit order.
fn outbox_at(position: &Document) -> u64 {
    match position.get(OUTBOX_AT) {
        Some(Bson::Int64(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

impl Admit for RedbAdmitter<'_> {
    fn poll(&mut self) -> Result<usize> {
        if !self.behind()? {
            std::thread::sleep(self.idle);
            return Ok(0);
        }
        self.admit()
    }

    fn admitted(&self) -> u64 {
        self.admitted
    }

    fn sweeps(&self) -> u32 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use handoff_domain::checkpoint::{self, Mode};
    use handoff_domain::{CheckpointStore, Commit, Consumer};

    use crate::checks::temp_store as store;

    fn names(delivery: &str) -> Names {
        Names {
            database: "d".into(),
            outbox: "ob".into(),
            ledger: "ledger".into(),
            audit: "audit".into(),
            consumer: "c".into(),
            delivery: delivery.into(),
        }
    }

    /// Hands off records of keys `keys` for consumer `consumer`, one commit.
    fn hand_off(store: &RedbStore, consumer: &str, from: u32, keys: &[i32]) {
        let who = Consumer {
            consumer: consumer.into(),
            source: "db.coll".into(),
        };
        let initial = checkpoint::initial(consumer, "db.coll", "rs");
        let stored = store.ensure_checkpoint(consumer, initial).unwrap();
        let expected = stored.get_document("token").ok().cloned();
        let records: Vec<bson::RawDocumentBuf> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let n = from + i as u32;
                let record = doc! {
                    "_id": format!("{consumer}/e{n}"), "consumer": consumer, "source": "db.coll",
                    "event": { "_id": { "_data": format!("82{n:04}") }, "documentKey": { "_id": key } },
                };
                (&record).try_into().unwrap()
            })
            .collect();
        let next = doc! { "_data": format!("82{:04}", from + keys.len() as u32) };
        store
            .commit(&Commit {
                consumer: &who,
                expected: expected.as_ref(),
                next: &next,
                mode: Mode::ResumeAfter,
                outbox: records,
                quarantine: vec![],
                lease: None,
                policy: None,
            })
            .unwrap();
    }

    fn admit_all(ledger: &RedbLedger<'_>, names: &Names) -> u64 {
        let position = ledger.open(names, "http://sink").unwrap();
        let mut admitter = ledger
            .admitter(names, &position, Duration::from_millis(1))
            .unwrap();
        while admitter.poll().unwrap() > 0 {}
        admitter.admitted()
    }

    fn records_of(entries: &[Document]) -> Vec<&str> {
        entries
            .iter()
            .map(|e| e.get_str("record").unwrap())
            .collect()
    }

    #[test]
    fn admission_gives_each_record_of_the_consumer_one_entry_in_hand_off_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        hand_off(&store, "c", 1, &[1, 2, 1]);
        hand_off(&store, "other", 1, &[9]);
        let ledger = store.ledger();
        let names = names("hooks");
        assert_eq!(admit_all(&ledger, &names), 3);
        let open = ledger.open_entries(&names, 10).unwrap();
        assert_eq!(records_of(&open), ["c/e1", "c/e2", "c/e3"]);
        assert_eq!(open[0].get_str("lane").ok(), open[2].get_str("lane").ok());
        assert_ne!(open[0].get_str("lane").ok(), open[1].get_str("lane").ok());
        // Admitted again (a new admitter, records handed off since): only the new one.
        hand_off(&store, "c", 4, &[3]);
        assert_eq!(admit_all(&ledger, &names), 1);
        assert_eq!(ledger.count(&names, Status::Pending).unwrap(), 4);
        // Another delivery of the consumer has its own entries and position.
        assert_eq!(admit_all(&ledger, &self::names("other")), 4);
        let positions = ledger.positions(&names, 10).unwrap();
        let delivered: Vec<&str> = positions
            .iter()
            .map(|p| p.get_str("delivery").unwrap())
            .collect();
        assert_eq!(delivered, ["hooks", "other"]);
        // The pin is kept as first written.
        assert_eq!(
            ledger
                .open(&names, "http://elsewhere")
                .unwrap()
                .get_str("sink")
                .ok(),
            Some("http://sink")
        );
    }

    #[test]
    fn a_claim_is_held_against_other_owners_and_only_its_owner_settles_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        hand_off(&store, "c", 1, &[1, 2]);
        let ledger = store.ledger();
        let names = names("hooks");
        admit_all(&ledger, &names);
        let ids = ["hooks/c/e1", "hooks/c/e2"];
        let until = DateTime::from_millis(DateTime::now().timestamp_millis() + 60_000);
        assert_eq!(
            ledger.claim(&names, &ids, "a", until).unwrap(),
            [("hooks/c/e1".to_string(), 0), ("hooks/c/e2".to_string(), 0)]
        );
        assert!(ledger.claim(&names, &ids, "b", until).unwrap().is_empty());
        let settlement = |entry: &str, status| Settlement {
            entry: entry.into(),
            status,
            unclaimed_attempts: None,
            next_attempt: None,
            error_class: None,
            error: None,
            evidence: Some(doc! { "httpStatus": 200 }),
        };
        assert_eq!(
            ledger
                .settle(&names, "b", &[settlement(ids[0], Status::Succeeded)])
                .unwrap(),
            0
        );
        assert_eq!(
            ledger
                .settle(
                    &names,
                    "a",
                    &[
                        settlement(ids[0], Status::Succeeded),
                        settlement(ids[1], Status::Dead)
                    ]
                )
                .unwrap(),
            2
        );
        assert!(ledger.open_entries(&names, 10).unwrap().is_empty());
        assert_eq!(ledger.count(&names, Status::Succeeded).unwrap(), 1);
        assert_eq!(ledger.count(&names, Status::InProgress).unwrap(), 0);
        let dead = ledger.entries_of(&names, Status::Dead, None, 10).unwrap();
        assert_eq!(records_of(&dead), ["c/e2"]);
        let lane = dead[0].get_str("lane").unwrap();
        assert_eq!(
            ledger.dead_lanes(&names, &[lane, "other"]).unwrap(),
            HashSet::from([lane.to_string()])
        );
        // Replayed with its audit: pending again, attempts from zero, the audit record kept.
        let audit = doc! { "_id": bson::oid::ObjectId::new(), "reason": "fixed" };
        let change = DeadChange {
            entry: ids[1],
            to: Status::Pending,
            note: doc! { "reason": "fixed" },
        };
        let not_dead = DeadChange {
            entry: ids[0],
            ..change.clone()
        };
        assert_eq!(
            ledger
                .change_dead(&names, &[change, not_dead], &audit)
                .unwrap(),
            [ids[1]]
        );
        let open = ledger.open_entries(&names, 10).unwrap();
        assert_eq!(records_of(&open), ["c/e2"]);
        assert!(ledger.dead_lanes(&names, &[lane]).unwrap().is_empty());
        assert_eq!(open[0].get_i32("attempts").ok(), Some(0));
        assert_eq!(open[0].get_array("audit").map(Vec::len).ok(), Some(1));
        let txn = store.database().begin_read().unwrap();
        let table = txn.open_table(DocTable::new("audit")).unwrap();
        assert_eq!(table.iter().unwrap().count(), 1);
    }
}
