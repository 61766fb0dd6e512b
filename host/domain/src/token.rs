//! Canonical token text: how resume tokens cross the policy boundary.
//!
//! A token is printed exactly as PyMongo 4's `bson.json_util.dumps(token, sort_keys=True)` prints
//! the token PyMongo decoded from the server's BSON (default codec options): relaxed Extended
//! JSON, keys sorted at every level, `", "` and `": "` separators, everything outside `' '..='~'`
//! escaped as `\uXXXX`. The default event ID is the SHA-256 of this text, so it must be
//! byte-identical to the baseline task's. Each BSON type is written here the way PyMongo decodes
//! and then encodes it, which differs in places from the `bson` crate's relaxed Extended JSON:
//! - a date in `1970-01-01T00:00:00Z..=9999-12-31T23:59:59.999Z` is `{"$date": "…"}` with
//!   milliseconds as `.%03d`, left out when zero; any other date is `{"$date": {"$numberLong": "…"}}`;
//! - every double NaN is `{"$numberDouble": "NaN"}`, whatever its sign;
//! - regular-expression options are PyMongo's flags, in the order `ilmsux`, others dropped;
//! - a symbol is a string, `undefined` is `null`, a DBPointer is `{"$id": …, "$ref": …}`;
//! - an embedded document that PyMongo decodes as a DBRef (string `$ref`, an `$id`, `$db` a
//!   string, null or absent) drops a null `$db`.

use bson::{Bson, Document};

/// The last millisecond PyMongo prints as an ISO date: 9999-12-31T23:59:59.999Z.
const MAX_ISO_MILLIS: i64 = 253_402_300_799_999;

/// The canonical text of a token document.
pub fn canonical_text(token: &Document) -> String {
    let mut out = String::with_capacity(128);
    write_document(token, false, &mut out);
    out
}

/// The canonical text of any BSON value found inside a token (used for `field` lookups).
pub fn value_text(value: &Bson) -> String {
    let mut out = String::new();
    write_bson(value, &mut out);
    out
}

/// A document's entries with sorted keys. `embedded` documents follow PyMongo's DBRef decoding;
/// the top-level document and a code scope are decoded as plain documents.
fn write_document(doc: &Document, embedded: bool, out: &mut String) {
    let dbref = embedded
        && matches!(doc.get("$ref"), Some(Bson::String(_)))
        && doc.contains_key("$id")
        && matches!(doc.get("$db"), None | Some(Bson::String(_) | Bson::Null));
    let mut entries: Vec<(&String, &Bson)> = doc
        .iter()
        .filter(|(key, value)| !(dbref && key.as_str() == "$db" && **value == Bson::Null))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_string(key, out);
        out.push_str(": ");
        write_bson(value, out);
    }
    out.push('}');
}

/// A wrapper's key and the writer of its value.
type Field<'a> = (&'a str, &'a dyn Fn(&mut String));

/// Writes `{"k1": v1, "k2": v2}` for a wrapper whose keys are already sorted.
fn write_wrapper(out: &mut String, fields: &[Field<'_>]) {
    out.push('{');
    for (i, (key, write)) in fields.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_string(key, out);
        out.push_str(": ");
        write(out);
    }
    out.push('}');
}

fn write_bson(value: &Bson, out: &mut String) {
    match value {
        Bson::Null | Bson::Undefined => out.push_str("null"),
        Bson::Boolean(true) => out.push_str("true"),
        Bson::Boolean(false) => out.push_str("false"),
        Bson::Int32(n) => out.push_str(&n.to_string()),
        Bson::Int64(n) => out.push_str(&n.to_string()),
        Bson::Double(f) if f.is_nan() => number_double(out, "NaN"),
        Bson::Double(f) if f.is_infinite() => {
            number_double(out, if *f > 0.0 { "Infinity" } else { "-Infinity" })
        }
        Bson::Double(f) => out.push_str(&python_float_repr(*f)),
        Bson::String(s) | Bson::Symbol(s) => write_string(s, out),
        Bson::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_bson(item, out);
            }
            out.push(']');
        }
        Bson::Document(doc) => write_document(doc, true, out),
        Bson::RegularExpression(regex) => {
            let options: String = "ilmsux"
                .chars()
                .filter(|flag| regex.options.as_str().contains(*flag))
                .collect();
            write_wrapper(
                out,
                &[("$regularExpression", &|out| {
                    write_wrapper(
                        out,
                        &[
                            ("options", &|out| write_string(&options, out)),
                            ("pattern", &|out| write_string(regex.pattern.as_str(), out)),
                        ],
                    )
                })],
            );
        }
        Bson::JavaScriptCode(code) => {
            write_wrapper(out, &[("$code", &|out| write_string(code, out))]);
        }
        Bson::JavaScriptCodeWithScope(code) => write_wrapper(
            out,
            &[
                ("$code", &|out| write_string(&code.code, out)),
                ("$scope", &|out| write_document(&code.scope, false, out)),
            ],
        ),
        Bson::Timestamp(ts) => write_wrapper(
            out,
            &[("$timestamp", &|out| {
                write_wrapper(
                    out,
                    &[
                        ("i", &|out| out.push_str(&ts.increment.to_string())),
                        ("t", &|out| out.push_str(&ts.time.to_string())),
                    ],
                )
            })],
        ),
        Bson::Binary(binary) => {
            // The bson crate's relaxed form carries the standard, padded base64 PyMongo prints.
            let relaxed = value.clone().into_relaxed_extjson();
            let base64 = relaxed["$binary"]["base64"].as_str().unwrap_or_default();
            let subtype = format!("{:02x}", u8::from(binary.subtype));
            write_wrapper(
                out,
                &[("$binary", &|out| {
                    write_wrapper(
                        out,
                        &[
                            ("base64", &|out| write_string(base64, out)),
                            ("subType", &|out| write_string(&subtype, out)),
                        ],
                    )
                })],
            );
        }
        Bson::ObjectId(oid) => {
            write_wrapper(out, &[("$oid", &|out| write_string(&oid.to_hex(), out))]);
        }
        Bson::DateTime(date) => {
            let millis = date.timestamp_millis();
            if (0..=MAX_ISO_MILLIS).contains(&millis) {
                let iso = iso_date(millis);
                write_wrapper(out, &[("$date", &|out| write_string(&iso, out))]);
            } else {
                let text = millis.to_string();
                write_wrapper(
                    out,
                    &[("$date", &|out| {
                        write_wrapper(out, &[("$numberLong", &|out| write_string(&text, out))])
                    })],
                );
            }
        }
        Bson::Decimal128(decimal) => {
            let text = decimal.to_string();
            write_wrapper(out, &[("$numberDecimal", &|out| write_string(&text, out))]);
        }
        Bson::MinKey => write_wrapper(out, &[("$minKey", &|out| out.push('1'))]),
        Bson::MaxKey => write_wrapper(out, &[("$maxKey", &|out| out.push('1'))]),
        Bson::DbPointer(_) => {
            // PyMongo decodes a DBPointer as DBRef(namespace, id): {"$ref": …, "$id": ObjectId}.
            let relaxed = value.clone().into_relaxed_extjson();
            let pointer = &relaxed["$dbPointer"];
            let namespace = pointer["$ref"].as_str().unwrap_or_default();
            let oid = pointer["$id"]["$oid"].as_str().unwrap_or_default();
            write_wrapper(
                out,
                &[
                    ("$id", &|out| {
                        write_wrapper(out, &[("$oid", &|out| write_string(oid, out))])
                    }),
                    ("$ref", &|out| write_string(namespace, out)),
                ],
            );
        }
    }
}

fn number_double(out: &mut String, text: &str) {
    write_wrapper(out, &[("$numberDouble", &|out| write_string(text, out))]);
}

/// `%Y-%m-%dT%H:%M:%S` plus `.%03d` milliseconds when they are not zero, then `Z`, for
/// `0 <= millis <= MAX_ISO_MILLIS`.
fn iso_date(millis: i64) -> String {
    let (days, in_day) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let seconds = in_day / 1000;
    let (hour, minute, second) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let fraction = match in_day % 1000 {
        0 => String::new(),
        ms => format!(".{ms:03}"),
    };
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{fraction}Z")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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
            c if !(' '..='~').contains(&c) => {
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

/// Python's `repr(float)`: the shortest digits that round-trip, the nearest to the exact value
/// (ties to even, as David Gay's `dtoa` does; the standard library's formatting breaks some ties
/// the other way, the `ryu` algorithm behind `serde_json` does not), fixed notation for exponents
/// in -4..16 and `1e+16` style otherwise. Non-finite values never reach here (they are written as
/// `$numberDouble`).
fn python_float_repr(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    let shortest = serde_json::to_string(&f).unwrap_or_else(|_| format!("{f:e}"));
    let (digits, exp) = shortest_digits(&shortest);
    let sign = if f.is_sign_negative() { "-" } else { "" };
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

/// The significant digits (no leading or trailing zeros, at least one digit) and the decimal
/// exponent of the first digit, of a number printed as `-12.5`, `0.00012` or `1.5e-7`.
fn shortest_digits(text: &str) -> (String, i32) {
    let (mantissa, exp) = text.split_once(['e', 'E']).unwrap_or((text, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let int: String = int.chars().filter(char::is_ascii_digit).collect();
    let all = format!("{int}{frac}");
    let leading = all.chars().take_while(|c| *c == '0').count();
    let digits = all[leading..].trim_end_matches('0');
    if digits.is_empty() {
        return ("0".to_string(), 0);
    }
    // The first significant digit stands `int.len() - 1 - leading` places from the point.
    (
        digits.to_string(),
        exp + int.len() as i32 - 1 - leading as i32,
    )
}

/// The cluster time a resume token stands at, decoded from its `_data`: hex whose first byte is
/// the type tag of a timestamp (`0x82`) followed by the timestamp, 8 bytes big-endian (seconds,
/// then increment). `None` for a token in another format (an old binary `_data`, a foreign
/// document): callers report "unknown" rather than guess.
pub fn cluster_time(token: &Document) -> Option<bson::Timestamp> {
    let data = token.get_str("_data").ok()?;
    let head = data.get(..18)?;
    let bytes = hex::decode(head).ok()?;
    if bytes[0] != 0x82 {
        return None;
    }
    let time = u32::from_be_bytes(bytes[1..5].try_into().ok()?);
    let increment = u32::from_be_bytes(bytes[5..9].try_into().ok()?);
    Some(bson::Timestamp { time, increment })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_tokens_cluster_time_is_read_from_its_data() {
        // A token MongoDB 7.0 delivered for an insert at Timestamp(1700000000, 3).
        let token = doc! { "_data": "826553F1000000000301046400000000000000000000001E5A1004" };
        assert_eq!(
            cluster_time(&token),
            Some(bson::Timestamp {
                time: 1_700_000_000,
                increment: 3
            })
        );
        let lower = doc! { "_data": "826553f10000000003" };
        assert_eq!(cluster_time(&lower).map(|t| t.increment), Some(3));
        for foreign in [
            doc! {},
            doc! { "_data": 7 },
            doc! { "_data": "82" },
            doc! { "_data": "816553F10000000003" },
            doc! { "_data": "82zz53F10000000003" },
            doc! { "_data": "é26553F10000000003" },
        ] {
            assert_eq!(cluster_time(&foreign), None, "{foreign}");
        }
    }
    use serde_json::Value;

    #[test]
    fn every_vector_prints_like_pymongo() {
        let vectors: Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/event-id-vectors.json"
        ))
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
            (-205948727949881.62, "-205948727949881.62"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.00012, "0.00012"),
            (1e-5, "1e-05"),
            (123456789012345680.0, "1.2345678901234568e+17"),
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
    #[test]
    fn del_and_every_non_printable_character_are_escaped() {
        let token = doc! { "s": "a\u{7f}b\u{1f}\u{2028}~ " };
        assert_eq!(canonical_text(&token), r#"{"s": "a\u007fb\u001f\u2028~ "}"#);
    }

    #[test]
    fn dates_print_as_pymongo_does() {
        let date = |millis| Bson::DateTime(bson::DateTime::from_millis(millis));
        let token = doc! {
            "d100": date(1_700_000_000_100),
            "d0": date(1_700_000_000_000),
            "d5": date(5),
            "neg": date(-1),
            "max": date(253_402_300_799_999),
            "over": date(253_402_300_800_000),
            "leap": date(951_782_400_010),
        };
        assert_eq!(
            canonical_text(&token),
            concat!(
                r#"{"d0": {"$date": "2023-11-14T22:13:20Z"}, "d100": {"$date": "2023-11-14T22:13:20.100Z"}, "#,
                r#""d5": {"$date": "1970-01-01T00:00:00.005Z"}, "leap": {"$date": "2000-02-29T00:00:00.010Z"}, "#,
                r#""max": {"$date": "9999-12-31T23:59:59.999Z"}, "neg": {"$date": {"$numberLong": "-1"}}, "#,
                r#""over": {"$date": {"$numberLong": "253402300800000"}}}"#
            )
        );
    }

    #[test]
    fn doubles_regexes_and_legacy_types_print_as_pymongo_does() {
        let token = doc! {
            "nan": f64::from_bits(0xfff8_0000_0000_0000),
            "inf": f64::NEG_INFINITY,
            "z": -0.0,
            "f": 1e16,
            "r": bson::Regex { pattern: "a.b".try_into().unwrap(), options: "lqisxum".try_into().unwrap() },
            "sym": Bson::Symbol("abc".into()),
            "und": Bson::Undefined,
        };
        assert_eq!(
            canonical_text(&token),
            concat!(
                r#"{"f": 1e+16, "inf": {"$numberDouble": "-Infinity"}, "nan": {"$numberDouble": "NaN"}, "#,
                r#""r": {"$regularExpression": {"options": "ilmsux", "pattern": "a.b"}}, "sym": "abc", "und": null, "z": -0.0}"#
            )
        );
    }

    #[test]
    fn dbpointers_and_embedded_dbrefs_print_as_pymongo_decodes_them() {
        let pointer: Value = serde_json::from_str(
            r#"{"ptr": {"$dbPointer": {"$ref": "db.coll", "$id": {"$oid": "65f000000000000000000001"}}}}"#,
        )
        .unwrap();
        let mut token = Document::try_from(pointer.as_object().unwrap().clone()).unwrap();
        assert!(matches!(token.get("ptr"), Some(Bson::DbPointer(_))));
        let dbref = doc! { "$ref": "a", "$id": 1, "$db": Bson::Null, "x": 1 };
        token.insert("n", dbref.clone());
        token.insert("arr", vec![Bson::Document(dbref.clone())]);
        token.insert(
            "c",
            bson::JavaScriptCodeWithScope {
                code: "x".into(),
                scope: dbref.clone(),
            },
        );
        assert_eq!(
            canonical_text(&token),
            concat!(
                r#"{"arr": [{"$id": 1, "$ref": "a", "x": 1}], "c": {"$code": "x", "$scope": {"$db": null, "$id": 1, "$ref": "a", "x": 1}}, "#,
                r#""n": {"$id": 1, "$ref": "a", "x": 1}, "ptr": {"$id": {"$oid": "65f000000000000000000001"}, "$ref": "db.coll"}}"#
            )
        );
        // The top-level document is never decoded as a DBRef.
        assert_eq!(
            canonical_text(&dbref),
            r#"{"$db": null, "$id": 1, "$ref": "a", "x": 1}"#
        );
    }
}
