//! The consumer's state and the one write that changes it: the checkpoint compare-and-set
//! together with the outbox and quarantine records, atomically.

use bson::{Bson, DateTime, Document, RawDocument, RawDocumentBuf};

use super::checkpoint::{CONFIG_CHANGES_KEPT, Claim, Mode, PolicyBinding};
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

/// Whether two tokens name the same event: the same token, or the tokens of a whole event and of
/// one of its fragments. A fragment's resume token is its event's with the fragment's number
/// appended before the KeyString's closing byte, so the whole event's `_data` less its last byte
/// begins the fragment's (the test server appends the number the same way). The fragments of one
/// event are numbered alike however it was split: fragment `k`'s token is the same in every split.
fn same_event_token(a: &Document, b: &Document) -> bool {
    if same_token(a, b) {
        return true;
    }
    let (Ok(a), Ok(b)) = (a.get_str("_data"), b.get_str("_data")) else {
        return false;
    };
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    // Less its last byte, the shorter still holds more than `82` and the cluster time.
    short.len() >= 20
        && short.len() < long.len()
        && long
            .as_bytes()
            .starts_with(&short.as_bytes()[..short.len() - 2])
}

/// The fragment a record holds: `(key, k, n)` when its `_id` is `<key>.<k>of<n>` and its event
/// is fragment `k` of `n` of a split event (`split`, its `splitEvent: {fragment: k, of: n}`). Any
/// other record (a whole event's, a policy-shaped one, an invalidation's marker) is its `_id`'s
/// alone, whatever that `_id` looks like.
fn fragment_id(id: &str, split: Option<(i64, i64)>) -> Option<(&str, u32, u32)> {
    fragment_suffix(id).filter(|(_, k, n)| split == Some((i64::from(*k), i64::from(*n))))
}

/// `(key, k, n)` of an `_id` `<key>.<k>of<n>` with `1 <= k <= n`.
fn fragment_suffix(id: &str) -> Option<(&str, u32, u32)> {
    let (key, part) = id.rsplit_once('.')?;
    let (k, n) = part.split_once("of")?;
    let (k, n) = (k.parse::<u32>().ok()?, n.parse::<u32>().ok()?);
    let canonical = format!("{k}of{n}") == part;
    (canonical && !key.is_empty() && (1..=n).contains(&k)).then_some((key, k, n))
}

/// `splitEvent: {fragment, of}` of a record's event.
fn raw_split(record: &RawDocument) -> Option<(i64, i64)> {
    let split = record
        .get_document("event")
        .ok()?
        .get_document("splitEvent")
        .ok()?;
    let number = |key| whole_number(split.get(key).ok().flatten());
    Some((number("fragment")?, number("of")?))
}

/// A whole number of a document, as BSON holds it.
fn whole_number(value: Option<bson::RawBsonRef<'_>>) -> Option<i64> {
    match value? {
        bson::RawBsonRef::Int32(n) => Some(n.into()),
        bson::RawBsonRef::Int64(n) => Some(n),
        _ => None,
    }
}

/// What the duplicate check reads of a record.
#[derive(Debug)]
struct Identity {
    id: String,
    /// The ID its event is handed off under: its `_id`, less `.<k>of<n>` for a fragment.
    key: String,
    /// `k` of fragment `k` of `n`, and `n`.
    fragment: Option<(u32, u32)>,
    token: Option<Document>,
    consumer: Option<String>,
    source: Option<String>,
}

impl Identity {
    fn of(record: &RawDocument) -> Result<Identity, CommitError> {
        let id = record_id(record)?;
        let token = record
            .get_document("token")
            .or_else(|_| {
                record
                    .get_document("event")
                    .and_then(|e| e.get_document("_id"))
            })
            .ok()
            .and_then(|t| Document::try_from(t).ok());
        let split = fragment_suffix(id).and_then(|_| raw_split(record));
        let text = |key| record.get_str(key).ok().map(str::to_string);
        Ok(Identity::new(
            id,
            split,
            token,
            text("consumer"),
            text("source"),
        ))
    }

    fn of_stored(record: &Document) -> Option<Identity> {
        let id = record.get_str("_id").ok()?;
        let split = record
            .get_document("event")
            .and_then(|e| e.get_document("splitEvent"))
            .ok()
            .and_then(|s| {
                let number = |key| match s.get(key) {
                    Some(Bson::Int32(n)) => Some(i64::from(*n)),
                    Some(Bson::Int64(n)) => Some(*n),
                    _ => None,
                };
                Some((number("fragment")?, number("of")?))
            });
        let text = |key| record.get_str(key).ok().map(str::to_string);
        Some(Identity::new(
            id,
            split,
            record_token(record).cloned(),
            text("consumer"),
            text("source"),
        ))
    }

    fn new(
        id: &str,
        split: Option<(i64, i64)>,
        token: Option<Document>,
        consumer: Option<String>,
        source: Option<String>,
    ) -> Identity {
        let (key, fragment) = match fragment_id(id, split) {
            Some((key, k, n)) => (key.to_string(), Some((k, n))),
            None => (id.to_string(), None),
        };
        Identity {
            id: id.to_string(),
            key,
            fragment,
            token,
            consumer,
            source,
        }
    }
}

/// Where a store looks for what it holds of a commit's events before inserting their records:
/// each event's key (`<consumer>/<id>`), and the `_id`s of fragments under it, from
/// `fragments.start` (included) to `fragments.end` (excluded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub key: String,
    pub fragments: std::ops::Range<String>,
}

/// The [`Lookup`]s of `records`, one per event key.
pub fn lookups(records: &[RawDocumentBuf]) -> Result<Vec<Lookup>, CommitError> {
    let mut keys = std::collections::HashSet::new();
    let mut found = Vec::new();
    for record in records {
        let identity = Identity::of(record)?;
        if keys.insert(identity.key.clone()) {
            found.push(Lookup {
                fragments: format!("{}.", identity.key)..format!("{}/", identity.key),
                key: identity.key,
            });
        }
    }
    Ok(found)
}

/// Whether `records` hold a fragment of a split event.
pub fn holds_fragments(records: &[RawDocumentBuf]) -> bool {
    records.iter().any(|record| {
        record
            .get_str("_id")
            .ok()
            .and_then(fragment_suffix)
            .is_some_and(|(_, k, n)| raw_split(record) == Some((i64::from(k), i64::from(n))))
    })
}

/// Which of a commit's `records` (of one collection, in commit order) a store inserts, given
/// `stored`: what it holds under the `_id`s of their [`lookups`].
///
/// An event is one record, or one per fragment of a split event (`<key>.<k>of<n>`), and the store
/// may hold it under any split: whole, or in another number of fragments. When every record the
/// store holds under the event's key (the key itself, or its fragments) is of the same event —
/// the same token, or the tokens of the event whole and of its fragments (see
/// [`same_event_token`]), for the same consumer and source — none of the event's records is
/// inserted and its key is added to `duplicates`. A record held under the key for another event
/// (a record planted with a known token for another consumer or source included), or one held
/// under the `_id` of one of the event's records for another key, refuses the commit.
pub fn admit_events(
    records: &[RawDocumentBuf],
    stored: &[Document],
    duplicates: &mut Vec<String>,
) -> Result<Vec<bool>, CommitError> {
    let new = records
        .iter()
        .map(|record| Identity::of(record))
        .collect::<Result<Vec<_>, _>>()?;
    let held: Vec<Identity> = stored.iter().filter_map(Identity::of_stored).collect();
    let mut by_id = std::collections::HashMap::new();
    let mut by_key: std::collections::HashMap<&str, Vec<&Identity>> =
        std::collections::HashMap::new();
    for identity in &held {
        by_id.insert(identity.id.as_str(), identity);
        by_key
            .entry(identity.key.as_str())
            .or_default()
            .push(identity);
    }
    let mut insert = vec![true; new.len()];
    let mut start = 0;
    while start < new.len() {
        // The event's records: one, or its fragments 1..n in order.
        let first = &new[start];
        let mut end = start + 1;
        if let Some((1, n)) = first.fragment {
            while end < new.len()
                && new[end].key == first.key
                && new[end].fragment == Some((u32::try_from(end - start + 1).unwrap_or(0), n))
            {
                end += 1;
            }
        }
        let event = &new[start..end];
        for record in event {
            if by_id
                .get(record.id.as_str())
                .is_some_and(|h| h.key != first.key)
            {
                return Err(CommitError::Duplicate(record.id.clone()));
            }
        }
        if let Some(members) = by_key.get(first.key.as_str()) {
            // What the store holds of one split, or whole, is one event.
            let mut splits: Vec<(Option<u32>, Vec<&Identity>)> = Vec::new();
            for member in members {
                let of = member.fragment.map(|(_, n)| n);
                match splits.iter_mut().find(|(n, _)| *n == of) {
                    Some((_, unit)) => unit.push(member),
                    None => splits.push((of, vec![member])),
                }
            }
            for (_, unit) in &splits {
                let owned = unit
                    .iter()
                    .all(|h| h.consumer.is_some() && h.consumer == first.consumer)
                    && unit
                        .iter()
                        .all(|h| h.source.is_some() && h.source == first.source);
                if !owned || !unit.iter().any(|h| same_event(h, event)) {
                    return Err(CommitError::Duplicate(unit[0].id.clone()));
                }
            }
            insert[start..end].iter_mut().for_each(|i| *i = false);
            duplicates.push(first.key.clone());
        }
        start = end;
    }
    Ok(insert)
}

/// Whether a record held under an event's key shows it is of that event (given by its records):
/// its token is the one of the event's record for the same fragment, or names the same event as
/// the event's first record's.
fn same_event(held: &Identity, event: &[Identity]) -> bool {
    let Some(token) = &held.token else {
        return false;
    };
    let fragment = |identity: &Identity| identity.fragment.map(|(k, _)| k);
    event.iter().any(|record| {
        fragment(record) == fragment(held)
            && record.token.as_ref().is_some_and(|t| same_token(token, t))
    }) || event[0]
        .token
        .as_ref()
        .is_some_and(|t| same_event_token(token, t))
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
pub fn record_ids(records: &[RawDocumentBuf]) -> Result<Vec<String>, CommitError> {
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

    /// A token of the test server's shape: `82`, a cluster time, the version, the operation's
    /// index and the kind; a fragment's appends its 0-based number.
    fn event_token(op: u32, fragment: Option<u32>) -> String {
        let whole = format!("82634F1A2B0000000101{op:08X}00");
        match fragment {
            Some(n) => format!("{whole}{n:08X}"),
            None => whole,
        }
    }

    /// The record of a whole event handed off under `c/<id>`.
    fn whole(id: &str, op: u32) -> Document {
        doc! {
            "_id": format!("c/{id}"), "consumer": "c", "source": "db.coll",
            "event": { "_id": { "_data": event_token(op, None) }, "operationType": "update" },
        }
    }

    /// The records of event `op` split in `n` fragments, handed off under `c/<id>`.
    fn split(id: &str, op: u32, n: u32) -> Vec<Document> {
        (1..=n)
            .map(|k| {
                doc! {
                    "_id": format!("c/{id}.{k}of{n}"), "consumer": "c", "source": "db.coll",
                    "event": {
                        "_id": { "_data": event_token(op, Some(k - 1)) },
                        "splitEvent": { "fragment": k as i32, "of": n as i32 },
                    },
                }
            })
            .collect()
    }

    fn raw(records: &[Document]) -> Vec<RawDocumentBuf> {
        records
            .iter()
            .map(|r| RawDocumentBuf::try_from(r).unwrap())
            .collect()
    }

    /// What a store holding `stored` does with `new`: the records it inserts, and the events it
    /// counts as duplicates.
    fn admitted(
        new: &[Document],
        stored: &[Document],
    ) -> Result<(Vec<bool>, Vec<String>), CommitError> {
        let mut duplicates = Vec::new();
        let insert = admit_events(&raw(new), stored, &mut duplicates)?;
        Ok((insert, duplicates))
    }

    #[test]
    fn a_record_is_the_same_hand_off_only_with_the_same_token() {
        let raw = |data: &str| {
            doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "event": { "_id": { "_data": data } } }
        };
        let shaped = |data: &str| {
            doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "token": { "_data": data }, "payload": {} }
        };
        let same = |stored: Document, new: Document| match admitted(&[new], &[stored]) {
            Ok((insert, duplicates)) => {
                assert_eq!(insert, [false]);
                assert_eq!(duplicates, ["c/1"]);
                true
            }
            Err(CommitError::Duplicate(id)) => {
                assert_eq!(id, "c/1");
                false
            }
            Err(other) => panic!("{other}"),
        };
        assert!(same(raw("82a"), raw("82a")));
        assert!(same(raw("82a"), shaped("82a")));
        assert!(!same(raw("82a"), raw("82b")));
        assert!(!same(shaped("82a"), shaped("82b")));
        // A record planted with the right token for another consumer or source is not the same.
        let mut planted = raw("82a");
        planted.insert("consumer", "other");
        assert!(!same(planted, raw("82a")));
        let mut planted = shaped("82a");
        planted.remove("source");
        assert!(!same(planted, shaped("82a")));
        // A record without a token (written by something else) is never taken as the same.
        assert!(!same(
            doc! { "_id": "c/1", "consumer": "c", "source": "db.coll" },
            raw("82a")
        ));
        assert!(!same(
            raw("82a"),
            doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "event": "x" }
        ));
        // Nothing held: every record is inserted.
        assert_eq!(
            admitted(&split("X", 1, 3), &[]).unwrap(),
            (vec![true; 3], vec![])
        );
    }

    #[test]
    fn an_event_held_whole_or_split_otherwise_is_one_duplicate() {
        let one = |n: usize| (vec![false; n], vec!["c/X".to_string()]);
        // Split in 2, again in 3 (other options make it larger): fragment k's token is the same
        // in both splits.
        assert_eq!(
            admitted(&split("X", 1, 3), &split("X", 1, 2)).unwrap(),
            one(3)
        );
        assert_eq!(
            admitted(&split("X", 1, 2), &split("X", 1, 3)).unwrap(),
            one(2)
        );
        // Split, then whole (smaller now), and the converse.
        assert_eq!(
            admitted(&[whole("X", 1)], &split("X", 1, 2)).unwrap(),
            one(1)
        );
        assert_eq!(
            admitted(&split("X", 1, 2), &[whole("X", 1)]).unwrap(),
            one(2)
        );
        // The same split again.
        assert_eq!(
            admitted(&split("X", 1, 2), &split("X", 1, 2)).unwrap(),
            one(2)
        );
        // Held in several splits (written before splits were one event's): still one event.
        let mut held = split("X", 1, 2);
        held.extend(split("X", 1, 3));
        held.push(whole("X", 1));
        assert_eq!(admitted(&split("X", 1, 4), &held).unwrap(), one(4));
        // A policy-shaped record of a split event carries its first fragment's token.
        let mut shaped = whole("X", 1);
        shaped.remove("event");
        shaped.insert("token", doc! { "_data": event_token(1, Some(0)) });
        assert_eq!(
            admitted(&[whole("X", 1)], &[shaped.clone()]).unwrap(),
            one(1)
        );
        assert_eq!(
            admitted(&split("X", 1, 3), &[shaped.clone()]).unwrap(),
            one(3)
        );
        assert_eq!(admitted(&[shaped], &split("X", 1, 2)).unwrap(), one(1));
        // Events beside it are inserted, each counted on its own.
        let mut new = vec![whole("A", 7)];
        new.extend(split("X", 1, 2));
        new.push(whole("B", 8));
        let (insert, duplicates) = admitted(&new, &split("X", 1, 3)).unwrap();
        assert_eq!(insert, [true, false, false, true]);
        assert_eq!(duplicates, ["c/X"]);
    }

    #[test]
    fn another_event_held_under_an_events_id_in_any_split_refuses_the_commit() {
        let refused = |new: &[Document], held: &[Document]| match admitted(new, held) {
            Err(CommitError::Duplicate(id)) => id,
            other => panic!("{other:?}"),
        };
        // Event 2 under the ID event 1 was handed off with, split or whole.
        assert_eq!(refused(&[whole("X", 2)], &split("X", 1, 2)), "c/X.1of2");
        assert_eq!(refused(&split("X", 2, 3), &split("X", 1, 2)), "c/X.1of2");
        assert_eq!(refused(&split("X", 2, 2), &[whole("X", 1)]), "c/X");
        // One split of the same event and one of another: the other refuses it.
        let mut held = split("X", 1, 2);
        held.extend(split("X", 2, 3));
        assert_eq!(refused(&[whole("X", 1)], &held), "c/X.1of3");
        // Fragments planted for another consumer.
        let mut planted = split("X", 1, 2);
        planted[1].insert("consumer", "other");
        assert_eq!(refused(&[whole("X", 1)], &planted), "c/X.1of2");
        // A whole event whose ID reads like a fragment's is its own ID's: beside `c/X` it is
        // another event, and under a fragment's `_id` it refuses the split event.
        let mut lookalike = whole("X.1of2", 5);
        assert_eq!(
            admitted(&[whole("X", 1)], &[lookalike.clone()]).unwrap(),
            (vec![true], vec![])
        );
        assert_eq!(refused(&split("X", 1, 2), &[lookalike.clone()]), "c/X.1of2");
        lookalike.insert("_id", "c/X.01of2");
        assert_eq!(
            admitted(&split("X", 1, 2), &[lookalike]).unwrap(),
            (vec![true; 2], vec![])
        );
    }

    #[test]
    fn the_tokens_of_an_event_and_of_its_fragments_name_the_same_event() {
        let token = |data: String| doc! { "_data": data };
        let whole = token(event_token(1, None));
        let first = token(event_token(1, Some(0)));
        let second = token(event_token(1, Some(1)));
        assert!(same_event_token(&whole, &first));
        assert!(same_event_token(&second, &whole));
        assert!(same_event_token(&first, &first));
        // Two fragments are told apart; so are other events, whole or in fragments.
        assert!(!same_event_token(&first, &second));
        assert!(!same_event_token(&whole, &token(event_token(2, None))));
        assert!(!same_event_token(&whole, &token(event_token(2, Some(0)))));
        // MongoDB's layout: the fragment's number goes before the KeyString's closing `04`.
        let mongo = "82635019A0000000012B042C0100296E5A1004AB1154ACACD849A48C61756D70D3B21F4604";
        assert!(same_event_token(
            &token(format!("{mongo}04")),
            &token(format!("{mongo}2A04"))
        ));
        let other = mongo.replace("D3B21F46", "D3B21F47");
        assert!(!same_event_token(
            &token(format!("{other}04")),
            &token(format!("{mongo}2A04"))
        ));
        // Too short to hold a cluster time: only the same token is the same event.
        assert!(!same_event_token(
            &token("8201".into()),
            &token("820100".into())
        ));
        assert!(!same_event_token(&doc! { "_data": 1 }, &first));
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
                    policy: None,
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
            policy: None,
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
