//! The consumer's state and the one write that changes it: the checkpoint compare-and-set
//! together with the outbox and quarantine records, atomically.

use bson::{Bson, DateTime, Document, RawDocument, RawDocumentBuf};

use super::checkpoint::{CONFIG_CHANGES_KEPT, Claim, Mode};
use super::deployment::Consumer;
use super::lease::Lease;

/// One atomic step: move the checkpoint from `expected` to `next`, insert the outbox and
/// quarantine records. The records are encoded as they are written: a change event's bytes reach
/// the store as the server sent them, and a record's size is its length.
#[derive(Clone, Debug)]
pub struct Commit<'a> {
    pub consumer: &'a Consumer,
    pub expected: Option<&'a Document>,
    pub next: &'a Document,
    pub mode: Mode,
    pub outbox: Vec<RawDocumentBuf>,
    pub quarantine: Vec<RawDocumentBuf>,
    /// The run's lease: the checkpoint must still be held by its owner, and the commit renews
    /// it. `None` for a caller that holds none (tests, tools).
    pub lease: Option<&'a Lease>,
}

/// Why a write did not apply. Nothing was written.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CommitError {
    /// The checkpoint is not at the expected token (or source) any more.
    #[error("checkpoint compare-and-set missed")]
    Conflict,
    /// The outbox or the quarantine already holds a record with this `_id` for another event
    /// (a different token, consumer or source). A record with the same `_id` for the same
    /// hand-off is a duplicate the store suppresses, not an error.
    #[error("a record {0} already exists for another event")]
    Duplicate(String),
    /// The store failed; the transaction did not commit.
    #[error("{0}")]
    Unavailable(String),
    /// The outbox or quarantine record with this `_id` is over the store's document limit
    /// (MongoDB's 16 MiB); the transaction did not commit.
    #[error("the record {0} is over the 16 MiB document limit")]
    TooLarge(String),
    /// The store refused the operation for this user (a missing privilege); retrying changes
    /// nothing.
    #[error("{0}")]
    Unauthorized(String),
}

/// What a commit did besides moving the checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The `_id`s of records the store already held for the same event (the same `_id` and the
    /// same token): not written again. A consumer whose checkpoint was moved back meets them.
    pub duplicates: Vec<String>,
}

/// A consumer's state, in commit order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dump {
    pub checkpoint: Option<Document>,
    pub outbox: Vec<Document>,
    pub quarantine: Vec<Document>,
}

/// The checkpoint, the outbox and the quarantine.
pub trait CheckpointStore: Send + Sync {
    /// Creates the checkpoint with `initial` if it is missing (`$setOnInsert`), then returns it.
    fn ensure_checkpoint(&self, consumer: &str, initial: Document)
    -> Result<Document, CommitError>;
    /// Compare-and-set on `{_id, token: expected, source}` plus the record inserts, atomically.
    /// A record whose `_id` is already stored with the same event token (see [`same_hand_off`])
    /// is left as it is and reported in [`Applied::duplicates`]; with another token the whole
    /// commit fails with [`CommitError::Duplicate`].
    fn commit(&self, commit: &Commit<'_>) -> Result<Applied, CommitError>;
    /// Binds the checkpoint to a run (its lease and stream configuration) if its revision is
    /// still the one the run read, else [`CommitError::Conflict`]; increments the revision.
    fn claim(&self, consumer: &str, claim: &Claim) -> Result<(), CommitError>;
    /// Sets the end of `owner`'s lease to `at`, if it still holds it; nothing otherwise. A run
    /// gives its lease back with the epoch.
    fn release(&self, consumer: &str, owner: &str, at: DateTime) -> Result<(), CommitError>;
    /// Extends `owner`'s lease to `until` (a run that reads without committing keeps it).
    fn renew(&self, consumer: &str, owner: &str, until: DateTime) -> Result<(), CommitError> {
        self.release(consumer, owner, until)
    }
    /// The checkpoint document and the records of `consumer`, in commit order.
    fn dump(&self, consumer: &str) -> Result<Dump, CommitError>;
    /// How many times this store retried a transaction or its commit (a transient error, an
    /// unknown commit result), over its lifetime.
    fn transaction_retries(&self) -> u32 {
        0
    }
}

/// The compare-and-set both embedded stores apply: the filter `{_id, token: expected, source}`
/// with MongoDB's equality (`token: null` also matches a missing token), then
/// `$set: {token: next, mode}`. Returns the updated checkpoint.
pub(crate) fn compare_and_set(
    stored: &Document,
    commit: &Commit<'_>,
) -> Result<Document, CommitError> {
    let token_matches = match (stored.get("token"), commit.expected) {
        (None | Some(bson::Bson::Null), None) => true,
        (Some(bson::Bson::Document(saved)), Some(expected)) => same_token(saved, expected),
        _ => false,
    };
    let source_matches = stored.get_str("source").ok() == Some(commit.consumer.source.as_str());
    let owner_matches = commit
        .lease
        .is_none_or(|lease| stored.get_str("owner").ok() == Some(lease.owner.as_str()));
    if !token_matches || !source_matches || !owner_matches {
        return Err(CommitError::Conflict);
    }
    let mut updated = stored.clone();
    updated.insert("token", commit.next.clone());
    updated.insert("mode", commit.mode.as_str());
    if let Some(lease) = commit.lease {
        updated.insert("leaseUntil", lease.until(DateTime::now()));
    }
    updated.insert("revision", revision(stored).unwrap_or(0) + 1);
    Ok(updated)
}

/// A stored checkpoint's revision, `None` when it has none.
fn revision(stored: &Document) -> Option<i64> {
    match stored.get("revision") {
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        _ => None,
    }
}

/// The claim both embedded stores apply: the revision must be the one the run read; the
/// claim's fields are set, the revision incremented and an accepted configuration change
/// appended to `configChanges` (the last [`CONFIG_CHANGES_KEPT`] kept).
pub(crate) fn apply_claim(stored: &Document, claim: &Claim) -> Result<Document, CommitError> {
    let seen = revision(stored);
    if seen != claim.seen_revision {
        return Err(CommitError::Conflict);
    }
    let mut updated = stored.clone();
    for (key, value) in &claim.set {
        updated.insert(key.clone(), value.clone());
    }
    updated.insert("revision", seen.unwrap_or(0) + 1);
    if let Some(change) = &claim.change {
        let mut changes = match updated.get("configChanges") {
            Some(Bson::Array(changes)) => changes.clone(),
            _ => Vec::new(),
        };
        changes.push(Bson::Document(change.clone()));
        let kept = CONFIG_CHANGES_KEPT as usize;
        if changes.len() > kept {
            changes.drain(..changes.len() - kept);
        }
        updated.insert("configChanges", changes);
    }
    Ok(updated)
}

/// The release both embedded stores apply: `None` when `owner` does not hold the checkpoint.
pub(crate) fn apply_release(stored: &Document, owner: &str, at: DateTime) -> Option<Document> {
    if stored.get_str("owner").ok() != Some(owner) {
        return None;
    }
    let mut updated = stored.clone();
    updated.insert("leaseUntil", at);
    updated.insert("revision", revision(stored).unwrap_or(0) + 1);
    Some(updated)
}

/// Whether the saved token is the expected one: the same BSON. `Document` equality is not enough,
/// since a token holding a NaN double would never equal itself (a server's equality match, and
/// PyMongo's, take NaN as equal to NaN).
fn same_token(saved: &Document, expected: &Document) -> bool {
    saved == expected || matches!((saved.to_vec(), expected.to_vec()), (Ok(a), Ok(b)) if a == b)
}

/// The event token a record carries: its `token` field (quarantine and shaped outbox records),
/// else its raw event's `_id` (the baseline's outbox record).
pub fn record_token(record: &Document) -> Option<&Document> {
    record
        .get_document("token")
        .or_else(|_| {
            record
                .get_document("event")
                .and_then(|e| e.get_document("_id"))
        })
        .ok()
}

/// Whether a stored record and a new one with the same `_id` hand off the same event: both
/// carry a token, the tokens are the same BSON, and both name the same consumer and source.
/// Such a new record is a duplicate to suppress; anything else under the same `_id` (a record
/// planted with a known token for another consumer or source included) is a conflict.
fn same_hand_off(stored: &Document, new: &Document) -> bool {
    let same_owner = ["consumer", "source"]
        .iter()
        .all(|key| matches!((stored.get_str(key), new.get_str(key)), (Ok(a), Ok(b)) if a == b));
    same_owner
        && matches!((record_token(stored), record_token(new)), (Some(a), Some(b)) if same_token(a, b))
}

/// What a store does with a new record under `id`, given the record it holds there, if any:
/// insert it (`true`), or leave it out as a duplicate of the same hand-off (`false`, its `_id`
/// added to `duplicates`). A record of another event there refuses the commit.
pub fn admit(
    id: &str,
    stored: Option<&Document>,
    new: &RawDocument,
    duplicates: &mut Vec<String>,
) -> Result<bool, CommitError> {
    let Some(stored) = stored else {
        return Ok(true);
    };
    let new = decode_record(new)?;
    if same_hand_off(stored, &new) {
        duplicates.push(id.to_string());
        Ok(false)
    } else {
        Err(CommitError::Duplicate(id.to_string()))
    }
}

/// A record decoded, for a store that keeps documents.
pub fn decode_record(record: &RawDocument) -> Result<Document, CommitError> {
    Document::try_from(record)
        .map_err(|_| CommitError::Unavailable("a record that is not valid BSON".into()))
}

/// A record's `_id`, which must be a string.
pub fn record_id(record: &RawDocument) -> Result<&str, CommitError> {
    record
        .get_str("_id")
        .map_err(|_| CommitError::Unavailable("a record without a string _id".into()))
}

/// The `_id`s of records, which must be strings, each record checked to be well-formed BSON (an
/// embedded store keeps the bytes it is given, and a record it cannot read back would fail every
/// later read of the consumer).
pub(crate) fn record_ids(records: &[RawDocumentBuf]) -> Result<Vec<String>, CommitError> {
    records
        .iter()
        .map(|record| {
            super::stream::check_bson(record).map_err(|why| {
                CommitError::Unavailable(format!("a record is not valid BSON: {why}"))
            })?;
            record_id(record).map(str::to_string)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_record_is_the_same_hand_off_only_with_the_same_token() {
        let raw = |data: &str| {
            doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "event": { "_id": { "_data": data } } }
        };
        let shaped = |data: &str| {
            doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "token": { "_data": data }, "payload": {} }
        };
        assert!(same_hand_off(&raw("82a"), &raw("82a")));
        assert!(same_hand_off(&raw("82a"), &shaped("82a")));
        assert!(!same_hand_off(&raw("82a"), &raw("82b")));
        assert!(!same_hand_off(&shaped("82a"), &shaped("82b")));
        // A record planted with the right token for another consumer or source is not the same.
        let mut planted = raw("82a");
        planted.insert("consumer", "other");
        assert!(!same_hand_off(&planted, &raw("82a")));
        let mut planted = shaped("82a");
        planted.remove("source");
        assert!(!same_hand_off(&planted, &shaped("82a")));
        // A record without a token (written by something else) is never taken as the same.
        assert!(!same_hand_off(&doc! { "_id": "c/1" }, &raw("82a")));
        assert!(!same_hand_off(
            &raw("82a"),
            &doc! { "_id": "c/1", "event": "x" }
        ));
    }

    #[test]
    fn a_token_holding_nan_passes_the_compare_and_set() {
        let consumer = Consumer {
            consumer: "c".into(),
            source: "db.coll".into(),
        };
        let token = doc! { "_data": "8201", "n": f64::NAN, "a": [f64::NAN] };
        let next = doc! { "_data": "8202" };
        let stored =
            doc! { "_id": "c", "source": "db.coll", "token": token.clone(), "mode": "resumeAfter" };
        let commit = |expected: &Document| {
            compare_and_set(
                &stored,
                &Commit {
                    consumer: &consumer,
                    expected: Some(expected),
                    next: &next,
                    mode: Mode::ResumeAfter,
                    outbox: vec![],
                    quarantine: vec![],
                    lease: None,
                },
            )
        };
        let updated = commit(&token.clone()).expect("the saved token is the expected one");
        assert_eq!(updated.get_document("token").unwrap(), &next);
        let other = doc! { "_data": "8201", "n": f64::NAN, "a": [1.0] };
        assert!(matches!(commit(&other), Err(CommitError::Conflict)));
    }

    #[test]
    fn a_commit_with_a_lease_needs_its_owner_renews_it_and_counts_the_revision() {
        let consumer = Consumer {
            consumer: "c".into(),
            source: "db.coll".into(),
        };
        let lease = Lease {
            owner: "me".into(),
            duration: std::time::Duration::from_secs(60),
        };
        let next = doc! { "_data": "8202" };
        let stored = doc! {
            "_id": "c", "source": "db.coll", "token": null, "mode": "resumeAfter",
            "revision": 4_i64, "owner": "me", "leaseUntil": DateTime::from_millis(0),
        };
        let commit = Commit {
            consumer: &consumer,
            expected: None,
            next: &next,
            mode: Mode::ResumeAfter,
            outbox: vec![],
            quarantine: vec![],
            lease: Some(&lease),
        };
        let before = DateTime::now();
        let updated = compare_and_set(&stored, &commit).unwrap();
        assert_eq!(updated.get_i64("revision").unwrap(), 5);
        assert!(*updated.get_datetime("leaseUntil").unwrap() >= lease.until(before));
        let mut taken = stored.clone();
        taken.insert("owner", "someone else");
        assert!(matches!(
            compare_and_set(&taken, &commit),
            Err(CommitError::Conflict)
        ));
        // A checkpoint the baseline wrote has no revision: the first write makes it 1.
        let mut baseline = stored.clone();
        baseline.remove("revision");
        let without_lease = Commit {
            lease: None,
            ..commit.clone()
        };
        let updated = compare_and_set(&baseline, &without_lease).unwrap();
        assert_eq!(updated.get_i64("revision").unwrap(), 1);
    }

    #[test]
    fn a_claim_needs_the_revision_it_read_and_keeps_the_last_changes() {
        let stored = doc! { "_id": "c", "source": "db.coll", "token": null, "revision": 2_i64 };
        let claim = |seen: Option<i64>, n: i32| Claim {
            seen_revision: seen,
            set: doc! { "owner": "me", "leaseUntil": DateTime::from_millis(5) },
            change: Some(doc! { "n": n }),
        };
        assert!(matches!(
            apply_claim(&stored, &claim(Some(1), 0)),
            Err(CommitError::Conflict)
        ));
        assert!(matches!(
            apply_claim(&stored, &claim(None, 0)),
            Err(CommitError::Conflict)
        ));
        let mut current = stored.clone();
        for n in 0..25 {
            let seen = revision(&current);
            current = apply_claim(&current, &claim(seen, n)).unwrap();
        }
        assert_eq!(current.get_i64("revision").unwrap(), 27);
        assert_eq!(current.get_str("owner").unwrap(), "me");
        let changes = current.get_array("configChanges").unwrap();
        assert_eq!(changes.len(), CONFIG_CHANGES_KEPT as usize);
        assert_eq!(changes[0], Bson::Document(doc! { "n": 5 }));
        // A baseline checkpoint (no revision) is claimed from "none".
        let mut baseline = stored.clone();
        baseline.remove("revision");
        let claimed = apply_claim(&baseline, &claim(None, 0)).unwrap();
        assert_eq!(claimed.get_i64("revision").unwrap(), 1);
        // Only the owner releases.
        let at = DateTime::from_millis(9);
        assert!(apply_release(&claimed, "other", at).is_none());
        let released = apply_release(&claimed, "me", at).unwrap();
        assert_eq!(released.get_datetime("leaseUntil").unwrap(), &at);
        assert_eq!(released.get_i64("revision").unwrap(), 2);
    }
}
