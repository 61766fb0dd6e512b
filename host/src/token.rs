//! Canonical token text: how resume tokens cross the policy boundary.
//!
//! A token is printed exactly as PyMongo's `bson.json_util.dumps(token, sort_keys=True)` prints it:
//! relaxed Extended JSON, keys sorted at every level, `", "` and `": "` separators, non-ASCII
//! escaped as `\uXXXX`. The default event ID is the SHA-256 of this text, so it must be
//! byte-identical to the baseline task's. The `bson` crate maps each BSON value to its relaxed
//! Extended JSON form; this module only reproduces Python's `json.dumps` layout of that value.

use bson::{Bson, Document};
use serde_json::Value;

/// The canonical text of a token document.
pub fn canonical_text(token: &Document) -> String {
    let mut out = String::with_capacity(128);
    write_value(
        &Bson::Document(token.clone()).into_relaxed_extjson(),
        &mut out,
    );
    out
}

/// The canonical text of any BSON value (used for `field` lookups).
pub fn value_text(value: &Bson) -> String {
    let mut out = String::new();
    write_value(&value.clone().into_relaxed_extjson(), &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else if let Some(f) = n.as_f64() {
                out.push_str(&python_float_repr(f));
            }
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(key, out);
                out.push_str(": ");
                write_value(&map[key], out);
            }
            out.push('}');
        }
    }
}

/// Python's `json.dumps` string encoding with `ensure_ascii=True`.
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e && (c as u32) != 0x7f => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-tripping digits, fixed notation for exponents in
/// -4..16 and `1e+16` style otherwise. Non-finite values never reach here (relaxed Extended JSON
/// wraps them in `$numberDouble`).
fn python_float_repr(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // `{:e}` gives the shortest round-tripping digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // position of the decimal point within `digits`
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn every_vector_prints_like_pymongo() {
        let vectors: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/event-id-vectors.json"))
                .expect("vectors parse");
        let vectors = vectors.as_array().expect("vector list");
        assert!(vectors.len() >= 5);
        for vector in vectors {
            let input = vector["token_canonical_extjson"].as_str().expect("input");
            let value: Value = serde_json::from_str(input).expect("json");
            let token = Document::try_from(value.as_object().expect("object").clone())
                .expect("extended json");
            assert_eq!(
                canonical_text(&token),
                vector["pymongo_dumps_sort_keys"]
                    .as_str()
                    .expect("expected"),
                "{}",
                vector["name"]
            );
        }
    }

    #[test]
    fn keys_sort_at_every_level_and_strings_escape_like_python() {
        let token = doc! { "b": { "z": 1, "a": "é\n\"\u{1F600}" }, "a": [true, Bson::Null] };
        assert_eq!(
            canonical_text(&token),
            r#"{"a": [true, null], "b": {"a": "\u00e9\n\"\ud83d\ude00", "z": 1}}"#
        );
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (value, expected) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (123456789.125, "123456789.125"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(python_float_repr(value), expected);
        }
    }

    #[test]
    fn int64_and_timestamps_are_relaxed() {
        let token = doc! { "n": 5_i64, "ts": bson::Timestamp { time: 7, increment: 2 } };
        assert_eq!(
            canonical_text(&token),
            r#"{"n": 5, "ts": {"$timestamp": {"i": 2, "t": 7}}}"#
        );
    }
}
