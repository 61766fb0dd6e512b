//! A delivery's effects: what each outbox record does to the sink, decided by the policy
//! (contract 1.6, `delivery`) or, when it decides nothing, by the default here.
//!
//! The default:
//! - **keyed sinks** (a projection, a cache): upsert of the change's document under the source
//!   document's key, versioned by the event's cluster time; delete on a delete event (and on a
//!   snapshot or correction record whose document is null); an update whose document was gone
//!   at lookup (a delete follows it), an invalidation marker and events without a document key
//!   (`drop`, `rename`, …) are ignored. A domain-event record (`eventType`, `aggregateId`) is
//!   keyed by its aggregate, `…Deleted` deletes, anything else upserts its payload.
//! - **message sinks** (a webhook, a broker): every record, the record itself as the body, keyed
//!   and versioned as above where it can be (`post` for a webhook, `publish` for a broker).
//!
//! A policy's answer is checked here ([`request_from`]) before anything reaches a sink: an
//! operation the sink cannot make, a key or body that is not Extended JSON, a header that is not
//! HTTP is the policy's error, never an effect.

use bson::{Bson, Document, Timestamp};

use crate::delivery::{Operation, Request};
use crate::error::Result;
use crate::text::escape_untrusted;

/// What kind of sink a delivery has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkKind {
    Projection,
    Webhook,
    Cache,
    Broker,
}

impl SinkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SinkKind::Projection => "projection",
            SinkKind::Webhook => "webhook",
            SinkKind::Cache => "cache",
            SinkKind::Broker => "broker",
        }
    }

    /// Whether the sink keeps one value per key (upserts and deletes) rather than messages.
    pub fn keyed(self) -> bool {
        matches!(self, SinkKind::Projection | SinkKind::Cache)
    }

    /// The operations the sink makes (every sink can ignore a record).
    pub fn allows(self, operation: Operation) -> bool {
        match operation {
            Operation::Ignore => true,
            Operation::Upsert | Operation::Delete => self.keyed(),
            Operation::Post => self == SinkKind::Webhook,
            Operation::Publish => self == SinkKind::Broker,
        }
    }
}

/// What a record comes to.
#[derive(Clone, Debug, PartialEq)]
pub enum Decided {
    Request(Box<Request>),
    /// The record must not reach the sink: dead at once, with the reason.
    Refused(String),
}

/// What becomes of a failed attempt, when the policy says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Retry,
    Dead,
    Ignore,
}

/// A failed attempt as the policy is told it.
#[derive(Clone, Copy, Debug)]
pub struct FailureNote<'a> {
    pub record: &'a str,
    pub sink: SinkKind,
    pub attempt: u32,
    pub transient: bool,
    pub http_status: Option<u16>,
    /// Already free of credentials and documents.
    pub message: &'a str,
}

/// Who decides a delivery's effects. Asked in the deliverer's own thread, once per attempt.
/// An error is the policy's fault (a trap, a bound, an answer [`request_from`] refuses): the
/// delivery stops there and the record stays unsettled for the next run.
pub trait EffectPolicy {
    /// The effect of `record` on a sink of `sink` kind for the delivery `delivery`.
    fn effect(&mut self, delivery: &str, sink: SinkKind, record: &Document) -> Result<Decided>;
    /// What becomes of a failed attempt; `None`: what the host does by default.
    fn classify(&mut self, failure: &FailureNote<'_>) -> Result<Option<Verdict>>;
    /// How the delivery's effects are decided, for status and outputs (`default`, or the policy).
    fn describe(&self) -> String;
}

/// The default's effects, with no policy asked.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultEffects;

impl EffectPolicy for DefaultEffects {
    fn effect(&mut self, _delivery: &str, sink: SinkKind, record: &Document) -> Result<Decided> {
        Ok(Decided::Request(Box::new(default_request(record, sink))))
    }

    fn classify(&mut self, _failure: &FailureNote<'_>) -> Result<Option<Verdict>> {
        Ok(None)
    }

    fn describe(&self) -> String {
        "default".into()
    }
}

/// The source document's key a record names: `event.documentKey._id`, else `aggregateId`.
pub fn source_key(record: &Document) -> Option<Bson> {
    record
        .get_document("event")
        .ok()
        .and_then(|e| e.get_document("documentKey").ok())
        .and_then(|k| k.get("_id"))
        .or_else(|| record.get("aggregateId"))
        .cloned()
}

/// The version a record carries: its event's cluster time, else its own `clusterTime`.
pub fn version_of(record: &Document) -> Option<Timestamp> {
    record
        .get_document("event")
        .ok()
        .and_then(|e| e.get_timestamp("clusterTime").ok())
        .or_else(|| record.get_timestamp("clusterTime").ok())
}

/// The default's request for `record` on a sink of `sink` kind.
pub fn default_request(record: &Document, sink: SinkKind) -> Request {
    let target = source_key(record).unwrap_or(Bson::Null);
    let version = version_of(record);
    let request = |operation, body| Request {
        target: target.clone(),
        operation,
        version,
        body,
        headers: Vec::new(),
    };
    match sink {
        SinkKind::Webhook => return request(Operation::Post, record.clone()),
        SinkKind::Broker => return request(Operation::Publish, record.clone()),
        SinkKind::Projection | SinkKind::Cache => {}
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

/// A policy's request as the contract gives it, before it is checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub operation: Option<Operation>,
    /// One value as Extended JSON.
    pub key: Option<String>,
    pub version: Option<u64>,
    /// A document as Extended JSON.
    pub body: Option<String>,
    pub headers: Vec<(String, String)>,
}

/// The largest body a policy may give, in bytes of text.
pub const MAX_BODY: usize = 16 << 20;
/// The largest key, in bytes of text.
pub const MAX_KEY: usize = 1024;
/// The most headers, and the longest name and value.
pub const MAX_HEADERS: usize = 32;
const MAX_HEADER_NAME: usize = 64;
const MAX_HEADER_VALUE: usize = 4096;
/// Headers a sink sets itself, which a policy cannot.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
];

/// The request `answer` says for `record`, checked; what the answer leaves out is the
/// default's. `Err`: why the answer is nonsense (printable, bounded).
pub fn request_from(
    answer: Answer,
    record: &Document,
    sink: SinkKind,
) -> std::result::Result<Request, String> {
    let default = default_request(record, sink);
    let operation = answer.operation.unwrap_or(default.operation);
    if !sink.allows(operation) {
        return Err(format!(
            "a {} sink cannot {}",
            sink.as_str(),
            operation.as_str()
        ));
    }
    let target = match answer.key {
        None => default.target,
        Some(text) => {
            if text.len() > MAX_KEY {
                return Err(format!("the key is longer than {MAX_KEY} bytes"));
            }
            let value = extended_json(&text).map_err(|e| format!("the key {e}"))?;
            // A compound key is a document (as an `_id` may be); an array is no key.
            if let Bson::Array(_) = value {
                return Err("the key cannot be an array".into());
            }
            value
        }
    };
    if sink.keyed() && operation != Operation::Ignore && target == Bson::Null {
        return Err("the record has no key and the policy gave none".into());
    }
    let version = match answer.version {
        None => default.version,
        Some(v) => Some(Timestamp {
            time: (v >> 32) as u32,
            increment: v as u32,
        }),
    };
    let body = match answer.body {
        None => default.body,
        Some(text) => {
            if text.len() > MAX_BODY {
                return Err(format!("the body is larger than {} MiB", MAX_BODY >> 20));
            }
            match extended_json(&text).map_err(|e| format!("the body {e}"))? {
                Bson::Document(document) => document,
                other => {
                    return Err(format!(
                        "the body must be a document, not {:?}",
                        other.element_type()
                    ));
                }
            }
        }
    };
    if answer.headers.len() > MAX_HEADERS {
        return Err(format!("more than {MAX_HEADERS} headers"));
    }
    for (name, value) in &answer.headers {
        let shown = || escape_untrusted(name, MAX_HEADER_NAME);
        if name.is_empty() || name.len() > MAX_HEADER_NAME || !name.bytes().all(is_tchar) {
            return Err(format!(
                "the header name {} is not an HTTP token of 1-{MAX_HEADER_NAME} characters",
                shown()
            ));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("webhook-") {
            return Err(format!("the header {} is the sink's own", shown()));
        }
        if value.len() > MAX_HEADER_VALUE
            || !value
                .bytes()
                .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
        {
            return Err(format!(
                "the value of the header {} is not printable ASCII of at most {MAX_HEADER_VALUE} bytes",
                shown()
            ));
        }
    }
    Ok(Request {
        target,
        operation,
        version,
        body,
        headers: answer.headers,
    })
}

/// An HTTP token character (RFC 9110 `tchar`).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One value read from canonical or relaxed Extended JSON.
fn extended_json(text: &str) -> std::result::Result<Bson, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("is not JSON: {e}"))?;
    Bson::try_from(value).map_err(|e| format!("is not Extended JSON: {e}"))
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
            SinkKind::Projection,
        );
        assert_eq!(request.operation, Operation::Upsert);
        assert_eq!(request.target, Bson::Int32(5));
        assert_eq!(request.version, Some(time(7)));
        assert_eq!(request.body, doc! { "_id": 5, "n": 1 });
    }

    #[test]
    fn a_projection_deletes_on_delete_and_ignores_what_has_no_document() {
        let op = |r: &Document| default_request(r, SinkKind::Projection).operation;
        assert_eq!(op(&record("delete", None)), Operation::Delete);
        assert_eq!(op(&record("snapshot", None)), Operation::Delete);
        assert_eq!(op(&record("update", None)), Operation::Ignore);
        assert_eq!(op(&record("drop", None)), Operation::Ignore);
        assert_eq!(
            op(&doc! { "_id": "c/i", "consumer": "c", "marker": "invalidate" }),
            Operation::Ignore
        );
    }

    #[test]
    fn a_webhook_posts_the_record_itself_and_a_broker_publishes_it() {
        let record = record("delete", None);
        let request = default_request(&record, SinkKind::Webhook);
        assert_eq!(request.operation, Operation::Post);
        assert_eq!(request.body, record);
        assert_eq!(
            default_request(&record, SinkKind::Broker).operation,
            Operation::Publish
        );
    }

    #[test]
    fn a_domain_event_is_keyed_by_its_aggregate() {
        let shaped = doc! {
            "_id": "c/y", "consumer": "c", "eventType": "OrderDeleted", "aggregateId": "o-1",
            "payload": {}, "clusterTime": time(9),
        };
        let request = default_request(&shaped, SinkKind::Projection);
        assert_eq!(request.operation, Operation::Delete);
        assert_eq!(request.target, Bson::String("o-1".into()));
        assert_eq!(request.version, Some(time(9)));
    }

    #[test]
    fn an_answer_fills_in_what_it_leaves_out_from_the_default() {
        let record = record("update", Some(doc! { "_id": 5, "n": 1 }));
        let answer = Answer {
            key: Some(r#"{"$oid": "65f0a1b2c3d4e5f601234567"}"#.into()),
            version: Some((3u64 << 32) | 4),
            body: Some(r#"{"n": {"$numberLong": "2"}}"#.into()),
            ..Answer::default()
        };
        let request = request_from(answer, &record, SinkKind::Projection).unwrap();
        assert_eq!(request.operation, Operation::Upsert);
        assert!(matches!(request.target, Bson::ObjectId(_)));
        assert_eq!(
            request.version,
            Some(Timestamp {
                time: 3,
                increment: 4
            })
        );
        assert_eq!(request.body, doc! { "n": 2i64 });
        let untouched = request_from(Answer::default(), &record, SinkKind::Projection).unwrap();
        assert_eq!(untouched, default_request(&record, SinkKind::Projection));
    }

    #[test]
    fn nonsense_is_refused_with_a_reason() {
        let record = record("update", Some(doc! { "_id": 5 }));
        let refused = |answer: Answer, sink| request_from(answer, &record, sink).unwrap_err();
        let with = |f: fn(&mut Answer)| {
            let mut a = Answer::default();
            f(&mut a);
            a
        };
        assert!(
            refused(
                with(|a| a.operation = Some(Operation::Post)),
                SinkKind::Projection
            )
            .contains("cannot post")
        );
        assert!(
            refused(
                with(|a| a.operation = Some(Operation::Upsert)),
                SinkKind::Webhook
            )
            .contains("cannot upsert")
        );
        assert!(
            refused(with(|a| a.body = Some("{nope".into())), SinkKind::Webhook)
                .contains("not JSON")
        );
        assert!(
            refused(with(|a| a.body = Some("[1]".into())), SinkKind::Webhook).contains("document")
        );
        assert!(
            refused(with(|a| a.key = Some("[1]".into())), SinkKind::Projection).contains("array")
        );
        assert!(
            refused(with(|a| a.key = Some("null".into())), SinkKind::Projection).contains("no key")
        );
        assert!(
            refused(
                with(|a| a.headers = vec![("X-Ok".into(), "a\r\nInjected: 1".into())]),
                SinkKind::Webhook
            )
            .contains("printable")
        );
        assert!(
            refused(
                with(|a| a.headers = vec![("bad name".into(), "v".into())]),
                SinkKind::Webhook
            )
            .contains("token")
        );
        assert!(
            refused(
                with(|a| a.headers = vec![("Webhook-Id".into(), "forged".into())]),
                SinkKind::Webhook
            )
            .contains("sink's own")
        );
        assert!(
            refused(
                with(|a| a.headers = vec![("x".into(), "y".into()); 33]),
                SinkKind::Webhook
            )
            .contains("more than 32")
        );
        assert!(
            refused(
                with(|a| a.key = Some("x".repeat(2000))),
                SinkKind::Projection
            )
            .contains("longer")
        );
    }
}
