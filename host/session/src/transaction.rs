//! Source transactions handed off whole.
//!
//! The events one MongoDB transaction wrote (one `lsid` and `txnNumber`) become visible in the
//! oplog at once and reach a change stream one after the other. Before the first of them is
//! delivered, the session reads the rest (up to [`MAX_SOURCE_TRANSACTION`]): each delivered
//! event then knows its place and the transaction's size, a run may read past `max_events` to
//! finish one, and a commit that ends inside one is held until the commit that ends it. A
//! transaction larger than the bound is delivered as it comes, its events without a size, and
//! may be committed in several transactions (counted and logged).

use bson::{Document, RawBsonRef, RawDocument, doc};
use sha2::{Digest, Sha256};

use super::{Delivered, EventView, Session};
use handoff_domain::token::canonical_text;

/// The most events of one source transaction read ahead and committed together.
pub const MAX_SOURCE_TRANSACTION: usize = 500;
/// How many source transactions read whole a session remembers, to tell one whose events
/// arrive apart.
const RECENT_TRANSACTIONS: usize = 64;

/// What the policy sees of a delivered event's source transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceTransaction {
    /// Lowercase hex SHA-256 of its `lsid` and `txnNumber` as canonical Extended JSON.
    pub id: String,
    /// The event's place in it, from 0.
    pub index: u32,
    /// How many of its events the stream delivers; `None` when over the bound.
    pub size: Option<u32>,
}

/// A delivered event's place in its source transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) id: String,
    pub(crate) index: u32,
    pub(crate) size: Option<u32>,
}

impl Place {
    /// The transaction ends with this event, or has no end the session waits for (over the
    /// bound): a commit may end here.
    pub(crate) fn boundary(&self) -> bool {
        self.size.is_none_or(|size| self.index + 1 >= size)
    }
}

/// Whether a commit may end after an event in `place`.
pub(crate) fn boundary(place: Option<&Place>) -> bool {
    place.is_none_or(Place::boundary)
}

/// An event read from the stream and not yet delivered.
pub(crate) struct Read {
    pub(crate) delivered: Delivered,
    pub(crate) view: EventView,
    /// Its source transaction's ID, when one wrote it.
    pub(crate) key: Option<String>,
}

/// A source transaction over the bound: its ID and the index of its next event.
pub(crate) struct Oversized {
    id: String,
    next: u32,
}

/// The source transaction's ID of an event (any fragment may carry `lsid` and `txnNumber`).
pub(crate) fn transaction_key<'a>(
    mut fragments: impl Iterator<Item = &'a RawDocument>,
) -> Option<String> {
    fragments.find_map(|fragment| {
        let lsid = Document::try_from(fragment.get_document("lsid").ok()?).ok()?;
        // NumberLong on the wire; a recording in relaxed Extended JSON may hold it as an int.
        let number = match fragment.get("txnNumber").ok()?? {
            RawBsonRef::Int64(n) => n,
            RawBsonRef::Int32(n) => i64::from(n),
            _ => return None,
        };
        let identity = doc! {"lsid": lsid, "txnNumber": number};
        Some(hex::encode(Sha256::digest(
            canonical_text(&identity).as_bytes(),
        )))
    })
}

impl Session {
    /// The next event to deliver: read ahead before, or read now. A source transaction's first
    /// event brings the rest of it into `ahead`.
    pub(crate) fn next_read(&mut self) -> Result<Option<Read>, super::Refusal> {
        let read = match self.ahead.pop_front() {
            Some(read) => read,
            None => match self.read_one()? {
                Some(read) => read,
                None => return Ok(None),
            },
        };
        let Some(key) = read.key.clone() else {
            self.oversized = None;
            return Ok(Some(read));
        };
        if read.delivered.txn.is_some() {
            return Ok(Some(read));
        }
        // The continuation of a transaction over the bound: delivered as it comes.
        if let Some(oversized) = self.oversized.as_mut()
            && oversized.id == key
        {
            let mut read = read;
            read.delivered.txn = Some(Place {
                id: key,
                index: oversized.next,
                size: None,
            });
            oversized.next += 1;
            return Ok(Some(read));
        }
        self.oversized = None;
        if self.transactions_read.contains(&key) {
            // Events of a transaction already read whole: its events arrived apart (a server
            // that interleaves them). Never a second "whole" transaction: delivered as one over
            // the bound, without a size.
            tracing::warn!(
                transaction = %key,
                "a source transaction's events arrived apart; the rest is handed off as it comes"
            );
            let mut read = read;
            read.delivered.txn = Some(Place {
                id: key.clone(),
                index: 0,
                size: None,
            });
            self.oversized = Some(Oversized { id: key, next: 1 });
            return Ok(Some(read));
        }
        self.read_transaction(read, key).map(Some)
    }

    /// Reads the rest of the source transaction `first` begins, placing each of its events;
    /// what follows it stays in `ahead`.
    fn read_transaction(&mut self, first: Read, key: String) -> Result<Read, super::Refusal> {
        let mut group = vec![first];
        let mut bytes = group[0].delivered.bytes;
        let mut after = None;
        let over = loop {
            // One event past the bound tells a transaction of exactly the bound from a larger.
            if group.len() > MAX_SOURCE_TRANSACTION || bytes >= self.bounds.max_pending_bytes / 2 {
                break true;
            }
            match self.read_one()? {
                None => break false,
                Some(read) if read.key.as_deref() == Some(key.as_str()) => {
                    bytes += read.delivered.bytes;
                    group.push(read);
                }
                Some(read) => {
                    after = Some(read);
                    break false;
                }
            }
        };
        let count = group.len() as u32;
        if !over {
            if self.transactions_read.len() >= RECENT_TRANSACTIONS {
                self.transactions_read.pop_front();
            }
            self.transactions_read.push_back(key.clone());
        }
        if over {
            tracing::warn!(
                transaction = %key,
                read = count,
                "a source transaction of more than {MAX_SOURCE_TRANSACTION} events (or of more \
                 than half the pending bytes) is handed off in order in several transactions"
            );
            self.oversized = Some(Oversized {
                id: key.clone(),
                next: count,
            });
        }
        for (index, read) in group.iter_mut().enumerate() {
            read.delivered.txn = Some(Place {
                id: key.clone(),
                index: index as u32,
                size: (!over).then_some(count),
            });
        }
        let mut group = group.into_iter();
        let first = group.next().expect("a group has its first event");
        self.ahead.extend(group);
        self.ahead.extend(after);
        Ok(first)
    }

    /// The last delivered event is inside a source transaction whose rest is read ahead: the
    /// run may read past `max_events` to finish it.
    pub(crate) fn inside_transaction(&self) -> bool {
        let last = self.pending.back().or(self.recent.back());
        last.and_then(|d| d.txn.as_ref())
            .is_some_and(|place| !place.boundary())
    }

    /// Where a delivered event stands in its source transaction.
    pub fn source_transaction_of(&self, token: &str) -> Option<SourceTransaction> {
        let delivered = self
            .pending
            .iter()
            .chain(self.recent.iter())
            .find(|d| d.text == token)?;
        let place = delivered.txn.as_ref()?;
        Some(SourceTransaction {
            id: place.id.clone(),
            index: place.index,
            size: place.size,
        })
    }
}
