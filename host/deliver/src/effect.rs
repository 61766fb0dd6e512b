//! What a record's effect is when the policy says nothing else: the default policy's mapping of
//! an outbox record to a sink [`Request`], and the lane a record is admitted in.
//!
//! - **Projection** (a keyed sink): upsert of the change's document under the source document's
//!   key, versioned by the event's cluster time; delete on a delete event (and on a snapshot or
//!   correction record whose document is null); an update whose document was gone at lookup
//!   (a delete follows it), an invalidation marker and events without a document key
//!   (`drop`, `rename`, …) are ignored. A domain-event record (`eventType`, `aggregateId`) is
//!   keyed by its aggregate, `…Deleted` deletes, anything else upserts its payload.
//! - **Post** (a webhook): every record, the record itself as the body (relaxed Extended JSON),
//!   keyed and versioned as above where it can be.

use bson::{Bson, Document, Timestamp};

use handoff_domain::delivery::{Operation, Request};
use handoff_domain::token::canonical_text;

/// What kind of effect a sink makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effects {
    /// Keyed, versioned writes (a projection).
    Keyed,
    /// One message per record (a webhook).
    Messages,
}

/// The longest lane text kept (longer keys are lanes by their digest).
const MAX_LANE: usize = 512;

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
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }
}

/// The source document's key a record names: `event.documentKey._id`, else `aggregateId`.
fn source_key(record: &Document) -> Option<Bson> {
    record
        .get_document("event")
        .ok()
        .and_then(|e| e.get_document("documentKey").ok())
        .and_then(|k| k.get("_id"))
        .or_else(|| record.get("aggregateId"))
        .cloned()
}

/// The version a record carries: its event's cluster time, else its own `clusterTime`.
fn version_of(record: &Document) -> Option<Timestamp> {
    record
        .get_document("event")
        .ok()
        .and_then(|e| e.get_timestamp("clusterTime").ok())
        .or_else(|| record.get_timestamp("clusterTime").ok())
}

/// The default policy's request for `record`.
pub fn default_request(record: &Document, effects: Effects) -> Request {
    let target = source_key(record).unwrap_or(Bson::Null);
    let version = version_of(record);
    let request = |operation, body| Request {
        target: target.clone(),
        operation,
        version,
        body,
        headers: Vec::new(),
    };
    if effects == Effects::Messages {
        return request(Operation::Post, record.clone());
    }
    if record.contains_key("marker") || target == Bson::Null {
        return request(Operation::Ignore, Document::new());
    }
    if let Ok(event_type) = record.get_str("eventType") {
        return if event_type.ends_with("Deleted") {
            request(Operation::Delete, Document::new())
        } else {
            let payload = record.get_document("payload").cloned().unwrap_or_default();
            request(Operation::Upsert, payload)
        };
    }
    let Ok(event) = record.get_document("event") else {
        return request(Operation::Ignore, Document::new());
    };
    let document = event.get_document("fullDocument").ok();
    match (event.get_str("operationType").unwrap_or_default(), document) {
        ("delete", _) | ("snapshot", None) => request(Operation::Delete, Document::new()),
        ("insert" | "update" | "replace" | "snapshot", Some(document)) => {
            request(Operation::Upsert, document.clone())
        }
        _ => request(Operation::Ignore, Document::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn time(t: u32) -> Timestamp {
        Timestamp {
            time: t,
            increment: 1,
        }
    }

    fn record(operation: &str, full: Option<Document>) -> Document {
        let mut event = doc! {
            "_id": { "_data": "82" }, "operationType": operation, "clusterTime": time(7),
            "documentKey": { "_id": 5 },
        };
        if let Some(full) = full {
            event.insert("fullDocument", full);
        }
        doc! { "_id": "c/x", "consumer": "c", "source": "db.orders", "event": event }
    }

    #[test]
    fn a_projection_upserts_the_document_by_key_and_cluster_time() {
        let request = default_request(
            &record("update", Some(doc! { "_id": 5, "n": 1 })),
            Effects::Keyed,
        );
        assert_eq!(request.operation, Operation::Upsert);
        assert_eq!(request.target, Bson::Int32(5));
        assert_eq!(request.version, Some(time(7)));
        assert_eq!(request.body, doc! { "_id": 5, "n": 1 });
    }

    #[test]
    fn a_projection_deletes_on_delete_and_ignores_what_has_no_document() {
        assert_eq!(
            default_request(&record("delete", None), Effects::Keyed).operation,
            Operation::Delete
        );
        assert_eq!(
            default_request(&record("snapshot", None), Effects::Keyed).operation,
            Operation::Delete
        );
        assert_eq!(
            default_request(&record("update", None), Effects::Keyed).operation,
            Operation::Ignore
        );
        assert_eq!(
            default_request(&record("drop", None), Effects::Keyed).operation,
            Operation::Ignore
        );
        let marker = doc! { "_id": "c/i", "consumer": "c", "marker": "invalidate" };
        assert_eq!(
            default_request(&marker, Effects::Keyed).operation,
            Operation::Ignore
        );
    }

    #[test]
    fn a_webhook_posts_the_record_itself() {
        let record = record("delete", None);
        let request = default_request(&record, Effects::Messages);
        assert_eq!(request.operation, Operation::Post);
        assert_eq!(request.body, record);
    }

    #[test]
    fn a_domain_event_is_keyed_by_its_aggregate() {
        let shaped = doc! {
            "_id": "c/y", "consumer": "c", "eventType": "OrderDeleted", "aggregateId": "o-1",
            "payload": {}, "clusterTime": time(9),
        };
        let request = default_request(&shaped, Effects::Keyed);
        assert_eq!(request.operation, Operation::Delete);
        assert_eq!(request.target, Bson::String("o-1".into()));
        assert_eq!(request.version, Some(time(9)));
        assert_eq!(lane_of(&shaped), "{\"k\": \"o-1\"}");
    }

    #[test]
    fn lanes_are_keys_and_a_keyless_record_is_a_lane_of_its_own() {
        assert_eq!(lane_of(&record("insert", None)), "{\"k\": 5}");
        assert_eq!(lane_of(&doc! { "_id": "c/z" }), "record:c/z");
        let long = doc! { "_id": "c/w", "aggregateId": "x".repeat(1000) };
        assert!(lane_of(&long).starts_with("sha256:"));
    }
}
