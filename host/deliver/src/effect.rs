//! The lane a record is admitted in: its source document's key, so that the records of one
//! key are delivered in order. What a record's effect is lives in
//! [`handoff_domain::effect`] (the policy's, or the default's).

use bson::Document;

use handoff_domain::effect::source_key;
use handoff_domain::token::canonical_text;

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

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn lanes_are_keys_and_a_keyless_record_is_a_lane_of_its_own() {
        let record = doc! { "_id": "c/x", "event": { "documentKey": { "_id": 5 } } };
        assert_eq!(lane_of(&record), "{\"k\": 5}");
        assert_eq!(
            lane_of(&doc! { "_id": "c/y", "aggregateId": "o-1" }),
            "{\"k\": \"o-1\"}"
        );
        assert_eq!(lane_of(&doc! { "_id": "c/z" }), "record:c/z");
        let long = doc! { "_id": "c/w", "aggregateId": "x".repeat(1000) };
        assert!(lane_of(&long).starts_with("sha256:"));
    }
}
