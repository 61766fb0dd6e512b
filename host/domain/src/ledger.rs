//! Where a delivery's ledger lives: the trait every ledger store is behind (the consumer's
//! MongoDB database, the embedded store), what admission reads the outbox with, and the changes
//! a ledger takes. The vocabulary of entries and statuses is [`crate::delivery`].
//!
//! Every method that writes is one transaction of the store: a settlement, a claim or an
//! admission is written whole or not at all.

use std::collections::HashSet;
use std::time::Duration;

use bson::{Bson, DateTime, Document};

use crate::delivery::Status;
use crate::effect::source_key;
use crate::error::Result;
use crate::token::canonical_text;

/// The longest lane text kept (longer keys are lanes by their digest).
const MAX_LANE: usize = 512;

/// Where a delivery's state and records are.
#[derive(Clone, Debug)]
pub struct Names {
    /// The consumer's database (a MongoDB ledger's).
    pub database: String,
    pub outbox: String,
    pub ledger: String,
    pub audit: String,
    pub consumer: String,
    pub delivery: String,
}

/// How an attempt ends in the ledger.
#[derive(Clone, Debug)]
pub struct Settlement {
    pub entry: String,
    pub status: Status,
    /// The attempts the entry had before this attempt, for an entry settled without a claim
    /// (a transactional sink's failure): the settlement counts the attempt. `None`: the entry
    /// was claimed by the settling owner.
    pub unclaimed_attempts: Option<u32>,
    pub next_attempt: Option<DateTime>,
    pub error_class: Option<String>,
    pub error: Option<String>,
    pub evidence: Option<Document>,
}

/// An audited change of one dead entry: to pending (replay) or ignored (discard).
#[derive(Clone, Debug)]
pub struct DeadChange<'a> {
    pub entry: &'a str,
    pub to: Status,
    /// Kept in the entry's `audit` list.
    pub note: Document,
}

/// The admitting side of a delivery: the outbox read in hand-off order and each record given a
/// ledger entry.
pub trait Admit: Send {
    /// Reads what the outbox has (waiting at most the await bound when nothing has come) and
    /// admits it. Returns how many records were read.
    fn poll(&mut self) -> Result<usize>;
    /// Records admitted by this deliverer.
    fn admitted(&self) -> u64;
    /// Sweeps of the whole outbox made (a new delivery, a lost position).
    fn sweeps(&self) -> u32;
}

/// A store of delivery ledgers. `names` says which delivery of which consumer, and where.
pub trait Ledger: Sync {
    /// What the ledger is kept in, for messages (`mongodb`, `embedded store`).
    fn kind(&self) -> &'static str;
    /// The delivery's position, created (nothing admitted, pinned to `pin`) if missing, as
    /// stored; what its reads need is made ready.
    fn open(&self, names: &Names, pin: &str) -> Result<Document>;
    /// The admitting side, starting at `position` (as [`Ledger::open`] gave it).
    fn admitter<'a>(
        &'a self,
        names: &'a Names,
        position: &Document,
        max_await: Duration,
    ) -> Result<Box<dyn Admit + 'a>>;
    /// The delivery's open entries (pending, in progress, failed) in admission order, at most
    /// `limit`.
    fn open_entries(&self, names: &Names, limit: usize) -> Result<Vec<Document>>;
    /// The delivery's entries of `status` in admission order, at most `limit` (`after`: only
    /// those of a greater `seq`).
    fn entries_of(
        &self,
        names: &Names,
        status: Status,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Document>>;
    /// How many of the delivery's entries have `status`.
    fn count(&self, names: &Names, status: Status) -> Result<u64>;
    /// Which of `lanes` hold a dead entry of the delivery.
    fn dead_lanes(&self, names: &Names, lanes: &[&str]) -> Result<HashSet<String>>;
    /// The consumer's outbox records of `ids`, as stored.
    fn records(&self, names: &Names, ids: &[&str]) -> Result<Vec<Document>>;
    /// Claims `entries` for `owner` until `until`: each that is still pending or failed and
    /// due, or in progress under a lease that has ended, becomes in progress with one attempt
    /// more. Returns those claimed with their attempts before this one.
    fn claim(
        &self,
        names: &Names,
        entries: &[&str],
        owner: &str,
        until: DateTime,
    ) -> Result<Vec<(String, u32)>>;
    /// Settles attempts: each entry still claimed by `owner` (or, unclaimed, still open at the
    /// attempts read) takes its new status. Returns how many were settled.
    fn settle(&self, names: &Names, owner: &str, settlements: &[Settlement]) -> Result<u64>;
    /// The positions of every delivery of `names.consumer` (at most `limit`), by name.
    fn positions(&self, names: &Names, limit: usize) -> Result<Vec<Document>>;
    /// Dead entries changed with `audit` (the audit record, kept once): each entry still dead
    /// takes its new status (replayed: attempts 0, no next attempt, no lease), its note appended
    /// to its `audit`. Returns the `_id`s of those changed.
    fn change_dead(
        &self,
        names: &Names,
        changes: &[DeadChange<'_>],
        audit: &Document,
    ) -> Result<Vec<String>>;
}

/// The lane of a record (as admission reads it): the canonical text of its source document's
/// key, else of its aggregate's ID, else the record's own `_id` (a lane of its own).
pub fn lane_of(record: &Document) -> String {
    let key = source_key(record);
    let text = match &key {
        Some(key) => canonical_text(&bson::doc! { "k": key.clone() }),
        None => format!("record:{}", record.get_str("_id").unwrap_or_default()),
    };
    if text.len() <= MAX_LANE {
        text
    } else {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(text.as_bytes());
        format!("sha256:{}", hex::encode(digest))
    }
}

/// The statuses of open entries.
pub const OPEN: [Status; 3] = [Status::Pending, Status::InProgress, Status::Failed];

/// A new entry for `record` of `names`' delivery, admitted `seq`th in lane `lane`.
pub fn new_entry(
    names: &Names,
    id: &str,
    record: &str,
    lane: &str,
    seq: i64,
    now: DateTime,
) -> Document {
    bson::doc! {
        "_id": id, "delivery": &names.delivery, "consumer": &names.consumer,
        "record": record, "seq": seq, "lane": lane,
        "status": Status::Pending.as_str(), "attempts": 0, "createdAt": now,
        "updatedAt": now,
    }
}

/// An entry document's attempts as stored (`None`: not a count this tool writes).
pub fn stored_attempts(entry: &Document) -> Option<u32> {
    match entry.get("attempts") {
        Some(Bson::Int32(n)) => u32::try_from(*n).ok(),
        Some(Bson::Int64(n)) => u32::try_from(*n).ok(),
        None => Some(0),
        _ => None,
    }
}

/// An entry document's status as stored.
pub fn stored_status(entry: &Document) -> Option<Status> {
    entry.get_str("status").ok().and_then(Status::parse)
}

/// Whether a stored entry may be claimed now: pending or failed and due, or in progress under a
/// lease that has ended.
pub fn claimable(entry: &Document, now: DateTime) -> bool {
    let due = entry
        .get_datetime("nextAttemptAt")
        .map_or(true, |at| *at <= now);
    let status = stored_status(entry);
    let free = matches!(status, Some(Status::Pending | Status::Failed))
        || (status == Some(Status::InProgress)
            && entry
                .get_datetime("leaseUntil")
                .is_ok_and(|until| *until <= now));
    due && free
}

/// Whether `settlement` applies to the stored entry: claimed by `owner`, or (unclaimed) still
/// open at the attempts read.
pub fn settles(entry: &Document, owner: &str, settlement: &Settlement) -> bool {
    let status = stored_status(entry);
    match settlement.unclaimed_attempts {
        None => status == Some(Status::InProgress) && entry.get_str("owner").ok() == Some(owner),
        Some(attempts) => {
            status.is_some_and(Status::is_open) && stored_attempts(entry) == Some(attempts)
        }
    }
}

/// The entry with its claim by `owner` until `until`: in progress, one attempt more.
pub fn apply_claim(entry: &mut Document, owner: &str, until: DateTime, now: DateTime) {
    let attempts = stored_attempts(entry).unwrap_or(0).saturating_add(1);
    entry.insert("status", Status::InProgress.as_str());
    entry.insert("owner", owner);
    entry.insert("leaseUntil", until);
    entry.insert("updatedAt", now);
    entry.insert("attempts", i64::from(attempts));
}

/// The fields a change of an entry sets, and those it removes: what a document store applies
/// to the entry and what a MongoDB ledger sends as `$set` and `$unset`.
#[derive(Clone, Debug, Default)]
pub struct Change {
    pub set: Document,
    pub unset: Vec<&'static str>,
}

impl Change {
    /// A field set when `value` is given, removed when it is not.
    fn either(&mut self, key: &'static str, value: Option<Bson>) {
        match value {
            Some(value) => {
                self.set.insert(key, value);
            }
            None => self.unset.push(key),
        }
    }

    /// The change made to a stored entry.
    pub fn apply(&self, entry: &mut Document) {
        for (key, value) in &self.set {
            entry.insert(key.clone(), value.clone());
        }
        for key in &self.unset {
            entry.remove(*key);
        }
    }
}

/// What `settlement` changes in its entry (an unclaimed attempt's count aside: see
/// [`apply_settlement`]).
pub fn settlement_change(settlement: &Settlement, now: DateTime) -> Change {
    let mut change = Change {
        set: bson::doc! {
            "status": settlement.status.as_str(), "updatedAt": now, "leaseUntil": now,
        },
        unset: vec!["owner"],
    };
    change.either("nextAttemptAt", settlement.next_attempt.map(Bson::DateTime));
    change.either(
        "lastErrorClass",
        settlement.error_class.clone().map(Bson::String),
    );
    change.either("lastError", settlement.error.clone().map(Bson::String));
    if let Some(evidence) = &settlement.evidence {
        change.set.insert("evidence", evidence.clone());
    }
    if settlement.status == Status::Succeeded {
        change.set.insert("succeededAt", now);
    }
    change
}

/// What an audited change of a dead entry changes in it (its note appended to the entry's
/// `audit` aside).
pub fn dead_change(change: &DeadChange<'_>, now: DateTime) -> Change {
    let mut set = bson::doc! { "status": change.to.as_str(), "updatedAt": now };
    if change.to == Status::Pending {
        set.insert("attempts", 0);
    }
    Change {
        set,
        unset: vec!["nextAttemptAt", "owner", "leaseUntil"],
    }
}

/// The entry with its settlement (an unclaimed attempt counts now).
pub fn apply_settlement(entry: &mut Document, settlement: &Settlement, now: DateTime) {
    if settlement.unclaimed_attempts.is_some() {
        let attempts = stored_attempts(entry).unwrap_or(0).saturating_add(1);
        entry.insert("attempts", i64::from(attempts));
    }
    settlement_change(settlement, now).apply(entry);
}

/// The dead entry with its audited change.
pub fn apply_dead_change(entry: &mut Document, change: &DeadChange<'_>, now: DateTime) {
    dead_change(change, now).apply(entry);
    let mut audit = match entry.remove("audit") {
        Some(Bson::Array(audit)) => audit,
        _ => Vec::new(),
    };
    audit.push(Bson::Document(change.note.clone()));
    entry.insert("audit", audit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn lanes_are_keys_and_a_keyless_record_is_a_lane_of_its_own() {
        let record = doc! { "_id": "c/x", "event": { "documentKey": { "_id": 5 } } };
        assert_eq!(lane_of(&record), "{\"k\": 5}");
        assert_eq!(
            lane_of(&doc! { "_id": "c/y", "aggregateId": "o-1" }),
            "{\"k\": \"o-1\"}"
        );
        assert_eq!(lane_of(&doc! { "_id": "c/z" }), "record:c/z");
        let long = doc! { "_id": "c/w", "aggregateId": "x".repeat(1000) };
        assert!(lane_of(&long).starts_with("sha256:"));
    }

    fn names() -> Names {
        Names {
            database: "d".into(),
            outbox: "o".into(),
            ledger: "l".into(),
            audit: "a".into(),
            consumer: "c".into(),
            delivery: "default".into(),
        }
    }

    #[test]
    fn an_entry_is_claimed_once_and_settled_only_by_its_claimant() {
        let now = DateTime::from_millis(1_000_000);
        let later = DateTime::from_millis(1_060_000);
        let mut entry = new_entry(&names(), "default/c/1", "c/1", "{\"k\": 1}", 0, now);
        assert!(claimable(&entry, now));
        apply_claim(&mut entry, "me", later, now);
        assert!(!claimable(&entry, now), "a live lease is not claimable");
        assert!(claimable(&entry, later), "an ended lease is");
        let settlement = |unclaimed| Settlement {
            entry: "default/c/1".into(),
            status: Status::Failed,
            unclaimed_attempts: unclaimed,
            next_attempt: Some(later),
            error_class: Some("transient".into()),
            error: Some("503".into()),
            evidence: None,
        };
        assert!(!settles(&entry, "other", &settlement(None)));
        assert!(
            !settles(&entry, "me", &settlement(Some(0))),
            "it was tried once"
        );
        assert!(settles(&entry, "me", &settlement(None)));
        apply_settlement(&mut entry, &settlement(None), now);
        assert_eq!(stored_status(&entry), Some(Status::Failed));
        assert_eq!(stored_attempts(&entry), Some(1));
        assert!(entry.get("owner").is_none());
        assert!(!claimable(&entry, now), "not due before its next attempt");
        assert!(claimable(&entry, later));
        // Unclaimed (a transactional sink): the attempt counts at the settlement.
        assert!(settles(&entry, "me", &settlement(Some(1))));
        apply_settlement(&mut entry, &settlement(Some(1)), now);
        assert_eq!(stored_attempts(&entry), Some(2));
    }

    #[test]
    fn a_dead_change_keeps_its_note_and_a_replay_starts_attempts_again() {
        let now = DateTime::from_millis(1_000_000);
        let mut entry = new_entry(&names(), "default/c/1", "c/1", "l", 0, now);
        entry.insert("status", "dead");
        entry.insert("attempts", 10);
        for to in [Status::Pending, Status::Ignored] {
            let change = DeadChange {
                entry: "default/c/1",
                to,
                note: doc! { "action": to.as_str() },
            };
            apply_dead_change(&mut entry, &change, now);
        }
        assert_eq!(stored_status(&entry), Some(Status::Ignored));
        assert_eq!(stored_attempts(&entry), Some(0));
        assert_eq!(entry.get_array("audit").unwrap().len(), 2);
    }
}
