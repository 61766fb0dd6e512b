//! The domain-events policy: each change becomes an outbox record shaped as a domain event with a
//! stable business schema (contract 1.2), instead of the raw change event.
//!
//! - `insert` → `<Entity>Created`, `update` and `replace` → `<Entity>Updated`, `delete` →
//!   `<Entity>Deleted`; a document read by `backfill` or `reconcile --repair` (a `snapshot`
//!   event, contract 1.3) → `<Entity>Snapshot`, or `<Entity>Deleted` for a correction of a
//!   document the source no longer holds; other operations (`drop`, `rename`, …) are skipped with their name as the
//!   reason; an `invalidate` ends the run with `startAfter`, as the default policy does.
//! - `aggregateId` is `documentKey._id`; `aggregateVersion` is `fullDocument.<version-field>` when
//!   the document has it; `schemaVersion` is the `schema-version` parameter.
//! - `payload` is the document without its `_id` (the aggregate ID already names it); for an
//!   update whose document is gone, the update's `updatedFields` and `removedFields`; for a
//!   delete, `{}`.
//! - An event the host could not store as a record (a compound `_id`, a field name starting
//!   with `$`, a payload over 4 MiB) is quarantined with the reason, so it never blocks the
//!   stream.
//!
//! - With `per-transaction=true`, the events one MongoDB transaction wrote become one record
//!   (contract 1.5): `<Entity>Transaction`, ID `txn-<transaction ID>`, `aggregateId` the
//!   transaction's ID, and a payload `{transaction, events: [{eventType, aggregateId,
//!   aggregateVersion, payload}, …]}` in the transaction's order, written with its last event
//!   (the others are skipped, committed in the same transaction). An event the host could not
//!   store is still quarantined on its own; an event whose payload no longer fits in the
//!   record's 4 MiB keeps its type and IDs with `payloadOmitted: true`. A transaction of more
//!   than 500 events, which the host hands off in several transactions, gets a record per event.
//!
//! - Delivered (`handoff deliver`, contract 1.6): a webhook or a broker gets the domain event
//!   itself, not the outbox record — `{id, type, schemaVersion, aggregateId, aggregateVersion?,
//!   payload}`, with the type in a `handoff-event-type` header — and a projection the host's
//!   default (upsert of the payload by aggregate, `…Deleted` deletes). A record that is not a
//!   domain event (written by another policy) is refused: it goes dead rather than out in a
//!   shape its receivers do not know. A webhook answering 409 Conflict already holds the event
//!   (an idempotent receiver): the record is ignored, not retried or dead.
//!
//! Parameters: `entity` (default: the collection name in PascalCase without a trailing `s`:
//! `orders` → `Order`), `version-field` (default `version`), `schema-version` (default `1`),
//! `per-transaction` (`true` or `false`, the default). Event IDs, resume modes and the idle
//! watermark are the default policy's.

use handoff_policy_sdk::{
    Decision, Delivered, DeliveryRecord, Effect, Failure, FromSettings, Operation, Policy, Record,
    Settings, SinkKind, SinkRequest, Verdict,
};
use serde_json::{Map, Value};

/// The largest payload the host accepts, in bytes of Extended JSON text.
const MAX_PAYLOAD: usize = 4 << 20;
/// The most JSON values the host accepts in the payloads of one commit.
const MAX_VALUES: usize = 1 << 20;
/// The largest aggregate ID or version the host accepts, in bytes of Extended JSON text.
const MAX_VALUE: usize = 1024;

/// The policy's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub entity: Option<String>,
    pub version_field: String,
    pub schema_version: u32,
    /// One record per source transaction.
    pub per_transaction: bool,
    /// The events of the source transaction being read, shaped, when `per_transaction`.
    pub building: Option<Building>,
}

/// A source transaction's record while its events are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Building {
    /// The transaction's ID.
    pub id: String,
    pub entity: String,
    /// Each event as the record lists it.
    pub events: Vec<Value>,
    /// The payload text so far.
    pub bytes: usize,
    pub values: usize,
}

impl FromSettings for Shape {
    fn from_settings(settings: &Settings) -> Result<Shape, String> {
        let entity = match settings.param("entity") {
            None => None,
            Some(e) if valid_entity(e) => Some(e.to_string()),
            Some(e) => {
                return Err(format!(
                    "entity must be 1-80 letters, digits, '.', '_', ':' or '-', not {:?}",
                    e.chars().take(100).collect::<String>()
                ));
            }
        };
        let version_field = settings.param("version-field").unwrap_or("version");
        if version_field.is_empty() || version_field.len() > 200 {
            return Err("version-field must be a field path of 1-200 characters".into());
        }
        let schema_version = match settings.param("schema-version") {
            None => 1,
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| format!("schema-version must be a whole number, not {v:?}"))?,
        };
        let per_transaction = match settings.param("per-transaction") {
            None | Some("false") => false,
            Some("true") => true,
            Some(v) => {
                return Err(format!(
                    "per-transaction must be true or false, not {:?}",
                    v.chars().take(100).collect::<String>()
                ));
            }
        };
        Ok(Shape {
            entity,
            version_field: version_field.to_string(),
            schema_version,
            per_transaction,
            building: None,
        })
    }
}

fn valid_entity(entity: &str) -> bool {
    (1..=80).contains(&entity.len())
        && entity
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// `orders` → `Order`, `line_items` → `LineItem`: the entity a collection holds.
pub fn entity_of(collection: &str) -> String {
    let mut name: String = collection
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or(String::new(), |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    if name.len() > 1 && name.ends_with('s') && !name.ends_with("ss") {
        name.pop();
    }
    name.truncate(80);
    if name.is_empty() {
        "Document".to_string()
    } else {
        name
    }
}

/// The event type of an operation, or `None` for operations that are not domain events.
pub fn event_type(entity: &str, operation: &str) -> Option<String> {
    let verb = match operation {
        "insert" => "Created",
        "update" | "replace" => "Updated",
        "delete" => "Deleted",
        "snapshot" => "Snapshot",
        _ => return None,
    };
    Some(format!("{entity}{verb}"))
}

/// How many JSON values `value` is made of, itself included.
fn values(value: &Value) -> usize {
    let mut count = 0;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        count += 1;
        match value {
            Value::Object(map) => stack.extend(map.values()),
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    count
}

/// Why a value cannot be a record's key or payload: a `$` or NUL key at any depth.
fn unstorable_key(value: &Value) -> Option<String> {
    match value {
        // An Extended JSON wrapper (`{"$date": …}`) is a value, not keys of the document; a
        // JavaScript scope's keys are keys.
        Value::Object(map) if is_extended_json(map) => map.get("$scope").and_then(unstorable_key),
        Value::Object(map) => map.iter().find_map(|(key, inner)| {
            if key.starts_with('$') || key.contains('\0') {
                Some(format!(
                    "field name {:?} cannot be stored in a record",
                    key.chars().take(40).collect::<String>()
                ))
            } else {
                unstorable_key(inner)
            }
        }),
        Value::Array(items) => items.iter().find_map(unstorable_key),
        _ => None,
    }
}

/// Relaxed Extended JSON wrappers: the one- or two-key objects whose keys name a BSON type and
/// whose values have that type's shape (a document may hold such keys as plain field names since
/// MongoDB 5.0; those are not wrappers and cannot be stored in a record).
fn is_extended_json(map: &Map<String, Value>) -> bool {
    let text = |v: &Value| v.is_string();
    let fields = |v: &Value, keys: &[&str]| {
        v.as_object()
            .is_some_and(|o| o.len() == keys.len() && keys.iter().all(|k| o.contains_key(*k)))
    };
    let mut keys = map.keys().map(String::as_str).collect::<Vec<_>>();
    keys.sort_unstable();
    match (keys.as_slice(), map.values().next()) {
        (["$oid"], Some(Value::String(hex))) => {
            hex.len() == 24 && hex.bytes().all(|b| b.is_ascii_hexdigit())
        }
        (["$date"], Some(v)) => text(v) || v.is_i64() || fields(v, &["$numberLong"]),
        (
            ["$numberLong"]
            | ["$numberDecimal"]
            | ["$numberDouble"]
            | ["$numberInt"]
            | ["$symbol"]
            | ["$code"]
            | ["$uuid"],
            Some(v),
        ) => text(v),
        (["$binary"], Some(v)) => fields(v, &["base64", "subType"]),
        (["$timestamp"], Some(v)) => fields(v, &["t", "i"]),
        (["$regularExpression"], Some(v)) => fields(v, &["pattern", "options"]),
        (["$maxKey"] | ["$minKey"], Some(v)) => v.as_i64() == Some(1),
        (["$code", "$scope"], _) => {
            map.get("$code").is_some_and(text) && map.get("$scope").is_some_and(Value::is_object)
        }
        _ => false,
    }
}

/// The record an event becomes, or the reason it is quarantined. `read` reads a field of the
/// event as Extended JSON text.
pub fn shape(
    shape: &Shape,
    id: &str,
    operation: &str,
    read: &mut dyn FnMut(&str) -> Option<String>,
) -> Result<Option<Record>, String> {
    let entity = match &shape.entity {
        Some(entity) => entity.clone(),
        None => {
            let collection = read("ns.coll")
                .and_then(|c| serde_json::from_str::<String>(&c).ok())
                .unwrap_or_default();
            entity_of(&collection)
        }
    };
    let Some(mut event_type) = event_type(&entity, operation) else {
        return Ok(None);
    };
    let document = read("fullDocument").filter(|d| d != "null");
    // A snapshot of a document the source no longer holds says it is gone.
    let gone = operation == "snapshot" && document.is_none();
    if gone {
        event_type = format!("{entity}Deleted");
    }
    let aggregate_id = read("documentKey._id").ok_or("the event has no documentKey._id")?;
    let parsed_id: Value = serde_json::from_str(&aggregate_id)
        .map_err(|_| "documentKey._id is not Extended JSON".to_string())?;
    if let Value::Object(map) = &parsed_id
        && !is_extended_json(map)
    {
        return Err("documentKey._id is a document; aggregateId must be a single value".into());
    }
    if aggregate_id.len() > MAX_VALUE {
        return Err(format!("documentKey._id is over {MAX_VALUE} bytes"));
    }
    let mut payload = match (operation, document) {
        ("delete", _) => Value::Object(Map::new()),
        (_, None) if gone => Value::Object(Map::new()),
        (_, Some(document)) => serde_json::from_str(&document)
            .map_err(|_| "fullDocument is not Extended JSON".to_string())?,
        (_, None) => {
            let mut changes = Map::new();
            for key in ["updatedFields", "removedFields"] {
                if let Some(value) = read(&format!("updateDescription.{key}"))
                    .and_then(|v| serde_json::from_str::<Value>(&v).ok())
                {
                    changes.insert(key.to_string(), value);
                }
            }
            Value::Object(changes)
        }
    };
    let Value::Object(map) = &mut payload else {
        return Err("fullDocument is not a document".into());
    };
    map.shift_remove("_id");
    if let Some(reason) = unstorable_key(&payload) {
        return Err(reason);
    }
    if values(&payload) > MAX_VALUES {
        return Err(format!("the payload holds more than {MAX_VALUES} values"));
    }
    let payload = payload.to_string();
    if payload.len() > MAX_PAYLOAD {
        return Err(format!("the payload is over {} MiB", MAX_PAYLOAD >> 20));
    }
    let aggregate_version = read(&format!("fullDocument.{}", shape.version_field))
        .filter(|v| v.len() <= MAX_VALUE && !v.starts_with('{') && !v.starts_with('['))
        .filter(|v| v != "null");
    Ok(Some(Record {
        id: id.to_string(),
        event_type,
        schema_version: shape.schema_version,
        aggregate_id,
        aggregate_version,
        payload,
    }))
}

impl Policy for Shape {
    const PARAMETERS: &'static [(&'static str, &'static str)] = &[
        (
            "entity",
            "the entity the events name (default: the collection in PascalCase, singular)",
        ),
        (
            "version-field",
            "the document field holding its version (default version)",
        ),
        ("schema-version", "the events' schemaVersion (default 1)"),
        (
            "per-transaction",
            "true: one record per source transaction (default false)",
        ),
    ];

    fn effect(record: &DeliveryRecord) -> Effect {
        effect(record)
    }

    fn classify(failure: &Failure) -> Option<Verdict> {
        (failure.sink == SinkKind::Webhook && failure.http_status == Some(409))
            .then_some(Verdict::Ignore)
    }

    fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
        let operation = event.operation_type.clone();
        let transaction = if self.per_transaction {
            event.source_transaction().filter(|t| t.size.is_some())
        } else {
            None
        };
        let mut read = |path: &str| event.field(path);
        let shaped = shape(self, &id, &operation, &mut read);
        let Some(transaction) = transaction else {
            return match shaped {
                Ok(Some(record)) => Decision::Record(Box::new(record)),
                Ok(None) => Decision::Skip(format!("{operation} is not a domain event")),
                Err(reason) => Decision::Quarantine { id, reason },
            };
        };
        if transaction.index == 0
            || self
                .building
                .as_ref()
                .is_none_or(|b| b.id != transaction.id)
        {
            let entity = match &self.entity {
                Some(entity) => entity.clone(),
                None => entity_of(
                    &read("ns.coll")
                        .and_then(|c| serde_json::from_str::<String>(&c).ok())
                        .unwrap_or_default(),
                ),
            };
            self.building = Some(Building {
                id: transaction.id.clone(),
                entity,
                events: Vec::new(),
                bytes: 0,
                values: 0,
            });
        }
        let building = self.building.as_mut().expect("set above");
        let own = match shaped {
            Ok(Some(record)) => {
                building.add(&record);
                None
            }
            Ok(None) => Some(Decision::Skip(format!("{operation} is not a domain event"))),
            Err(reason) => Some(Decision::Quarantine { id, reason }),
        };
        if !transaction.is_last() {
            return own.unwrap_or_else(|| {
                Decision::Skip("in its source transaction's record, with the last event".into())
            });
        }
        let mut building = self.building.take().expect("set above");
        if let (Some(Decision::Quarantine { id, reason }), false) =
            (&own, building.events.is_empty())
        {
            // The record goes with this event (and keeps it, unless the run is told not to):
            // it says why the event is not a domain event.
            let mut entry = Map::new();
            entry.insert("eventId".into(), Value::String(id.clone()));
            entry.insert("quarantined".into(), Value::String(reason.clone()));
            building.events.push(Value::Object(entry));
        }
        match (own, building.record(self.schema_version)) {
            // The last event's own decision stands when the record has nothing to carry.
            (Some(own), None) => own,
            (_, Some(record)) => Decision::Record(Box::new(record)),
            (None, None) => Decision::Skip("a source transaction of no domain events".into()),
        }
    }
}

impl Building {
    /// Adds an event's record to the transaction's, its payload left out once the payloads
    /// would pass the bounds of one record.
    fn add(&mut self, record: &Record) {
        let payload: Value = serde_json::from_str(&record.payload).unwrap_or(Value::Null);
        let parse = |text: &Option<String>| {
            text.as_deref()
                .and_then(|t| serde_json::from_str::<Value>(t).ok())
                .unwrap_or(Value::Null)
        };
        let mut entry = Map::new();
        entry.insert("eventType".into(), Value::String(record.event_type.clone()));
        entry.insert(
            "aggregateId".into(),
            parse(&Some(record.aggregate_id.clone())),
        );
        entry.insert("aggregateVersion".into(), parse(&record.aggregate_version));
        // What the entry adds to the record's payload text, counted as it will be written.
        let head = Value::Object(entry.clone()).to_string().len() + 40;
        let (bytes, count) = (head + record.payload.len(), values(&payload) + 4);
        if self.bytes + bytes <= MAX_PAYLOAD - 1024 && self.values + count < MAX_VALUES / 2 {
            self.bytes += bytes;
            self.values += count;
            entry.insert("payload".into(), payload);
        } else {
            self.bytes += head;
            self.values += 4;
            entry.insert("payloadOmitted".into(), Value::Bool(true));
        }
        self.events.push(Value::Object(entry));
    }

    /// The transaction's record; `None` when none of its events was a domain event.
    fn record(self, schema_version: u32) -> Option<Record> {
        if self.events.is_empty() {
            return None;
        }
        let mut payload = Map::new();
        payload.insert("transaction".into(), Value::String(self.id.clone()));
        payload.insert("events".into(), Value::Array(self.events));
        Some(Record {
            id: format!("txn-{}", self.id),
            event_type: format!("{}Transaction", self.entity)
                .chars()
                .take(100)
                .collect(),
            schema_version,
            aggregate_id: Value::String(self.id).to_string(),
            aggregate_version: None,
            payload: Value::Object(payload).to_string(),
        })
    }
}

/// A delivered record's effect: the domain event itself for a message sink, the default for a
/// keyed one; a record that is not a domain event is refused.
fn effect(record: &DeliveryRecord) -> Effect {
    let operation = match record.sink {
        SinkKind::Webhook => Operation::Post,
        SinkKind::Broker => Operation::Publish,
        SinkKind::Projection | SinkKind::Cache => return Effect::Default,
    };
    let Ok(Value::Object(outbox)) = serde_json::from_str::<Value>(&record.json) else {
        return Effect::Refuse("the outbox record is not a JSON object".into());
    };
    let Some(Value::String(event_type)) = outbox.get("eventType") else {
        return Effect::Refuse("the outbox record is not a domain event (no eventType)".into());
    };
    let id = match outbox.get("_id") {
        Some(Value::String(id)) => id.split_once('/').map_or(id.as_str(), |(_, rest)| rest),
        _ => return Effect::Refuse("the outbox record has no string _id".into()),
    };
    let mut body = Map::new();
    body.insert("id".into(), Value::String(id.to_string()));
    body.insert("type".into(), Value::String(event_type.clone()));
    for (from, to) in [
        ("schemaVersion", "schemaVersion"),
        ("aggregateId", "aggregateId"),
        ("aggregateVersion", "aggregateVersion"),
        ("payload", "payload"),
    ] {
        if let Some(value) = outbox.get(from) {
            body.insert(to.into(), value.clone());
        }
    }
    Effect::Request(
        SinkRequest::new(operation)
            .body(Value::Object(body).to_string())
            .header("handoff-event-type", event_type.clone()),
    )
}

#[cfg(target_arch = "wasm32")]
handoff_policy_sdk::export_policy!(Shape);

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(sink: SinkKind, json: &str) -> Effect {
        effect(&DeliveryRecord {
            delivery: "default".into(),
            sink,
            json: json.into(),
        })
    }

    #[test]
    fn a_webhook_gets_the_domain_event_with_its_type_in_a_header() {
        let json = r#"{"_id": "c/e1", "consumer": "c", "eventType": "OrderCreated",
            "schemaVersion": {"$numberLong": "1"}, "aggregateId": "o-1",
            "payload": {"total": 5}, "token": {"_data": "82"}}"#;
        let Effect::Request(request) = delivered(SinkKind::Webhook, json) else {
            panic!("a request");
        };
        assert_eq!(request.operation, Operation::Post);
        assert_eq!(
            request.headers,
            vec![("handoff-event-type".to_string(), "OrderCreated".to_string())]
        );
        let body: Value = serde_json::from_str(request.body.as_deref().unwrap()).unwrap();
        assert_eq!(body["id"], "e1");
        assert_eq!(body["type"], "OrderCreated");
        assert_eq!(body["payload"]["total"], 5);
        assert!(body.get("token").is_none() && body.get("consumer").is_none());
    }

    #[test]
    fn a_projection_gets_the_default_and_a_raw_record_is_refused() {
        let raw = r#"{"_id": "c/e2", "consumer": "c", "event": {}}"#;
        assert_eq!(delivered(SinkKind::Projection, raw), Effect::Default);
        assert!(
            matches!(delivered(SinkKind::Webhook, raw), Effect::Refuse(r) if r.contains("eventType"))
        );
        assert!(matches!(
            delivered(SinkKind::Broker, "[]"),
            Effect::Refuse(_)
        ));
    }

    #[test]
    fn a_conflict_from_a_webhook_is_ignored() {
        let failure = |status| Failure {
            record_id: "c/e1".into(),
            sink: SinkKind::Webhook,
            attempt: 1,
            transient: false,
            http_status: Some(status),
            message: String::new(),
        };
        assert_eq!(Shape::classify(&failure(409)), Some(Verdict::Ignore));
        assert_eq!(Shape::classify(&failure(400)), None);
    }

    fn defaults() -> Shape {
        Shape::from_settings(&Settings::default()).unwrap()
    }

    fn reader(fields: &[(&str, &str)]) -> impl FnMut(&str) -> Option<String> {
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |path| {
            fields
                .iter()
                .find(|(k, _)| k == path)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn entities_from_collections() {
        assert_eq!(entity_of("orders"), "Order");
        assert_eq!(entity_of("line_items"), "LineItem");
        assert_eq!(entity_of("address"), "Address");
        assert_eq!(entity_of(""), "Document");
        assert_eq!(
            event_type("Order", "insert").as_deref(),
            Some("OrderCreated")
        );
        assert_eq!(
            event_type("Order", "replace").as_deref(),
            Some("OrderUpdated")
        );
        assert_eq!(
            event_type("Order", "delete").as_deref(),
            Some("OrderDeleted")
        );
        assert_eq!(event_type("Order", "drop"), None);
    }

    #[test]
    fn parameters_are_checked() {
        let with = |k: &str, v: &str| Settings {
            params: vec![(k.into(), v.into())],
            ..Settings::default()
        };
        assert!(Shape::from_settings(&with("entity", "Payment")).is_ok());
        assert!(Shape::from_settings(&with("entity", "Pay ment")).is_err());
        assert!(Shape::from_settings(&with("schema-version", "-1")).is_err());
        assert!(Shape::from_settings(&with("version-field", "")).is_err());
        assert_eq!(
            Shape::from_settings(&with("schema-version", "3"))
                .unwrap()
                .schema_version,
            3
        );
    }

    #[test]
    fn an_insert_becomes_a_created_event_without_the_id_in_its_payload() {
        let mut read = reader(&[
            ("ns.coll", "\"orders\""),
            ("documentKey._id", "\"o-1\""),
            ("fullDocument", r#"{"_id":"o-1","total":5,"version":3}"#),
            ("fullDocument.version", "3"),
        ]);
        let record = shape(&defaults(), "abc", "insert", &mut read)
            .unwrap()
            .unwrap();
        assert_eq!(record.event_type, "OrderCreated");
        assert_eq!(record.aggregate_id, "\"o-1\"");
        assert_eq!(record.aggregate_version.as_deref(), Some("3"));
        assert_eq!(record.payload, r#"{"total":5,"version":3}"#);
        assert_eq!(record.schema_version, 1);
    }

    #[test]
    fn a_snapshot_is_the_document_as_read_and_a_gone_one_a_deletion() {
        let mut read = reader(&[
            ("ns.coll", "\"orders\""),
            ("documentKey._id", "\"o-1\""),
            ("fullDocument", r#"{"_id":"o-1","total":5,"version":3}"#),
            ("fullDocument.version", "3"),
        ]);
        let record = shape(&defaults(), "abc", "snapshot", &mut read)
            .unwrap()
            .unwrap();
        assert_eq!(record.event_type, "OrderSnapshot");
        assert_eq!(record.aggregate_id, "\"o-1\"");
        assert_eq!(record.aggregate_version.as_deref(), Some("3"));
        assert_eq!(record.payload, r#"{"total":5,"version":3}"#);
        let mut gone = reader(&[
            ("ns.coll", "\"orders\""),
            ("documentKey._id", "\"o-2\""),
            ("fullDocument", "null"),
        ]);
        let record = shape(&defaults(), "abc", "snapshot", &mut gone)
            .unwrap()
            .unwrap();
        assert_eq!(record.event_type, "OrderDeleted");
        assert_eq!(record.aggregate_id, "\"o-2\"");
        assert_eq!(record.payload, "{}");
    }

    #[test]
    fn an_update_without_its_document_carries_its_changes() {
        let mut read = reader(&[
            ("ns.coll", "\"orders\""),
            ("documentKey._id", r#"{"$oid":"6740a1b2c3d4e5f601234567"}"#),
            ("fullDocument", "null"),
            ("updateDescription.updatedFields", r#"{"status":"paid"}"#),
            ("updateDescription.removedFields", "[]"),
        ]);
        let record = shape(&defaults(), "abc", "update", &mut read)
            .unwrap()
            .unwrap();
        assert_eq!(record.event_type, "OrderUpdated");
        assert_eq!(record.aggregate_version, None);
        assert_eq!(
            record.payload,
            r#"{"updatedFields":{"status":"paid"},"removedFields":[]}"#
        );
    }

    #[test]
    fn events_the_host_could_not_store_are_refused_with_a_reason() {
        let mut compound = reader(&[("documentKey._id", r#"{"a":1,"b":2}"#)]);
        assert!(
            shape(&defaults(), "x", "delete", &mut compound)
                .unwrap_err()
                .contains("is a document")
        );
        let mut dollar = reader(&[
            ("documentKey._id", "1"),
            ("fullDocument", r#"{"_id":1,"nested":{"$where":"x"}}"#),
        ]);
        assert!(
            shape(&defaults(), "x", "insert", &mut dollar)
                .unwrap_err()
                .contains("$where")
        );
        let mut dates = reader(&[
            ("documentKey._id", "1"),
            (
                "fullDocument",
                r#"{"_id":1,"at":{"$date":"2026-01-01T00:00:00Z"}}"#,
            ),
        ]);
        assert!(shape(&defaults(), "x", "insert", &mut dates).is_ok());
        // A field named like a wrapper but not shaped like one is a field name.
        let mut fake = reader(&[
            ("documentKey._id", "1"),
            ("fullDocument", r#"{"_id":1,"ref":{"$oid":"zz"}}"#),
        ]);
        assert!(
            shape(&defaults(), "x", "insert", &mut fake)
                .unwrap_err()
                .contains("$oid")
        );
        let mut real = reader(&[
            ("documentKey._id", r#"{"$oid":"6740a1b2c3d4e5f601234567"}"#),
            (
                "fullDocument",
                r#"{"_id":1,"n":{"$numberLong":"9007199254740993"}}"#,
            ),
        ]);
        assert!(shape(&defaults(), "x", "insert", &mut real).is_ok());
        let mut none = reader(&[]);
        assert!(
            shape(&defaults(), "x", "drop", &mut none)
                .unwrap()
                .is_none()
        );
        assert!(shape(&defaults(), "x", "insert", &mut none).is_err());
    }

    #[test]
    fn per_transaction_one_record_carries_a_source_transactions_events() {
        use handoff_policy_sdk::fake::FakeHost;
        use handoff_policy_sdk::{event_id, run};
        let mut host = FakeHost::new().event("X", "insert").transaction(
            "t1",
            &[("A", "insert"), ("B", "update"), ("C", "insert")],
            false,
        );
        for (token, key, document) in [
            ("X", "\"o-0\"", r#"{"_id": "o-0", "total": 1}"#),
            (
                "A",
                "\"o-1\"",
                r#"{"_id": "o-1", "total": 2, "version": 1}"#,
            ),
            ("B", "\"o-0\"", r#"{"_id": "o-0", "total": 3}"#),
            // Not storable: quarantined on its own, named in the record.
            ("C", "{\"a\": 1}", r#"{"_id": {"a": 1}}"#),
        ] {
            host = host
                .field(token, "ns.coll", "\"orders\"")
                .field(token, "documentKey._id", key)
                .field(token, "fullDocument", document);
        }
        host = host.field("A", "fullDocument.version", "1").watermark("W");
        let settings = Settings::new(50, 3000).param_set("per-transaction", "true");
        run::<Shape>(&mut host, &settings).unwrap();
        // X alone; then the transaction in one commit, its record with its last event.
        let covered: Vec<_> = host.commits.iter().map(|c| c.decisions.len()).collect();
        assert_eq!(covered, vec![1, 3]);
        let decisions = &host.commits[1].decisions;
        assert!(matches!(&decisions[0], Decision::Skip(_)), "{decisions:?}");
        assert!(matches!(&decisions[1], Decision::Skip(_)), "{decisions:?}");
        let Decision::Record(record) = &decisions[2] else {
            panic!("{decisions:?}")
        };
        assert_eq!(record.id, "txn-t1");
        assert_eq!(record.event_type, "OrderTransaction");
        assert_eq!(record.aggregate_id, "\"t1\"");
        let payload: Value = serde_json::from_str(&record.payload).unwrap();
        assert_eq!(payload["transaction"], "t1");
        let events = payload["events"].as_array().unwrap();
        assert_eq!(events.len(), 3, "{payload}");
        assert_eq!(events[0]["eventType"], "OrderCreated");
        assert_eq!(events[0]["aggregateId"], "o-1");
        assert_eq!(events[0]["aggregateVersion"], 1);
        assert_eq!(events[0]["payload"]["total"], 2);
        assert_eq!(events[1]["eventType"], "OrderUpdated");
        assert_eq!(events[2]["eventId"], event_id("C"));
        assert!(
            events[2]["quarantined"]
                .as_str()
                .unwrap()
                .contains("document")
        );
        // Without the parameter, a record per event.
        assert!(
            Shape::from_settings(&Settings::default().param_set("per-transaction", "yes")).is_err()
        );
    }
}
