use super::*;
use crate::fake::{Commit, FakeHost};

/// The default policy: every event handed off under its baseline ID.
#[derive(Default)]
struct Baseline;

impl Policy for Baseline {
    fn decide(&mut self, _event: &mut Delivered<'_>, id: String) -> Decision {
        Decision::HandOff(id)
    }
}

/// Batches of `size`, with a record of what `finish` saw.
struct Batches {
    size: usize,
    finished: Option<Report>,
}

impl FromSettings for Batches {
    fn from_settings(settings: &Settings) -> Result<Batches, String> {
        let size = match settings.param("size") {
            None => 3,
            Some(v) => v.parse().map_err(|_| format!("bad size {v:?}"))?,
        };
        Ok(Batches {
            size,
            finished: None,
        })
    }
}

impl Policy for Batches {
    fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
        match event.operation_type.as_str() {
            "drop" => Decision::Skip("drop".into()),
            "update" => Decision::Quarantine {
                id,
                reason: "updates are held".into(),
            },
            _ => Decision::HandOff(id),
        }
    }

    fn batch_size(&self) -> usize {
        self.size
    }

    fn finish(&mut self, host: &mut dyn Host, report: &Report) -> Result<(), String> {
        host.log(Level::Info, "done", &[("events", "n")]);
        self.finished = Some(report.clone());
        Ok(())
    }
}

fn settings(max_events: u32) -> Settings {
    Settings::new(max_events, 3000)
}

fn baseline(host: &mut FakeHost, max_events: u32) -> Result<Report, String> {
    run::<Baseline>(host, &settings(max_events))
}

fn one(expected: Option<&str>, next: &str, mode: Mode, decision: Decision) -> Commit {
    Commit {
        expected: expected.map(str::to_string),
        next: next.to_string(),
        mode,
        decisions: vec![decision],
    }
}

#[test]
fn resume_mode_follows_the_checkpoint() {
    let fresh = Checkpoint {
        token: None,
        mode: Mode::ResumeAfter,
    };
    assert_eq!(stream_start(&fresh), Start::Now);
    let saved = |mode| Checkpoint {
        token: Some("T".into()),
        mode,
    };
    assert_eq!(
        stream_start(&saved(Mode::ResumeAfter)),
        Start::ResumeAfter("T".into())
    );
    assert_eq!(
        stream_start(&saved(Mode::StartAfter)),
        Start::StartAfter("T".into())
    );
}

#[test]
fn events_are_committed_one_by_one_in_order_with_their_ids() {
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "update")
        .event("C", "delete")
        .watermark("W");
    let report = baseline(&mut host, 50).unwrap();
    assert_eq!(report.status, Status::HandedOff);
    assert_eq!(report.events_handed_off, 3);
    assert_eq!(report.last_event_id, event_id("C"));
    assert_eq!(host.opened, Some(Start::Now));
    let expected: Vec<_> = [(None, "A"), (Some("A"), "B"), (Some("B"), "C")]
        .into_iter()
        .map(|(from, to)| one(from, to, Mode::ResumeAfter, Decision::HandOff(event_id(to))))
        .collect();
    assert_eq!(host.commits, expected);
    assert_eq!(
        host.advances,
        vec![(Some("C".to_string()), "W".to_string())]
    );
    assert_eq!(host.token(), Some("W"));
}

#[test]
fn max_events_stops_without_a_watermark() {
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "insert")
        .event("C", "insert")
        .watermark("W");
    let report = baseline(&mut host, 2).unwrap();
    assert_eq!(report.events_handed_off, 2);
    assert_eq!(host.commits.len(), 2);
    assert!(host.advances.is_empty());
}

#[test]
fn invalidate_is_skipped_saved_with_start_after_and_ends_the_run() {
    let mut host = FakeHost::new()
        .event("A", "drop")
        .event("B", "invalidate")
        .event("C", "insert")
        .watermark("W");
    let report = baseline(&mut host, 50).unwrap();
    assert_eq!(report.status, Status::Invalidated);
    assert_eq!(report.events_handed_off, 1);
    assert_eq!(report.last_event_id, event_id("B"));
    assert_eq!(
        host.commits[1],
        one(
            Some("A"),
            "B",
            Mode::StartAfter,
            Decision::Skip("invalidate".into())
        )
    );
    assert_eq!(host.commits.len(), 2);
    assert!(host.advances.is_empty());
    assert_eq!((host.token(), host.mode()), (Some("B"), Mode::StartAfter));
}

#[test]
fn idle_run_resumes_as_saved_and_saves_the_watermark() {
    let mut host = FakeHost::new()
        .checkpoint("T", Mode::StartAfter)
        .watermark("W");
    let report = baseline(&mut host, 50).unwrap();
    assert_eq!(report.status, Status::Idle);
    assert_eq!(report.last_event_id, "");
    assert_eq!(host.opened, Some(Start::StartAfter("T".into())));
    assert_eq!(
        host.advances,
        vec![(Some("T".to_string()), "W".to_string())]
    );
}

#[test]
fn watermark_equal_to_the_token_writes_nothing() {
    let mut host = FakeHost::new()
        .checkpoint("T", Mode::ResumeAfter)
        .watermark("T");
    baseline(&mut host, 50).unwrap();
    assert!(host.advances.is_empty());
}

#[test]
fn no_token_at_all_is_an_error_not_a_gap() {
    let error = baseline(&mut FakeHost::new(), 50).unwrap_err();
    assert!(
        error.contains("refusing to leave an uncheckpointed gap"),
        "{error}"
    );
}

#[test]
fn the_idle_timer_restarts_after_each_event() {
    // Two empty polls (2 s) stay within the 3 s wait; the event restarts it.
    let mut host = FakeHost::new().idle().idle().event("A", "insert");
    let report = baseline(&mut host, 50).unwrap();
    assert_eq!(report.events_handed_off, 1);
    // After the event, three empty polls of 1 s each exhaust the restarted 3 s deadline.
    assert_eq!(host.clock, 5000);
    // Three empty polls before an event end the run without it.
    let mut host = FakeHost::new()
        .idle()
        .idle()
        .idle()
        .event("A", "insert")
        .watermark("W");
    assert_eq!(baseline(&mut host, 50).unwrap().status, Status::Idle);
}

#[test]
fn host_errors_abort_the_run_with_the_hosts_message() {
    let mut host = FakeHost::new().event("A", "insert");
    host.fail_commit = Some(CommitError::Conflict(
        "Checkpoint changed during this run; retry from the current token".into(),
    ));
    let error = baseline(&mut host, 50).unwrap_err();
    assert!(error.contains("Checkpoint changed"), "{error}");
    assert!(host.advances.is_empty());

    let mut host = FakeHost::new().fail(StreamError::HistoryLost("history lost".into()));
    assert_eq!(baseline(&mut host, 50).unwrap_err(), "history lost");

    let mut host = FakeHost::new();
    host.fail_open = Some(StreamError::Unavailable("no server".into()));
    assert_eq!(baseline(&mut host, 50).unwrap_err(), "no server");
}

#[test]
fn batches_commit_when_full_when_caught_up_at_an_invalidation_and_at_the_end() {
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "update")
        .event("C", "drop")
        .event("D", "insert")
        .idle()
        .event("E", "insert")
        .event("F", "invalidate")
        .event("G", "insert");
    let fifty = settings(50);
    let mut policy = Batches::from_settings(&fifty).unwrap();
    let report = run_policy(&mut policy, &mut host, &fifty).unwrap();
    let covered: Vec<_> = host
        .commits
        .iter()
        .map(|c| (c.next.as_str(), c.decisions.len(), c.mode))
        .collect();
    assert_eq!(
        covered,
        vec![
            ("C", 3, Mode::ResumeAfter),
            ("D", 1, Mode::ResumeAfter),
            ("F", 2, Mode::StartAfter),
        ]
    );
    assert_eq!(
        host.handed_off(),
        vec![event_id("A"), event_id("D"), event_id("E")]
    );
    assert_eq!(
        host.quarantined(),
        vec![(event_id("B"), "updates are held".into())]
    );
    assert_eq!(host.skipped(), vec!["drop", "invalidate"]);
    assert_eq!(report.status, Status::Invalidated);
    assert_eq!(report.events_handed_off, 3);
    assert_eq!(report.last_event_id, event_id("F"));
    assert_eq!(policy.finished, Some(report));
    assert_eq!(host.logs.len(), 1);

    // At the end of a run that hit max_events, the partial batch is committed.
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "insert")
        .event("C", "insert");
    let report = run::<Batches>(&mut host, &settings(2).param_set("size", "5")).unwrap();
    assert_eq!(report.events_handed_off, 2);
    assert_eq!(host.commits.len(), 1);
    assert_eq!(host.commits[0].decisions.len(), 2);
    assert_eq!(host.token(), Some("B"));
    assert!(host.advances.is_empty());

    // A caught-up stream commits what it holds before waiting.
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "insert")
        .watermark("W");
    run::<Batches>(&mut host, &fifty).unwrap();
    assert_eq!(host.commits.len(), 1);
    assert_eq!(host.token(), Some("W"));
}

#[test]
fn a_bad_parameter_or_batch_size_fails_before_the_stream_opens() {
    let mut host = FakeHost::new().event("A", "insert");
    let error = run::<Batches>(&mut host, &settings(50).param_set("size", "x")).unwrap_err();
    assert_eq!(error, "bad size \"x\"");
    assert_eq!(host.opened, None);
    for size in ["0", "501"] {
        let error = run::<Batches>(&mut host, &settings(50).param_set("size", size)).unwrap_err();
        assert!(error.contains("from 1 to 500"), "{error}");
    }
    assert_eq!(host.opened, None);
}

#[test]
fn decisions_read_fields_and_the_event_through_the_host() {
    #[derive(Default)]
    struct ByStatus;
    impl Policy for ByStatus {
        fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
            let namespace = event.namespace.clone().unwrap_or_default();
            match event.field("fullDocument.status").as_deref() {
                Some("\"draft\"") => Decision::Skip(format!("draft in {namespace}")),
                _ => Decision::HandOff(format!("{}-{}", event.deployment().consumer, &id[..8])),
            }
        }
    }
    let mut host = FakeHost::new()
        .event("A", "insert")
        .field("A", "fullDocument.status", "\"draft\"")
        .event("B", "insert")
        .watermark("W");
    let report = run::<ByStatus>(&mut host, &settings(50)).unwrap();
    assert_eq!(host.skipped(), vec!["draft in shop.orders"]);
    assert_eq!(
        report.last_event_id,
        format!("test-consumer-{}", &event_id("B")[..8])
    );
}

#[test]
fn the_fake_host_refuses_what_the_host_refuses() {
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "invalidate");
    host.open(Start::Now).unwrap();
    host.next().unwrap();
    assert!(
        host.commit_batch(
            Some("X"),
            "A",
            Mode::ResumeAfter,
            vec![Decision::HandOff("a".into())]
        )
        .is_err()
    );
    assert!(
        host.commit(None, "B", Mode::ResumeAfter, Some("b"))
            .is_err()
    );
    assert!(host.advance_watermark(None, "A").is_err());
    host.commit(None, "A", Mode::ResumeAfter, Some("a"))
        .unwrap();
    host.next().unwrap();
    assert!(
        host.commit(Some("A"), "B", Mode::StartAfter, Some("b"))
            .is_err()
    );
    assert!(
        host.commit(Some("A"), "B", Mode::ResumeAfter, None)
            .is_err()
    );
    host.commit(Some("A"), "B", Mode::StartAfter, None).unwrap();
    assert_eq!(host.skipped(), vec!["invalidate"]);
}

/// What each commit covered: its last token and how many events.
fn covered(host: &FakeHost) -> Vec<(&str, usize)> {
    host.commits
        .iter()
        .map(|c| (c.next.as_str(), c.decisions.len()))
        .collect()
}

#[test]
fn a_run_reads_past_max_events_to_finish_a_source_transaction_and_commits_it_whole() {
    let mut host = FakeHost::new()
        .transaction(
            "t1",
            &[("A", "insert"), ("B", "update"), ("C", "insert")],
            false,
        )
        .event("D", "insert")
        .watermark("W");
    let report = run::<Baseline>(&mut host, &Settings::new(2, 3000)).unwrap();
    // max_events 2 ends inside t1: the run takes its third event, then stops.
    assert_eq!(report.events_handed_off, 3);
    assert_eq!(covered(&host), vec![("C", 3)]);
    assert_eq!(host.token(), Some("C"));
    assert!(
        host.advances.is_empty(),
        "a run that hit max_events saves no watermark"
    );
}

#[test]
fn a_batch_is_cut_only_where_a_source_transaction_ends() {
    let mut host = FakeHost::new()
        .event("X", "insert")
        .transaction(
            "t1",
            &[("A", "insert"), ("B", "insert"), ("C", "insert")],
            false,
        )
        .event("Y", "insert")
        .event("Z", "insert")
        .event("V", "insert")
        .watermark("W");
    let settings = Settings::new(50, 3000).param_set("size", "2");
    run::<Batches>(&mut host, &settings).unwrap();
    assert_eq!(covered(&host), vec![("C", 4), ("Z", 2), ("V", 1)]);
}

#[test]
fn a_transaction_over_the_bound_is_committed_in_batches_as_they_fill() {
    let mut host = FakeHost::new()
        .transaction(
            "big",
            &[("A", "insert"), ("B", "insert"), ("C", "insert")],
            true,
        )
        .watermark("W");
    let settings = Settings::new(2, 3000).param_set("size", "2");
    run::<Batches>(&mut host, &settings).unwrap();
    // No size: the run stops at max_events and cuts where the batch is full.
    assert_eq!(covered(&host), vec![("B", 2)]);
}

#[test]
fn decide_sees_where_an_event_stands_in_its_source_transaction() {
    #[derive(Default)]
    struct Places(Vec<Option<(String, u32, Option<u32>)>>);
    impl Policy for Places {
        fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
            let place = event.source_transaction().map(|t| (t.id, t.index, t.size));
            self.0.push(place);
            Decision::HandOff(id)
        }
    }
    let mut host = FakeHost::new()
        .event("X", "insert")
        .transaction("t1", &[("A", "insert"), ("B", "delete")], false)
        .watermark("W");
    let mut policy = Places::default();
    run_policy(&mut policy, &mut host, &Settings::new(50, 3000)).unwrap();
    assert_eq!(
        policy.0,
        vec![
            None,
            Some(("t1".into(), 0, Some(2))),
            Some(("t1".into(), 1, Some(2)))
        ]
    );
}

#[test]
fn a_run_that_follows_the_stream_ends_only_when_the_host_stops_it() {
    let mut host = FakeHost::new()
        .event("A", "insert")
        .event("B", "insert")
        .watermark("W");
    host.follow = true;
    for _ in 0..6 {
        host = host.idle();
    }
    host = host
        .event("C", "insert")
        .fail(StreamError::Rejected("the run is stopping".into()));
    // max_events 1 and an idle timer of 1 s: neither ends a run that follows.
    let error = run::<Baseline>(&mut host, &Settings::new(1, 1000)).unwrap_err();
    assert!(error.contains("stopping"), "{error}");
    assert_eq!(
        host.handed_off(),
        vec![event_id("A"), event_id("B"), event_id("C")]
    );
    // Idle for more than FOLLOW_WATERMARK_MS: the watermark was saved once, between B and C.
    assert_eq!(
        host.advances,
        vec![(Some("B".to_string()), "W".to_string())]
    );
    assert_eq!(host.commits[2].expected.as_deref(), Some("W"));
}
