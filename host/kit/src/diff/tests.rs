use bson::{Document, doc};
use quick_xml::events::Event;

use super::compare::events_of;
use super::*;

#[test]
fn values_differing_are_not_a_shape_change() {
    let old = doc! { "_id": "c/a", "payload": { "total": 5, "items": ["x"], "tags": [] } };
    let new = doc! { "_id": "c/b", "payload": { "total": 7, "items": ["y", "z"], "tags": ["t"] } };
    assert_eq!(shape_changes(&old, &new), Vec::new());
}

#[test]
fn a_field_added_removed_or_retyped_is_a_shape_change() {
    let old = doc! { "_id": "c/a", "payload": { "total": 5, "note": "n" }, "lines": [{ "q": 1 }] };
    let new =
        doc! { "_id": "c/a", "payload": { "total": "5", "extra": true }, "lines": [{ "q": 1.5 }] };
    let changes: Vec<String> = shape_changes(&old, &new)
        .iter()
        .map(ShapeChange::describe)
        .collect();
    assert_eq!(
        changes,
        [
            "~lines[].q: int -> double",
            "+payload.extra: bool",
            "-payload.note: string",
            "~payload.total: int -> string",
        ]
    );
}

const STREAM: &str = r#"{"_id": {"_data": "8201"}, "operationType": "insert", "fullDocument": {"_id": 1}}
{"_id": {"_data": "8202"}, "operationType": "update"}
{"_id": {"_data": "8203"}, "operationType": "delete"}
{"_id": {"_data": "8204"}, "operationType": "insert"}
{"_id": {"_data": "8205"}, "operationType": "insert"}
"#;

fn raw(id: &str, data: &str) -> Document {
    doc! { "_id": format!("c/{id}"), "consumer": "c", "event": { "_id": { "_data": data } } }
}

fn shaped(id: &str, data: &str, total: bson::Bson) -> Document {
    doc! { "_id": format!("c/{id}"), "consumer": "c", "eventType": "OrderCreated",
    "payload": { "total": total }, "token": { "_data": data } }
}

fn dump(outbox: Vec<Document>, quarantine: Vec<Document>, at: &str) -> handoff_domain::Dump {
    handoff_domain::Dump {
        checkpoint: Some(doc! { "_id": "c", "token": { "_data": at } }),
        outbox,
        quarantine,
    }
}

fn report() -> Report {
    let case = stream_case("s", Fixture::parse(STREAM).unwrap(), None).unwrap();
    let old = dump(
        vec![
            raw("e1", "8201"),
            raw("e2", "8202"),
            raw("e3", "8203"),
            shaped("e4", "8204", 1.into()),
        ],
        Vec::new(),
        "8204",
    );
    let new = dump(
        vec![
            raw("e1", "8201"),
            raw("other-e2", "8202"),
            shaped("e4", "8204", "1".into()),
        ],
        vec![raw("e3", "8203")],
        "8205",
    );
    Report {
        old: ("old.wasm".into(), "a".repeat(64)),
        new: ("new <&> \u{1b}[31m.wasm".into(), "b".repeat(64)),
        source: "s".into(),
        cases: 1,
        events: compare_case(&case, &old, &new),
    }
}

#[test]
fn each_event_is_compared_by_its_token() {
    let report = report();
    let kinds: Vec<Vec<Kind>> = report.events.iter().map(|e| e.kinds.clone()).collect();
    assert_eq!(
        kinds,
        [
            vec![],
            vec![Kind::Id],
            vec![Kind::Decision, Kind::Removed],
            vec![Kind::Shape],
            // Not reached by the old policy, skipped by the new one.
            vec![Kind::Decision],
        ]
    );
    assert_eq!(
        report.events[1].id_changes,
        [("e2".to_string(), "other-e2".to_string())]
    );
    assert_eq!(report.events[2].new.decision, Decision::Quarantine);
    assert_eq!(report.events[4].old.decision, Decision::NotReached);
    assert_eq!(report.events[4].new.decision, Decision::Skip);
    assert_eq!(report.count(Kind::Id), 1);
    assert_eq!(report.differing().count(), 4);
    let human = report.human();
    assert!(
        human.contains("differ:  4 of 5 events: 1 ID changed"),
        "{human}"
    );
    assert!(
        human.contains("id        s event 2 (update): ID changed e2 -> other-e2"),
        "{human}"
    );
    assert!(human.contains("~payload.total: int -> string"), "{human}");
    assert!(!human.contains('\u{1b}'), "{human}");
}

#[test]
fn json_and_junit_tell_every_event() {
    let report = report();
    let json = report.json();
    assert_eq!(json["counts"]["id"], 1);
    assert_eq!(json["counts"]["decision"], 2);
    assert_eq!(json["differences"].as_array().unwrap().len(), 4);
    assert_eq!(json["differences"][0]["id_changes"][0]["new"], "other-e2");
    let xml = report.junit().unwrap();
    let mut reader = quick_xml::Reader::from_str(&xml);
    let (mut cases, mut types) = (0, Vec::new());
    loop {
        match reader.read_event().unwrap() {
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"testcase" => cases += 1,
            Event::Start(e) if e.name().as_ref() == b"failure" => {
                let kind = e.try_get_attribute("type").unwrap().unwrap();
                types.push(kind.unescape_value().unwrap().into_owned());
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(cases, 5);
    assert_eq!(
        types,
        [
            "id-change",
            "decision-change,records-removed",
            "shape-change",
            "decision-change"
        ]
    );
}

#[test]
fn a_split_event_is_one_event() {
    let text = r#"{"_id": {"_data": "8201"}, "operationType": "insert", "splitEvent": {"fragment": 1, "of": 2}}
{"_id": {"_data": "820101"}, "splitEvent": {"fragment": 2, "of": 2}}
{"_id": {"_data": "8202"}, "operationType": "delete"}
"#;
    let (events, _) = events_of(&Fixture::parse(text).unwrap());
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].tokens.len(), 2);
    assert_eq!(events[1].number, 2);
}
