//! A record's identity: its ID, the event it holds (whole, or one fragment of a split event) and
//! the event's token, so that an event handed off whole and again in fragments (or the other
//! way) is recognised as the one event it is.

use bson::{Document, RawDocument, RawDocumentBuf};

use super::{CommitError, same_token};

/// The event token a record carries: its `token` field (quarantine and shaped outbox records),
/// else its raw event's `_id` (the baseline's outbox record).
fn raw_record_token(record: &RawDocument) -> Option<&RawDocument> {
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
pub(super) fn same_event_token(a: &Document, b: &Document) -> bool {
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
        let token = raw_record_token(record).and_then(|t| Document::try_from(t).ok());
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

    /// The identity of a record a store already holds (one it cannot read has none).
    fn of_stored(record: &Document) -> Option<Identity> {
        let raw = RawDocumentBuf::try_from(record).ok()?;
        Identity::of(&raw).ok()
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
            crate::stream::check_bson(record).map_err(|why| {
                CommitError::Unavailable(format!("a record is not valid BSON: {why}"))
            })?;
            record_id(record).map(str::to_string)
        })
        .collect()
}
