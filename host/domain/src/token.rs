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
mod tests;
