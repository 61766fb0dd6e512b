//! Outbox records shaped by a policy (contract 1.2): what the policy gives, checked, and the
//! record built from it. Every part comes from untrusted code, so each is bounded and parsed
//! here before anything is written; a bad part refuses the whole commit.

use bson::raw::cstr;
use bson::{Bson, Document, RawDocument, RawDocumentBuf, doc};

/// The longest `eventType`, in characters.
pub const MAX_EVENT_TYPE_LEN: usize = 100;
/// The longest `aggregateId` / `aggregateVersion` text, in bytes.
pub const MAX_VALUE_TEXT: usize = 1024;
/// The longest payload text, in bytes.
pub const MAX_PAYLOAD_TEXT: usize = 4 << 20;
/// The payload text one commit may carry in all, in bytes.
pub const MAX_PAYLOADS_PER_COMMIT: usize = 64 << 20;
/// The JSON values (numbers, strings, documents, …) the payloads of one commit may hold in all:
/// a parsed value costs far more host memory than its text (`[0,0,…]` is two bytes a value).
pub const MAX_PAYLOAD_VALUES_PER_COMMIT: usize = 1 << 20;

/// An upper bound on the JSON values `text` holds, counted without parsing it: one more than
/// its commas, colons' keys aside, and opening brackets outside strings.
pub fn json_values(text: &str) -> usize {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b',' | b'[' | b'{' => values += 1,
                _ => {}
            }
        }
    }
    values
}

/// A policy-shaped outbox record as the policy gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shaped {
    pub id: String,
    pub event_type: String,
    pub schema_version: u32,
    /// One Extended JSON value.
    pub aggregate_id: String,
    /// One Extended JSON value.
    pub aggregate_version: Option<String>,
    /// One Extended JSON document.
    pub payload: String,
}

/// What the outbox keeps of a shaped record's event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutboxOptions {
    /// Keep the raw change event beside the shaped record (`--outbox-keep-event`).
    pub keep_event: bool,
    /// Write an outbox record for each invalidation (`--invalidate-marker`), so that readers
    /// see where the stream restarted.
    pub invalidate_marker: bool,
}

impl Default for OutboxOptions {
    fn default() -> Self {
        OutboxOptions {
            keep_event: true,
            invalidate_marker: false,
        }
    }
}

/// One Extended JSON value (relaxed or canonical).
fn parse_value(what: &str, text: &str, max: usize) -> Result<Bson, String> {
    if text.len() > max {
        return Err(format!("{what} is over {max} bytes of Extended JSON"));
    }
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{what} is not JSON ({e})"))?;
    let value =
        // The converter's message quotes the offending value: only the fact is told.
        Bson::try_from(json).map_err(|_| format!("{what} is not valid Extended JSON"))?;
    check_keys(what, &value)?;
    Ok(value)
}

/// One Extended JSON value that is neither a document nor an array (an aggregate names one
/// thing), within [`MAX_VALUE_TEXT`].
fn parse_scalar(what: &str, text: &str) -> Result<Bson, String> {
    match parse_value(what, text, MAX_VALUE_TEXT)? {
        Bson::Document(_) | Bson::Array(_) => Err(format!(
            "{what} must be one value (a string, number, ObjectId, …), not a document or array"
        )),
        value => Ok(value),
    }
}

/// No key may start with `$` (an operator to MongoDB) or hold a NUL (BSON cannot store it), at
/// any depth, a JavaScript scope's included.
fn check_keys(what: &str, value: &Bson) -> Result<(), String> {
    fn nested(value: &Bson) -> Option<&Document> {
        match value {
            Bson::Document(d) => Some(d),
            Bson::JavaScriptCodeWithScope(code) => Some(&code.scope),
            _ => None,
        }
    }
    fn visit<'a>(value: &'a Bson, documents: &mut Vec<&'a Document>, arrays: &mut Vec<&'a [Bson]>) {
        if let Some(d) = nested(value) {
            documents.push(d);
        } else if let Bson::Array(items) = value {
            arrays.push(items);
        }
    }
    let mut documents: Vec<&Document> = Vec::new();
    let mut arrays: Vec<&[Bson]> = Vec::new();
    visit(value, &mut documents, &mut arrays);
    loop {
        if let Some(d) = documents.pop() {
            for (key, inner) in d {
                if key.starts_with('$') {
                    return Err(format!("{what} holds a key starting with `$`"));
                }
                if key.contains('\0') {
                    return Err(format!("{what} holds a key with a NUL character"));
                }
                visit(inner, &mut documents, &mut arrays);
            }
        } else if let Some(items) = arrays.pop() {
            for inner in items {
                visit(inner, &mut documents, &mut arrays);
            }
        } else {
            return Ok(());
        }
    }
}

impl Shaped {
    /// The outbox record for `event`, following `head` (the record's `_id`, consumer and
    /// source), or why the policy's parts are refused.
    pub fn record(
        &self,
        head: RawDocumentBuf,
        event: &RawDocument,
        options: OutboxOptions,
    ) -> Result<RawDocumentBuf, String> {
        if !super::commit::id_like(&self.event_type, MAX_EVENT_TYPE_LEN) {
            return Err(format!(
                "an eventType must be 1-{MAX_EVENT_TYPE_LEN} characters from [A-Za-z0-9._:-]"
            ));
        }
        let aggregate_id = parse_scalar("the aggregateId", &self.aggregate_id)?;
        let aggregate_version = self
            .aggregate_version
            .as_deref()
            .map(|text| parse_scalar("the aggregateVersion", text))
            .transpose()?;
        let payload = match parse_value("the payload", &self.payload, MAX_PAYLOAD_TEXT)? {
            Bson::Document(payload) => payload,
            _ => return Err("the payload must be a document".into()),
        };
        if payload.contains_key("_id") {
            return Err("the payload may not hold an `_id` at its top level".into());
        }
        let mut shaped = doc! {
            "eventType": &self.event_type,
            "schemaVersion": i64::from(self.schema_version),
            "aggregateId": aggregate_id,
        };
        if let Some(version) = aggregate_version {
            shaped.insert("aggregateVersion", version);
        }
        shaped.insert("payload", payload);
        let shaped = RawDocumentBuf::try_from(&shaped)
            .map_err(|_| "the record cannot be encoded as BSON".to_string())?;
        let mut record = head;
        for element in &shaped {
            let (key, value) = element.map_err(|_| "the record cannot be encoded as BSON")?;
            record.append(key, value);
        }
        match event.get("_id") {
            Ok(Some(token)) => record.append(cstr!("token"), token),
            _ => return Err("the event has no token".into()),
        }
        if let Ok(time) = event.get_timestamp("clusterTime") {
            record.append(cstr!("clusterTime"), time);
        }
        if options.keep_event {
            record.append(cstr!("event"), event);
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaped(payload: &str) -> Shaped {
        Shaped {
            id: "e1".into(),
            event_type: "PaymentCaptured".into(),
            schema_version: 2,
            aggregate_id: r#"{"$oid": "65a1b2c3d4e5f60718293a4b"}"#.into(),
            aggregate_version: Some("7".into()),
            payload: payload.into(),
        }
    }

    fn build(shape: &Shaped, keep_event: bool) -> Result<Document, String> {
        let record = build_raw(shape, keep_event)?;
        Ok(Document::try_from(record.as_ref()).expect("a record decodes"))
    }

    fn build_raw(shape: &Shaped, keep_event: bool) -> Result<RawDocumentBuf, String> {
        let head = bson::rawdoc! { "_id": "c/e1", "consumer": "c", "source": "db.orders" };
        let event = bson::rawdoc! {
            "_id": { "_data": "82" },
            "operationType": "insert",
            "clusterTime": bson::Timestamp { time: 5, increment: 1 },
        };
        shape.record(
            head,
            &event,
            OutboxOptions {
                keep_event,
                ..OutboxOptions::default()
            },
        )
    }

    #[test]
    fn a_shaped_record_keeps_its_fields_in_order_each_once() {
        let keys = |record: &RawDocumentBuf| -> Vec<String> {
            record
                .iter()
                .map(|element| element.unwrap().0.as_str().to_string())
                .collect()
        };
        let order = [
            "_id",
            "consumer",
            "source",
            "eventType",
            "schemaVersion",
            "aggregateId",
            "aggregateVersion",
            "payload",
            "token",
            "clusterTime",
            "event",
        ];
        let full = build_raw(&shaped(r#"{"n": 1}"#), true).unwrap();
        assert_eq!(keys(&full), order);
        // Without a version and the kept event, the others keep their order.
        let mut lean = shaped(r#"{"n": 1}"#);
        lean.aggregate_version = None;
        let expected: Vec<&str> = order
            .into_iter()
            .filter(|key| !["aggregateVersion", "event"].contains(key))
            .collect();
        assert_eq!(keys(&build_raw(&lean, false).unwrap()), expected);
    }

    #[test]
    fn a_shaped_record_keeps_types_and_its_token() {
        let record = build(
            &shaped(r#"{"amount": {"$numberDecimal": "9.50"}, "n": 1}"#),
            true,
        )
        .expect("valid");
        assert_eq!(record.get_str("eventType").unwrap(), "PaymentCaptured");
        assert_eq!(record.get_i64("schemaVersion").unwrap(), 2);
        assert!(matches!(record.get("aggregateId"), Some(Bson::ObjectId(_))));
        assert_eq!(record.get("aggregateVersion"), Some(&Bson::Int32(7)));
        let payload = record.get_document("payload").unwrap();
        assert!(matches!(payload.get("amount"), Some(Bson::Decimal128(_))));
        assert_eq!(record.get_document("token").unwrap(), &doc! {"_data": "82"});
        assert!(record.get_timestamp("clusterTime").is_ok());
        assert!(record.contains_key("event"));
        let lean = build(&shaped("{}"), false).unwrap();
        assert!(!lean.contains_key("event"));
        assert!(lean.contains_key("token"));
    }

    #[test]
    fn hostile_parts_are_refused_with_a_reason() {
        for (payload, needle) in [
            ("[1]", "must be a document"),
            ("7", "must be a document"),
            (r#"{"_id": 1}"#, "`_id`"),
            (r#"{"a": {"$set": 1}}"#, "`$`"),
            (r#"{"a": [{"$where": "1"}]}"#, "`$`"),
            ("{\"a\\u0000b\": 1}", "NUL"),
            ("{", "not JSON"),
            (r#"{"a": {"$date": "not a date"}}"#, "Extended JSON"),
        ] {
            let error = build(&shaped(payload), true).expect_err(payload);
            assert!(error.contains(needle), "{payload}: {error}");
        }
        let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
        let error = build(&shaped(&format!("{{\"a\": {deep}}}")), true).expect_err("deep");
        assert!(error.contains("not JSON"), "{error}");
        let huge = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_PAYLOAD_TEXT));
        assert!(build(&shaped(&huge), true).unwrap_err().contains("over"));
        for event_type in ["", "Payment Captured", &"a".repeat(101), "ä"] {
            let mut shape = shaped("{}");
            shape.event_type = event_type.into();
            assert!(build(&shape, true).unwrap_err().contains("eventType"));
        }
        let mut shape = shaped("{}");
        shape.aggregate_id = "x".repeat(2000);
        assert!(build(&shape, true).unwrap_err().contains("aggregateId"));
        shape.aggregate_id = r#"{"$bad": 1}"#.into();
        assert!(build(&shape, true).is_err());
        for compound in [r#"{"a": 1}"#, "[1, 2]"] {
            shape.aggregate_id = compound.into();
            assert!(
                build(&shape, true)
                    .unwrap_err()
                    .contains("not a document or array")
            );
        }
        shape.aggregate_id = "\"o-1\"".into();
        shape.aggregate_version = Some(r#"{"v": 1}"#.into());
        assert!(
            build(&shape, true)
                .unwrap_err()
                .contains("aggregateVersion")
        );
    }

    #[test]
    fn keys_inside_a_javascript_scope_are_checked_too() {
        for scope in [r#"{"$where": 1}"#, r#"{"a\u0000b": 1}"#] {
            let payload = format!(r#"{{"f": {{"$code": "x", "$scope": {scope}}}}}"#);
            let error = build(&shaped(&payload), true).expect_err(&payload);
            assert!(error.contains("the payload"), "{payload}: {error}");
        }
        // A converter's message quotes the value it refused; the refusal does not.
        let error = build(&shaped(r#"{"at": {"$date": "secret-value"}}"#), true).unwrap_err();
        assert!(!error.contains("secret-value"), "{error}");
    }

    #[test]
    fn json_values_bound_what_a_payload_parses_into() {
        assert_eq!(json_values("{}"), 2);
        assert_eq!(json_values("[0,0,0]"), 4);
        assert_eq!(json_values(r#"{"a": 1, "b": [1, 2]}"#), 5);
        // Commas, brackets and escaped quotes inside strings are not values.
        assert_eq!(json_values(r#"{"a": "x,[{\",y"}"#), 2);
        let many = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(json_values(&many), 1002);
    }
}
