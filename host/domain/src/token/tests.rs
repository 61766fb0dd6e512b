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
        "../../../../tests/fixtures/event-id-vectors.json"
    ))
    .expect("vectors parse");
    let vectors = vectors.as_array().expect("vector list");
    assert!(vectors.len() >= 5);
    for vector in vectors {
        let input = vector["token_canonical_extjson"].as_str().expect("input");
        let value: Value = serde_json::from_str(input).expect("json");
        let token =
            Document::try_from(value.as_object().expect("object").clone()).expect("extended json");
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
