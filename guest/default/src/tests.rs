use super::*;
use std::collections::VecDeque;

/// A scripted host: a queue of `next` answers, a fake clock that advances one await bound per
/// empty poll, and a record of every write the policy asked for.
#[derive(Default)]
struct FakeHost {
    opened: Option<Start>,
    answers: VecDeque<Result<Option<Event>, String>>,
    watermark: Option<String>,
    commits: Vec<(Option<String>, String, Mode, Option<String>)>,
    advances: Vec<(Option<String>, String)>,
    clock: u64,
    fail_commit: Option<String>,
}

impl FakeHost {
    fn with_events(events: &[(&str, &str)]) -> Self {
        let mut host = FakeHost::default();
        for (token, op) in events {
            host.answers.push_back(Ok(Some(Event {
                token: token.to_string(),
                operation_type: op.to_string(),
            })));
        }
        host
    }
}

impl Host for FakeHost {
    fn open(&mut self, start: Start) -> Result<(), String> {
        self.opened = Some(start);
        Ok(())
    }
    fn next(&mut self) -> Result<Option<Event>, String> {
        match self.answers.pop_front() {
            Some(answer) => answer,
            None => {
                self.clock += 1000;
                Ok(None)
            }
        }
    }
    fn watermark(&mut self) -> Option<String> {
        self.watermark.clone()
    }
    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), String> {
        if let Some(message) = self.fail_commit.take() {
            return Err(message);
        }
        self.commits.push((
            expected.map(str::to_string),
            next.to_string(),
            mode,
            outbox_id.map(str::to_string),
        ));
        Ok(())
    }
    fn commit_batch(
        &mut self,
        _expected: Option<&str>,
        _next: &str,
        _mode: Mode,
        _decisions: Vec<Decision>,
    ) -> Result<(), String> {
        Err("the default policy commits one event at a time".into())
    }
    fn field(&mut self, _token: &str, _path: &str) -> Option<String> {
        None
    }
    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), String> {
        self.advances
            .push((expected.map(str::to_string), next.to_string()));
        Ok(())
    }
    fn now_ms(&mut self) -> u64 {
        self.clock
    }
}

fn settings(max_events: u32) -> Settings {
    Settings {
        max_events,
        max_wait_ms: 3000,
        params: Vec::new(),
    }
}

fn fresh() -> Checkpoint {
    Checkpoint {
        token: None,
        mode: Mode::ResumeAfter,
    }
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
fn resume_mode_follows_the_checkpoint() {
    assert_eq!(stream_start(&fresh()), Start::Now);
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
fn events_are_committed_in_order_with_their_ids() {
    let mut host = FakeHost::with_events(&[("A", "insert"), ("B", "update"), ("C", "delete")]);
    host.watermark = Some("W".into());
    let report = run(&mut host, fresh(), &settings(50)).unwrap();
    assert_eq!(report.status, Status::HandedOff);
    assert_eq!(report.events_handed_off, 3);
    assert_eq!(report.last_event_id, event_id("C"));
    let expected: Vec<_> = [(None, "A"), (Some("A"), "B"), (Some("B"), "C")]
        .into_iter()
        .map(|(from, to)| {
            (
                from.map(str::to_string),
                to.to_string(),
                Mode::ResumeAfter,
                Some(event_id(to)),
            )
        })
        .collect();
    assert_eq!(host.commits, expected);
    assert_eq!(
        host.advances,
        vec![(Some("C".to_string()), "W".to_string())]
    );
}

#[test]
fn max_events_stops_without_a_watermark() {
    let mut host = FakeHost::with_events(&[("A", "insert"), ("B", "insert"), ("C", "insert")]);
    host.watermark = Some("W".into());
    let report = run(&mut host, fresh(), &settings(2)).unwrap();
    assert_eq!(report.events_handed_off, 2);
    assert_eq!(host.commits.len(), 2);
    assert!(host.advances.is_empty());
}

#[test]
fn invalidate_saves_start_after_without_outbox_and_stops() {
    let mut host = FakeHost::with_events(&[("A", "drop"), ("B", "invalidate"), ("C", "insert")]);
    host.watermark = Some("W".into());
    let report = run(&mut host, fresh(), &settings(50)).unwrap();
    assert_eq!(report.status, Status::Invalidated);
    assert_eq!(report.events_handed_off, 1);
    assert_eq!(
        host.commits[1],
        (Some("A".into()), "B".into(), Mode::StartAfter, None)
    );
    assert_eq!(host.commits.len(), 2);
    assert!(host.advances.is_empty());
}

#[test]
fn idle_run_saves_the_watermark() {
    let mut host = FakeHost {
        watermark: Some("W".into()),
        ..Default::default()
    };
    let checkpoint = Checkpoint {
        token: Some("T".into()),
        mode: Mode::StartAfter,
    };
    let report = run(&mut host, checkpoint, &settings(50)).unwrap();
    assert_eq!(report.status, Status::Idle);
    assert_eq!(host.opened, Some(Start::StartAfter("T".into())));
    assert_eq!(
        host.advances,
        vec![(Some("T".to_string()), "W".to_string())]
    );
}

#[test]
fn watermark_equal_to_the_token_writes_nothing() {
    let mut host = FakeHost {
        watermark: Some("T".into()),
        ..Default::default()
    };
    let checkpoint = Checkpoint {
        token: Some("T".into()),
        mode: Mode::ResumeAfter,
    };
    run(&mut host, checkpoint, &settings(50)).unwrap();
    assert!(host.advances.is_empty());
}

#[test]
fn no_token_at_all_is_an_error_not_a_gap() {
    let mut host = FakeHost::default();
    let error = run(&mut host, fresh(), &settings(50)).unwrap_err();
    assert!(
        error.contains("refusing to leave an uncheckpointed gap"),
        "{error}"
    );
}

#[test]
fn the_idle_timer_restarts_after_each_event() {
    let mut host = FakeHost::default();
    host.answers.push_back(Ok(None));
    host.answers.push_back(Ok(None));
    host.answers.push_back(Ok(Some(Event {
        token: "A".into(),
        operation_type: "insert".into(),
    })));
    host.clock = 0;
    // Two empty polls advance nothing here (scripted answers do not tick), so tick by hand:
    // the run must still see the event because the deadline is 3 s.
    host.watermark = Some("A".into());
    let report = run(&mut host, fresh(), &settings(50)).unwrap();
    assert_eq!(report.events_handed_off, 1);
    // After the event, three empty polls of 1 s each exhaust the restarted 3 s deadline.
    assert_eq!(host.clock, 3000);
}

#[test]
fn host_errors_abort_the_run() {
    let mut host = FakeHost::with_events(&[("A", "insert")]);
    host.fail_commit =
        Some("Checkpoint changed during this run; retry from the current token".into());
    let error = run(&mut host, fresh(), &settings(50)).unwrap_err();
    assert!(error.contains("Checkpoint changed"));
    assert!(host.advances.is_empty());

    let mut host = FakeHost::default();
    host.answers.push_back(Err("history lost".into()));
    assert_eq!(
        run(&mut host, fresh(), &settings(50)).unwrap_err(),
        "history lost"
    );
}
