//! The consumer's state and the one write that changes it: the checkpoint compare-and-set
//! together with the outbox and quarantine records, atomically.

use bson::{Bson, DateTime, Document, RawDocumentBuf};

use super::checkpoint::{CONFIG_CHANGES_KEPT, Claim, Mode, PolicyBinding};
use super::deployment::Consumer;
use super::lease::Lease;

mod records;
pub use records::{
    Lookup, admit_events, decode_record, holds_fragments, lookups, record_id, record_ids,
};

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
    /// The policy that decided the records, recorded in the checkpoint with them (`policy`).
    /// `None` for a move that holds no decision (a watermark, a tool's write).
    pub policy: Option<&'a PolicyBinding>,
}

impl Commit<'_> {
    /// Whether the commit writes a fragment of a split event.
    pub fn holds_fragments(&self) -> bool {
        holds_fragments(&self.outbox) || holds_fragments(&self.quarantine)
    }
}

/// The checkpoint field (`true`) of a consumer that has written a split event's records: its
/// events may be held in fragments, under `_id`s other than their key.
pub const SPLIT_EVENTS_WRITTEN: &str = "splitEventsWritten";

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
    /// The IDs (`<consumer>/<id>`) of events whose records the store already held (under the
    /// same ID, whole or in fragments, for the same event): not written again. A consumer whose
    /// checkpoint was moved back meets them.
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
    /// An event whose records are already stored under its ID for the same event, split the same
    /// way or not (see [`admit_events`]), is left as it is and reported in
    /// [`Applied::duplicates`]; a record of another event there fails the whole commit with
    /// [`CommitError::Duplicate`]. A commit holding a fragment of a split event also sets the
    /// checkpoint's [`SPLIT_EVENTS_WRITTEN`].
    fn commit(&self, commit: &Commit<'_>) -> Result<Applied, CommitError>;
    /// Binds the checkpoint to a run (its lease and stream configuration) if its revision is
    /// still the one the run read, else [`CommitError::Conflict`]; increments the revision.
    fn claim(&self, consumer: &str, claim: &Claim) -> Result<(), CommitError>;
    /// Sets the end of `owner`'s lease to `at`, if it still holds it; nothing otherwise. A run
    /// gives its lease back with the epoch.
    fn release(&self, consumer: &str, owner: &str, at: DateTime) -> Result<(), CommitError>;
    /// Gives the lease back as [`CheckpointStore::release`] does and keeps `record` in the run
    /// history, in the same command where the store can. The record is the store's to keep or
    /// lose: a record that cannot be written is logged, never an error, so a run that committed
    /// cannot fail on it. A store without a history only releases.
    fn release_recording(
        &self,
        consumer: &str,
        owner: &str,
        at: DateTime,
        record: &crate::history::RunRecord,
    ) -> Result<(), CommitError> {
        let _ = record;
        self.release(consumer, owner, at)
    }
    /// Extends `owner`'s lease to `until` (a run that reads without committing keeps it);
    /// [`CommitError::Conflict`] when another owner holds it now, where the store can tell (by
    /// default it cannot: the renewal is a release to a later end).
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
pub fn compare_and_set(stored: &Document, commit: &Commit<'_>) -> Result<Document, CommitError> {
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
    if let Some(policy) = commit.policy {
        updated.insert("policy", policy.document());
    }
    if commit.holds_fragments() {
        updated.insert(SPLIT_EVENTS_WRITTEN, true);
    }
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
pub fn apply_claim(stored: &Document, claim: &Claim) -> Result<Document, CommitError> {
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
pub fn apply_release(stored: &Document, owner: &str, at: DateTime) -> Option<Document> {
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

#[cfg(test)]
mod tests;
