use super::*;
use handoff_policy_sdk::fake::FakeHost;

fn settings(max_events: u32) -> Settings {
    Settings::new(max_events, 3000)
}

#[test]
fn every_event_id_vector_matches() {
    let vectors: serde_json::Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/event-id-vectors.json"
    ))
    .unwrap();
    let vectors = vectors.as_array().unwrap();
    assert!(vectors.len() >= 5);
    for vector in vectors {
        let text = vector["pymongo_dumps_sort_keys"].as_str().unwrap();
        let expected = vector["event_id"].as_str().unwrap();
        assert_eq!(event_id(text), expected, "{}", vector["name"]);
    }
}

#[test]
fn events_are_committed_one_per_transaction_in_order_with_their_ids() {
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "update")
        .event("C", "delete")
        .watermark("W");
    let report = run(&mut host, &settings(50)).unwrap();
    assert_eq!(report.status, Status::HandedOff);
    assert_eq!(report.events_handed_off, 3);
    assert_eq!(report.last_event_id, event_id("C"));
    assert!(host.commits.iter().all(|c| c.decisions.len() == 1));
    assert_eq!(
        host.handed_off(),
        vec![event_id("A"), event_id("B"), event_id("C")]
    );
    assert_eq!(
        host.advances,
        vec![(Some("C".to_string()), "W".to_string())]
    );
}

#[test]
fn max_events_stops_without_a_watermark() {
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "insert")
        .event("C", "insert")
        .watermark("W");
    let report = run(&mut host, &settings(2)).unwrap();
    assert_eq!(report.events_handed_off, 2);
    assert_eq!(host.token(), Some("B"));
    assert!(host.advances.is_empty());
}

#[test]
fn invalidate_saves_start_after_without_outbox_and_stops() {
    let mut host = FakeHost::new()
        .event("A", "drop")
        .event("B", "invalidate")
        .event("C", "insert")
        .watermark("W");
    let report = run(&mut host, &settings(50)).unwrap();
    assert_eq!(report.status, Status::Invalidated);
    assert_eq!(report.events_handed_off, 1);
    assert_eq!(report.last_event_id, event_id("B"));
    assert_eq!(host.skipped(), vec!["invalidate"]);
    assert_eq!((host.token(), host.mode()), (Some("B"), Mode::StartAfter));
    assert!(host.advances.is_empty());
}

#[test]
fn idle_run_resumes_after_an_invalidation_and_saves_the_watermark() {
    let mut host = FakeHost::new()
        .checkpoint("T", Mode::StartAfter)
        .watermark("W");
    let report = run(&mut host, &settings(50)).unwrap();
    assert_eq!(report.status, Status::Idle);
    assert_eq!(host.opened, Some(Start::StartAfter("T".into())));
    assert_eq!(
        host.advances,
        vec![(Some("T".to_string()), "W".to_string())]
    );
}

#[test]
fn no_token_at_all_is_an_error_not_a_gap() {
    let error = run(&mut FakeHost::new(), &settings(50)).unwrap_err();
    assert!(
        error.contains("refusing to leave an uncheckpointed gap"),
        "{error}"
    );
}
