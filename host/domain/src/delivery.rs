//! Delivery's vocabulary: what a delivery takes from a consumer's outbox to a sink, and the
//! ledger that says, record by record, how far it got.
//!
//! A delivery has a name and belongs to one consumer; one consumer may feed several. Its ledger
//! (in the consumer's database, [`DEFAULT_LEDGER`]) holds:
//!
//! - one **entry** per outbox record, `_id` `<delivery>/<record _id>`: the record's admission
//!   order (`seq`), its lane (the source document's key: records of one key are delivered in
//!   order), its [`Status`], attempts, lease, next attempt, the last error's class and redacted
//!   text, and the sink's evidence;
//! - one **position** per delivery, `_id` `@position/<delivery>/<consumer>`: the outbox stream's
//!   resume token up to which every record was admitted, the next `seq`, and the sink the
//!   delivery is pinned to (a delivery never moves to another sink silently).
//!
//! Dead entries change only through the audited `deliver dead` commands; each change is kept in
//! the entry's `audit` list and in the audit collection.

use bson::{Bson, DateTime, Document, Timestamp};

/// The ledger collection's default name.
pub const DEFAULT_LEDGER: &str = "kestra_change_deliveries";
/// The delivery a command works on when none is named.
pub const DEFAULT_DELIVERY: &str = "default";
/// The longest delivery name.
pub const MAX_NAME: usize = 64;
/// The longest error text kept in an entry.
pub const MAX_ERROR_TEXT: usize = 500;

/// A ledger entry's state, as seed 004's tracker names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Admitted, never tried.
    Pending,
    /// Claimed by a deliverer (its lease says until when).
    InProgress,
    /// Tried and failed transiently; tried again at `nextAttemptAt`.
    Failed,
    /// Failed for good (a permanent failure, or too many attempts): held until replayed or
    /// discarded.
    Dead,
    /// The sink accepted the effect.
    Succeeded,
    /// The policy decided no effect, or an operator discarded the dead record.
    Ignored,
}

impl Status {
    pub const ALL: [Status; 6] = [
        Status::Pending,
        Status::InProgress,
        Status::Failed,
        Status::Dead,
        Status::Succeeded,
        Status::Ignored,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::InProgress => "in_progress",
            Status::Failed => "failed",
            Status::Dead => "dead",
            Status::Succeeded => "succeeded",
            Status::Ignored => "ignored",
        }
    }

    pub fn parse(text: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether the entry still waits for an effect (pending, in progress or failed).
    pub fn is_open(self) -> bool {
        matches!(self, Status::Pending | Status::InProgress | Status::Failed)
    }
}

/// What the effect is, as the policy decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Write the body under the target key, unless the sink holds a newer version.
    Upsert,
    /// Remove the target key, unless the sink holds a newer version.
    Delete,
    /// Publish the body (a broker).
    Publish,
    /// Post the body (a webhook).
    Post,
    /// No effect: the entry is `ignored`.
    Ignore,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Upsert => "upsert",
            Operation::Delete => "delete",
            Operation::Publish => "publish",
            Operation::Post => "post",
            Operation::Ignore => "ignore",
        }
    }
}

/// One effect a delivery makes for one record.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The key in the sink (the source document's `_id` by default).
    pub target: Bson,
    pub operation: Operation,
    /// The version the sink compares (the event's cluster time by default): an older version
    /// never overwrites a newer one.
    pub version: Option<Timestamp>,
    pub body: Document,
    /// Extra headers for sinks that take them (a webhook), already checked.
    pub headers: Vec<(String, String)>,
}

/// A ledger entry as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub id: String,
    /// The outbox record's `_id`.
    pub record: String,
    pub seq: i64,
    /// The lane: the canonical text of the source document's key (a record without one is a
    /// lane of its own).
    pub lane: String,
    pub status: Status,
    pub attempts: u32,
    pub owner: Option<String>,
    pub lease_until: Option<DateTime>,
    pub next_attempt: Option<DateTime>,
    pub error_class: Option<String>,
    pub error: Option<String>,
    pub created: Option<DateTime>,
    pub updated: Option<DateTime>,
    pub evidence: Option<Document>,
}

impl Entry {
    /// An entry read back from the ledger: `None` when it is not one this tool writes (a planted
    /// or damaged document is never delivered).
    pub fn from_document(document: &Document) -> Option<Entry> {
        let text = |key: &str| document.get_str(key).ok().map(str::to_string);
        let time = |key: &str| document.get_datetime(key).ok().copied();
        let seq = match document.get("seq")? {
            Bson::Int64(n) => *n,
            Bson::Int32(n) => i64::from(*n),
            _ => return None,
        };
        let attempts = match document.get("attempts") {
            Some(Bson::Int32(n)) => u32::try_from(*n).ok()?,
            Some(Bson::Int64(n)) => u32::try_from(*n).ok()?,
            None => 0,
            _ => return None,
        };
        Some(Entry {
            id: text("_id")?,
            record: text("record")?,
            seq,
            lane: text("lane")?,
            status: Status::parse(document.get_str("status").ok()?)?,
            attempts,
            owner: text("owner"),
            lease_until: time("leaseUntil"),
            next_attempt: time("nextAttemptAt"),
            error_class: text("lastErrorClass"),
            error: text("lastError"),
            created: time("createdAt"),
            updated: time("updatedAt"),
            evidence: document.get_document("evidence").ok().cloned(),
        })
    }

    /// Whether another deliverer holds the entry now.
    pub fn leased_by_other(&self, owner: &str, now: DateTime) -> bool {
        self.status == Status::InProgress
            && self.owner.as_deref() != Some(owner)
            && self.lease_until.is_some_and(|until| until > now)
    }

    /// Whether the entry may be tried now (open, due, and not leased by someone else).
    pub fn is_due(&self, owner: &str, now: DateTime) -> bool {
        self.status.is_open()
            && !self.leased_by_other(owner, now)
            && self.next_attempt.is_none_or(|at| at <= now)
    }
}

/// The ledger `_id` of `record`'s entry in `delivery`.
pub fn entry_id(delivery: &str, record: &str) -> String {
    format!("{delivery}/{record}")
}

/// The ledger `_id` of `delivery`'s position for `consumer` (an `@` no delivery name starts
/// with: never an entry's).
pub fn position_id(delivery: &str, consumer: &str) -> String {
    format!("@position/{delivery}/{consumer}")
}

/// The ledger `_id` of the newest version `delivery` removed from a projection's `key` (a
/// tombstone: an older upsert replayed later never brings the document back).
pub fn tombstone_id(delivery: &str, key: &str) -> String {
    format!("@tombstone/{delivery}/{key}")
}

/// A delivery name: 1-64 characters of `A-Z a-z 0-9 _ . -`, not starting with `.` or `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !name.starts_with(['.', '-']);
    if valid {
        Ok(())
    } else {
        Err(format!(
            "a delivery name is 1-{MAX_NAME} characters of A-Z, a-z, 0-9, '_', '.' and '-', not \
             starting with '.' or '-'"
        ))
    }
}

/// A version as a sortable number: a cluster time's seconds, then its increment.
pub fn version_number(version: Timestamp) -> i64 {
    (i64::from(version.time) << 32) | i64::from(version.increment)
}

/// Counts of a delivery's entries by status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub pending: u64,
    pub in_progress: u64,
    pub failed: u64,
    pub dead: u64,
    pub succeeded: u64,
    pub ignored: u64,
}

impl Counts {
    pub fn add(&mut self, status: Status, n: u64) {
        let slot = match status {
            Status::Pending => &mut self.pending,
            Status::InProgress => &mut self.in_progress,
            Status::Failed => &mut self.failed,
            Status::Dead => &mut self.dead,
            Status::Succeeded => &mut self.succeeded,
            Status::Ignored => &mut self.ignored,
        };
        *slot += n;
    }

    /// Entries still waiting for an effect.
    pub fn open(&self) -> u64 {
        self.pending + self.in_progress + self.failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn statuses_read_back_as_written() {
        for status in Status::ALL {
            assert_eq!(Status::parse(status.as_str()), Some(status));
        }
        assert_eq!(Status::parse("done"), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("default").is_ok());
        assert!(check_name("search-projection_2.v1").is_ok());
        for bad in ["", ".x", "-x", "a/b", "@position", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_planted_entry_is_not_one() {
        let good = doc! {
            "_id": "d/c/1", "record": "c/1", "seq": 3_i64, "lane": "{\"_id\": 1}",
            "status": "pending", "attempts": 0,
        };
        let entry = Entry::from_document(&good).expect("an entry");
        assert_eq!(entry.seq, 3);
        assert!(entry.is_due("me", DateTime::now()));
        for (key, value) in [
            ("status", Bson::String("done".into())),
            ("seq", Bson::String("3".into())),
            ("attempts", Bson::Int32(-1)),
            ("record", Bson::Int32(1)),
        ] {
            let mut bad = good.clone();
            bad.insert(key, value);
            assert_eq!(Entry::from_document(&bad), None, "{key}");
        }
    }

    #[test]
    fn a_lease_of_another_owner_holds_the_entry_until_it_ends() {
        let now = DateTime::now();
        let later = DateTime::from_millis(now.timestamp_millis() + 60_000);
        let earlier = DateTime::from_millis(now.timestamp_millis() - 1);
        let mut entry = Entry::from_document(&doc! {
            "_id": "d/c/1", "record": "c/1", "seq": 1_i64, "lane": "k",
            "status": "in_progress", "attempts": 1, "owner": "other", "leaseUntil": later,
        })
        .expect("an entry");
        assert!(!entry.is_due("me", now));
        assert!(entry.is_due("other", now));
        entry.lease_until = Some(earlier);
        assert!(entry.is_due("me", now));
        entry.status = Status::Failed;
        entry.next_attempt = Some(later);
        assert!(!entry.is_due("me", now));
    }

    #[test]
    fn versions_sort_as_cluster_times() {
        let a = version_number(Timestamp {
            time: 10,
            increment: 5,
        });
        let b = version_number(Timestamp {
            time: 11,
            increment: 0,
        });
        assert!(a < b);
    }
}
