//! Recorded change streams: JSON Lines of Extended JSON.
//!
//! Each line is a change event as MongoDB delivered it, or a control line:
//! - `{"$postBatchResumeToken": <token>}`: a batch ends here; the stream's watermark becomes this token;
//! - `{"$error": {"code": 286, "codeName": "ChangeStreamHistoryLost", "errmsg": "…"}}`: the server
//!   fails the stream at this point;
//! - `{"$deployment": {"setName": …, "replicaSetId": …, "source": "db.coll"}}` (a replica set) or
//!   `{"$deployment": {"clusterId": …, "source": "db.coll"}}` (a sharded cluster): optional, first
//!   line only.
//!
//! Blank lines are ignored. Anything else is refused with its line number, and so is an event whose
//! resume token (by its canonical text, hence its event ID) repeats an earlier event's: a stream
//! never delivers one token twice, and a resume could not tell the two apart.

use std::collections::HashMap;

use bson::{Bson, Document};
use serde_json::Value;

use crate::error::{HandoffError, Result};
use crate::token::canonical_text;
use crate::{Deployment, ServerError};

/// The deployment a fixture was recorded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedDeployment {
    /// A replica set (`setName`, `replicaSetId`) or a sharded cluster (`clusterId`).
    pub deployment: Deployment,
    pub source: String,
}

/// One line of a recorded stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Event { event: Document, token_text: String },
    PostBatch { token: Document, token_text: String },
    Error(ServerError),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fixture {
    pub deployment: Option<RecordedDeployment>,
    pub entries: Vec<Entry>,
}

fn bad(line: usize, what: impl std::fmt::Display) -> HandoffError {
    HandoffError::BadInput(format!("fixture line {line}: {what}"))
}

fn token_document(line: usize, value: &Value, what: &str) -> Result<Document> {
    let Value::Object(map) = value else {
        return Err(bad(line, format!("{what} must be a document")));
    };
    Document::try_from(map.clone())
        .map_err(|e| bad(line, format!("{what} is not Extended JSON: {e}")))
}

fn string_field(
    line: usize,
    map: &serde_json::Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<String> {
    map.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| bad(line, format!("{what} needs a string `{key}`")))
}

impl Fixture {
    pub fn parse(text: &str) -> Result<Fixture> {
        let mut fixture = Fixture::default();
        let mut seen_content = false;
        let mut event_lines: HashMap<String, usize> = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let value: Value =
                serde_json::from_str(raw).map_err(|e| bad(line, format!("not JSON: {e}")))?;
            let Value::Object(map) = value else {
                return Err(bad(line, "each line must be a JSON object"));
            };
            if let Some(deployment) = map.get("$deployment") {
                if seen_content || map.len() != 1 {
                    return Err(bad(
                        line,
                        "`$deployment` must be the only key of the first line",
                    ));
                }
                let Value::Object(d) = deployment else {
                    return Err(bad(line, "`$deployment` must be a document"));
                };
                let deployment = match (d.get("clusterId"), d.get("replicaSetId")) {
                    (Some(_), Some(_)) => {
                        return Err(bad(
                            line,
                            "`$deployment` names a replica set (`setName`, `replicaSetId`) or a \
                             sharded cluster (`clusterId`), not both",
                        ));
                    }
                    (Some(_), None) => Deployment::sharded_cluster(string_field(
                        line,
                        d,
                        "clusterId",
                        "`$deployment`",
                    )?),
                    (None, _) => Deployment::replica_set(
                        string_field(line, d, "setName", "`$deployment`")?,
                        string_field(line, d, "replicaSetId", "`$deployment`")?,
                    ),
                };
                fixture.deployment = Some(RecordedDeployment {
                    deployment,
                    source: string_field(line, d, "source", "`$deployment`")?,
                });
            } else if let Some(token) = map.get("$postBatchResumeToken") {
                if map.len() != 1 {
                    return Err(bad(line, "`$postBatchResumeToken` must be the only key"));
                }
                let token = token_document(line, token, "`$postBatchResumeToken`")?;
                let token_text = canonical_text(&token);
                fixture.entries.push(Entry::PostBatch { token, token_text });
            } else if let Some(error) = map.get("$error") {
                let Value::Object(e) = error else {
                    return Err(bad(line, "`$error` must be a document"));
                };
                let code = e
                    .get("code")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok())
                    .ok_or_else(|| bad(line, "`$error` needs an integer `code`"))?;
                fixture.entries.push(Entry::Error(ServerError {
                    code: Some(code),
                    code_name: e
                        .get("codeName")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    message: e
                        .get("errmsg")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                }));
            } else if let Some(key) = map.keys().find(|k| k.starts_with('$')) {
                return Err(bad(line, format!("unknown control line `{key}`")));
            } else {
                let event = Document::try_from(map)
                    .map_err(|e| bad(line, format!("event is not Extended JSON: {e}")))?;
                let token = match event.get("_id") {
                    Some(Bson::Document(token)) => token,
                    _ => return Err(bad(line, "an event needs a resume token document in `_id`")),
                };
                // A split event's later fragments (`splitEvent`) carry only some of its fields.
                if event.get_str("operationType").is_err() && !event.contains_key("splitEvent") {
                    return Err(bad(line, "an event needs a string `operationType`"));
                }
                let token_text = canonical_text(token);
                if let Some(first) = event_lines.insert(token_text.clone(), line) {
                    return Err(bad(
                        line,
                        format!("the event repeats the resume token of line {first}"),
                    ));
                }
                fixture.entries.push(Entry::Event { event, token_text });
            }
            seen_content = true;
        }
        Ok(fixture)
    }

    pub fn read(path: &std::path::Path) -> Result<Fixture> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            HandoffError::BadInput(format!("cannot read fixture {}: {e}", path.display()))
        })?;
        Fixture::parse(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"$deployment": {"setName": "rs0", "replicaSetId": "65f000000000000000000001", "source": "shop.orders"}}
{"_id": {"_data": "8200000001"}, "operationType": "insert", "documentKey": {"_id": 1}}

{"$postBatchResumeToken": {"_data": "8200000002"}}
{"$error": {"code": 286, "codeName": "ChangeStreamHistoryLost", "errmsg": "gone"}}
"#;

    #[test]
    fn a_recording_names_a_replica_set_or_a_sharded_cluster() {
        let replica_set = Fixture::parse(GOOD).unwrap().deployment.unwrap();
        assert_eq!(
            replica_set.deployment,
            Deployment::replica_set("rs0", "65f000000000000000000001")
        );
        let cluster = Fixture::parse(
            r#"{"$deployment": {"clusterId": "66a000000000000000000001", "source": "shop.orders"}}"#,
        )
        .unwrap()
        .deployment
        .unwrap();
        assert_eq!(
            cluster.deployment,
            Deployment::sharded_cluster("66a000000000000000000001")
        );
        let both = Fixture::parse(
            r#"{"$deployment": {"setName": "rs0", "replicaSetId": "65f000000000000000000001", "clusterId": "66a000000000000000000001", "source": "shop.orders"}}"#,
        );
        assert!(
            matches!(&both, Err(HandoffError::BadInput(m)) if m.contains("not both")),
            "{both:?}"
        );
    }

    #[test]
    fn parses_events_and_control_lines() {
        let fixture = Fixture::parse(GOOD).unwrap();
        assert_eq!(fixture.deployment.as_ref().unwrap().source, "shop.orders");
        assert_eq!(fixture.entries.len(), 3);
        assert!(
            matches!(&fixture.entries[0], Entry::Event { token_text, .. } if token_text == r#"{"_data": "8200000001"}"#)
        );
        assert!(matches!(&fixture.entries[1], Entry::PostBatch { .. }));
        assert!(matches!(&fixture.entries[2], Entry::Error(e) if e.code == Some(286)));
    }

    #[test]
    fn keeps_the_event_as_delivered() {
        let fixture = Fixture::parse(
            r#"{"_id": {"_data": "82"}, "operationType": "insert", "z": 1, "a": {"$numberLong": "5"}}"#,
        )
        .unwrap();
        let Entry::Event { event, .. } = &fixture.entries[0] else {
            panic!()
        };
        let keys: Vec<_> = event.keys().collect();
        assert_eq!(keys, ["_id", "operationType", "z", "a"]);
        assert_eq!(event.get("a"), Some(&Bson::Int64(5)));
    }

    #[test]
    fn refuses_broken_lines_with_their_number() {
        for (text, needle) in [
            (
                "{\"_id\": {\"_data\": \"82\"}, \"operationType\": \"insert\"}\n{oops",
                "line 2: not JSON",
            ),
            ("[1, 2]", "line 1: each line must be a JSON object"),
            ("{\"operationType\": \"insert\"}", "resume token document"),
            (
                "{\"_id\": \"x\", \"operationType\": \"insert\"}",
                "resume token document",
            ),
            ("{\"_id\": {\"_data\": \"82\"}}", "operationType"),
            ("{\"$postBatchResumeToken\": 5}", "must be a document"),
            ("{\"$error\": {\"codeName\": \"x\"}}", "integer `code`"),
            ("{\"$bogus\": 1}", "unknown control line"),
            (
                "{\"_id\": {\"_data\": \"82\"}, \"operationType\": \"insert\"}\n{\"$deployment\": {}}",
                "first line",
            ),
            (
                "{\"_id\": {\"$oid\": \"zz\"}, \"operationType\": \"insert\"}",
                "Extended JSON",
            ),
        ] {
            let error = Fixture::parse(text).unwrap_err();
            assert!(matches!(error, HandoffError::BadInput(_)));
            assert!(error.to_string().contains(needle), "{text}: {error}");
        }
    }

    #[test]
    fn refuses_an_event_that_repeats_a_token() {
        // The same token with its keys in another order is the same token (the same event ID).
        let text = concat!(
            "{\"_id\": {\"_data\": \"8201\", \"k\": 1}, \"operationType\": \"insert\"}\n",
            "{\"$postBatchResumeToken\": {\"k\": 1, \"_data\": \"8201\"}}\n",
            "{\"_id\": {\"_data\": \"8202\"}, \"operationType\": \"insert\"}\n",
            "\n",
            "{\"_id\": {\"k\": 1, \"_data\": \"8201\"}, \"operationType\": \"update\"}\n",
        );
        let error = Fixture::parse(text).unwrap_err();
        assert!(matches!(error, HandoffError::BadInput(_)));
        assert_eq!(
            error.to_string(),
            HandoffError::BadInput(
                "fixture line 5: the event repeats the resume token of line 1".into()
            )
            .to_string()
        );
        // A batch end may carry the last event's token, as a server's does.
        let fixture = Fixture::parse(&text[..text.rfind("{\"_id\"").unwrap()]).unwrap();
        assert_eq!(fixture.entries.len(), 3);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
            let _ = Fixture::parse(&text);
        }

        #[test]
        fn never_panics_on_json_shaped_lines(key in "[$a-z_]{1,12}", value in "[0-9a-z\"{}:, ]{0,40}") {
            let _ = Fixture::parse(&format!("{{\"{key}\": {value}}}"));
        }
    }
}
