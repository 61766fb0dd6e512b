//! What a consumer's outbox says each document of its source should be now.
//!
//! For every document key, the record with the greatest position (`event.clusterTime`, then
//! `event._id._data`, the stream's order) among the records of the consumer and its source
//! decides: a `delete` says the document is absent, a `snapshot` (backfill) or correction
//! (`reconcile --repair`) record with a null `fullDocument` too; any other record says the
//! document is its `fullDocument` (a null one, an update whose document was deleted before its
//! lookup, says absent). A `drop`, `rename` or `dropDatabase` event says every key whose latest
//! record comes before it is absent.
//!
//! Records are read one at a time and folded into one entry per key holding the key, the
//! position and a digest of the document (the SHA-256 of its canonical text, in which keys are
//! sorted at every level): memory grows with the number of keys, not records or document sizes.

use std::collections::HashMap;

use bson::{Bson, Document, Timestamp, doc};
use sha2::{Digest as _, Sha256};

use handoff_domain::error::HandoffError;
use handoff_domain::token::canonical_text;
use handoff_mongo::{Connection, OperationError, reconcile};

/// A document's digest: the SHA-256 of its canonical text (field order does not count).
pub type Digest = [u8; 32];

/// The digest of a document, as compared by `reconcile`.
pub fn digest(document: &Document) -> Digest {
    Sha256::digest(canonical_text(document).as_bytes()).into()
}

/// A position in the stream: a record's cluster time, then its token's `_data`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamOrder {
    pub time: (u32, u32),
    pub data: String,
}

impl StreamOrder {
    /// The position of a change event (or a snapshot / correction record's event).
    pub fn of_event(event: &Document) -> Option<StreamOrder> {
        let time = event.get_timestamp("clusterTime").ok()?;
        let data = event.get_document("_id").ok()?.get_str("_data").ok()?;
        Some(StreamOrder {
            time: (time.time, time.increment),
            data: data.to_string(),
        })
    }

    /// The position of a resume token (its cluster time decoded from `_data`).
    pub fn of_token(token: &Document) -> Option<StreamOrder> {
        let time = handoff_domain::token::cluster_time(token)?;
        let data = token.get_str("_data").ok()?;
        Some(StreamOrder {
            time: (time.time, time.increment),
            data: data.to_string(),
        })
    }

    pub fn cluster_time(&self) -> Timestamp {
        Timestamp {
            time: self.time.0,
            increment: self.time.1,
        }
    }
}

/// What the outbox says one document is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Absent,
    Present(Digest),
}

/// The latest record of one key.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The document key (`documentKey._id`).
    pub key: Bson,
    pub position: StreamOrder,
    pub said: Said,
}

/// The text a key is known by: its relaxed Extended JSON (also how keys are printed).
pub fn key_text(key: &Bson) -> String {
    key.clone().into_relaxed_extjson().to_string()
}

/// The filter of a consumer's records of its source.
pub fn filter(consumer: &str, source: &str) -> Document {
    doc! { "consumer": consumer, "source": source }
}

/// The fields of a record the view reads.
pub fn projection() -> Document {
    doc! {
        "_id": 1,
        "event._id": 1,
        "event.clusterTime": 1,
        "event.operationType": 1,
        "event.documentKey": 1,
        "event.fullDocument": 1,
        "event.splitEvent": 1,
    }
}

/// Records the view cannot use, by reason (each a count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unusable {
    /// Records without their change event (`event`: a policy shaped them without it).
    pub without_event: u64,
    /// Fragments of split events (`splitEvent`).
    pub fragments: u64,
    /// Records whose event has no position (`clusterTime` and `_id._data`).
    pub without_position: u64,
    /// Insert, replace or update records without `fullDocument` (a stream without updateLookup).
    pub without_document: u64,
}

impl Unusable {
    pub fn total(&self) -> u64 {
        self.without_event + self.fragments + self.without_position + self.without_document
    }

    /// The error that stops a comparison the records cannot support.
    pub fn error(&self, consumer: &str) -> Option<HandoffError> {
        if self.total() == 0 {
            return None;
        }
        let mut reasons = Vec::new();
        if self.without_event > 0 {
            reasons.push(format!(
                "{} without their change event (`event`: the policy shaped them, run with \
                 --outbox-keep-event true to keep it)",
                self.without_event
            ));
        }
        if self.fragments > 0 {
            reasons.push(format!(
                "{} fragments of split events (--split-large-events)",
                self.fragments
            ));
        }
        if self.without_position > 0 {
            reasons.push(format!(
                "{} whose event has no clusterTime or resume token",
                self.without_position
            ));
        }
        if self.without_document > 0 {
            reasons.push(format!(
                "{} without the event's fullDocument (a stream without --full-document updateLookup)",
                self.without_document
            ));
        }
        Some(HandoffError::BadInput(format!(
            "The outbox of consumer {} cannot be reconciled: {} of its records cannot say what \
             a document is: {}. Nothing was compared or written",
            handoff_domain::text::escape_name(consumer, 64),
            self.total(),
            reasons.join("; ")
        )))
    }
}

/// What the outbox says, key by key.
#[derive(Debug, Default)]
pub struct OutboxView {
    entries: HashMap<String, Entry>,
    /// The latest drop of the collection (or rename, or drop of its database) among the records.
    cleared: Option<StreamOrder>,
    pub unusable: Unusable,
    /// Records read.
    pub records: u64,
}

impl OutboxView {
    pub fn new() -> OutboxView {
        OutboxView::default()
    }

    /// Folds one record (read with [`projection`]) into the view.
    pub fn add(&mut self, record: &Document) {
        self.records += 1;
        let Ok(event) = record.get_document("event") else {
            self.unusable.without_event += 1;
            return;
        };
        if event.contains_key("splitEvent") {
            self.unusable.fragments += 1;
            return;
        }
        let Some(position) = StreamOrder::of_event(event) else {
            self.unusable.without_position += 1;
            return;
        };
        let operation = event.get_str("operationType").unwrap_or_default();
        let key = event
            .get_document("documentKey")
            .ok()
            .and_then(|k| k.get("_id"));
        let Some(key) = key else {
            if matches!(operation, "drop" | "rename" | "dropDatabase")
                && self.cleared.as_ref().is_none_or(|c| *c < position)
            {
                self.cleared = Some(position);
            }
            // An invalidation (or its marker) says nothing about a document.
            return;
        };
        let said = match (operation, event.get("fullDocument")) {
            ("delete", _) => Said::Absent,
            (_, Some(Bson::Document(document))) => Said::Present(digest(document)),
            (_, Some(Bson::Null)) => Said::Absent,
            ("snapshot", None) => Said::Absent,
            _ => {
                self.unusable.without_document += 1;
                return;
            }
        };
        let text = key_text(key);
        match self.entries.get_mut(&text) {
            Some(entry) if entry.position >= position => {}
            Some(entry) => {
                entry.position = position;
                entry.said = said;
            }
            None => {
                self.entries.insert(
                    text,
                    Entry {
                        key: key.clone(),
                        position,
                        said,
                    },
                );
            }
        }
    }

    /// Applies the latest drop: keys whose latest record comes before it are absent.
    pub fn settle(&mut self) {
        if let Some(cleared) = &self.cleared {
            for entry in self.entries.values_mut() {
                if entry.position < *cleared {
                    entry.said = Said::Absent;
                }
            }
        }
    }

    /// The latest record of a key, by its [`key_text`].
    pub fn get(&self, key_text: &str) -> Option<&Entry> {
        self.entries.get(key_text)
    }

    /// Takes a key's entry out of the view.
    pub fn take(&mut self, key_text: &str) -> Option<Entry> {
        self.entries.remove(key_text)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries left, with their key texts.
    pub fn entries(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    /// Keeps only the entries `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        self.entries.retain(|_, entry| keep(entry));
    }
}

/// Reads the view of `consumer`'s records of `source` in `outbox`, one batch at a time, calling
/// `each` after every record (progress).
pub async fn read(
    connection: &Connection,
    database: &str,
    outbox: &str,
    consumer: &str,
    source: &str,
    batch_size: u32,
    mut each: impl FnMut(),
) -> std::result::Result<OutboxView, OperationError> {
    let mut view = OutboxView::new();
    reconcile::outbox_records(
        connection,
        database,
        outbox,
        filter(consumer, source),
        projection(),
        batch_size,
        |record| {
            view.add(&record);
            each();
        },
    )
    .await?;
    view.settle();
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(time: u32, increment: u32, tail: &str) -> Document {
        doc! { "_data": format!("82{time:08X}{increment:08X}{tail}") }
    }

    fn record(op: &str, time: u32, key: i32, full: Option<Bson>) -> Document {
        let mut event = doc! {
            "_id": token(time, 1, "04"),
            "operationType": op,
            "clusterTime": Timestamp { time, increment: 1 },
            "documentKey": { "_id": key },
        };
        if let Some(full) = full {
            event.insert("fullDocument", full);
        }
        doc! { "_id": format!("c/{time}"), "event": event }
    }

    #[test]
    fn the_latest_record_of_each_key_decides() {
        let mut view = OutboxView::new();
        let a = doc! { "_id": 1, "x": 1, "y": 2 };
        let a_reordered = doc! { "y": 2, "_id": 1, "x": 1 };
        // Out of order on purpose: the position decides, not the reading order.
        view.add(&record("update", 20, 1, Some(Bson::Document(a.clone()))));
        view.add(&record(
            "insert",
            10,
            1,
            Some(Bson::Document(doc! {"_id": 1})),
        ));
        view.add(&record(
            "insert",
            11,
            2,
            Some(Bson::Document(doc! {"_id": 2})),
        ));
        view.add(&record("delete", 12, 2, None));
        view.add(&record("snapshot", 13, 3, Some(Bson::Null)));
        view.add(&record("update", 14, 4, Some(Bson::Null)));
        view.add(&record(
            "snapshot",
            15,
            5,
            Some(Bson::Document(doc! {"_id": 5})),
        ));
        view.settle();
        assert_eq!(view.len(), 5);
        let said = |k: i32| view.get(&key_text(&Bson::Int32(k))).unwrap().said.clone();
        assert_eq!(said(1), Said::Present(digest(&a_reordered)));
        assert_eq!(said(2), Said::Absent);
        assert_eq!(said(3), Said::Absent);
        assert_eq!(said(4), Said::Absent);
        assert_eq!(said(5), Said::Present(digest(&doc! {"_id": 5})));
        assert_eq!(view.unusable, Unusable::default());
        assert_ne!(digest(&a), digest(&doc! { "_id": 1, "x": 1, "y": 3 }));
    }

    #[test]
    fn a_drop_clears_earlier_keys_and_unusable_records_are_counted() {
        let mut view = OutboxView::new();
        view.add(&record(
            "insert",
            10,
            1,
            Some(Bson::Document(doc! {"_id": 1})),
        ));
        let mut drop = record("drop", 11, 0, None);
        drop.get_document_mut("event")
            .unwrap()
            .remove("documentKey");
        view.add(&drop);
        view.add(&record(
            "insert",
            12,
            2,
            Some(Bson::Document(doc! {"_id": 2})),
        ));
        view.add(&doc! { "_id": "c/shaped", "payload": {} });
        view.add(&record("update", 13, 3, None));
        view.settle();
        assert_eq!(
            view.get(&key_text(&Bson::Int32(1))).unwrap().said,
            Said::Absent
        );
        assert!(matches!(
            view.get(&key_text(&Bson::Int32(2))).unwrap().said,
            Said::Present(_)
        ));
        assert_eq!(view.unusable.without_event, 1);
        assert_eq!(view.unusable.without_document, 1);
        let error = view.unusable.error("c").expect("an error");
        assert_eq!(error.exit_code(), 2);
        assert!(error.to_string().contains("2 of its records"), "{error}");
    }

    #[test]
    fn positions_order_by_time_then_token() {
        let a = StreamOrder::of_token(&token(10, 2, "01")).unwrap();
        let b = StreamOrder::of_token(&token(10, 2, "02")).unwrap();
        let c = StreamOrder::of_token(&token(11, 0, "00")).unwrap();
        assert!(a < b && b < c);
        assert_eq!(
            c.cluster_time(),
            Timestamp {
                time: 11,
                increment: 0
            }
        );
    }
}
