//! The HTML reports as a person sees them: `status --html` and `reconcile --html` on a consumer
//! after a few runs, and a page of run-history charts, each rendered in headless Chromium and
//! checked there (texts visible, charts drawn, nothing wider than a 1280 px or a 400 px window),
//! with a screenshot kept under `target/test-artifacts/reports/`.

use crate::support;

use handoff::operate::report::{Forecast, Page, RunPoint, Section, history_charts};
use support::browser::check_report;
use support::live::{CONSUMER, Live};

/// The charts `status --html` and `reconcile --html` draw of the consumer's run history: lag,
/// oplog margin (with the forecast) and events per run.
const CHARTS_IN_REPORTS: usize = 3;

/// A consumer that ran a few times, with events handed off.
fn consumer_after_runs() -> Live {
    let live = Live::start();
    live.start_consumer();
    for batch in 0..3 {
        live.insert(batch * 10..batch * 10 + 4);
        let out = support::ok(&live.run(&[]));
        assert_eq!(out["events_handed_off"], 4, "{out}");
    }
    live
}

/// Runs the operator command `args` with `--html FILE` and returns the page written.
fn report(live: &Live, dir: &tempfile::TempDir, name: &str, args: &[&str]) -> std::path::PathBuf {
    let path = dir.path().join(format!("{name}.html"));
    let mut all = args.to_vec();
    all.extend(["--html", path.to_str().expect("a path")]);
    let out = live.operator(&all);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let page = std::fs::read_to_string(&path).expect("the report was written");
    assert_eq!(
        page.matches("<svg ").count(),
        CHARTS_IN_REPORTS,
        "the {name} report's charts: update CHARTS_IN_REPORTS"
    );
    path
}

#[test]
fn status_report_reads_in_a_browser() {
    let live = consumer_after_runs();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let page = report(&live, &dir, "status", &["status"]);
    let shot = check_report(
        &page,
        &[
            &format!("handoff status: {CONSUMER}"),
            CONSUMER,
            "checkpoint at",
            "lag",
            "checkpoint age",
            "oplog window",
            "oplog margin",
            "12 records",
        ],
        CHARTS_IN_REPORTS,
    );
    assert!(shot.ends_with("status.png"), "{}", shot.display());
}

#[test]
fn status_of_every_consumer_reads_in_a_browser() {
    let live = consumer_after_runs();
    support::ok(&live.run(&["--consumer-id", "second-consumer"]));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("all.html");
    let out = live.operator(&["status", "--all", "--html", path.to_str().expect("a path")]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    check_report(
        &path,
        &[
            "handoff status: 2 consumers of",
            CONSUMER,
            "second-consumer",
            "oplog margin",
            "forecast",
        ],
        0,
    );
}

#[test]
fn reconcile_report_reads_in_a_browser() {
    let live = consumer_after_runs();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let page = report(&live, &dir, "reconcile", &["reconcile"]);
    check_report(
        &page,
        &[
            &format!("handoff reconcile: {CONSUMER}"),
            CONSUMER,
            "keys checked",
            "outbox records",
            "in flight",
            "missing",
            "orphan",
            "stale",
        ],
        CHARTS_IN_REPORTS,
    );
}

/// A day of runs every half hour: lag and margin varying, a run that failed (nothing known of
/// it), one whose figures were unknown, and the margin forecast to reach zero in a day.
fn runs() -> Vec<RunPoint> {
    let start = 1_793_527_200_000; // 2026-11-01T10:00:00Z
    (0..48)
        .map(|i: i64| RunPoint {
            ended_at: bson::DateTime::from_millis(start + i * 1_800_000),
            lag_seconds: (i != 20 && i != 31).then_some(5 + (i * 7) % 40),
            oplog_margin_seconds: (i != 20).then_some(200_000 - i * 1_500),
            events: if i == 20 { 0 } else { (i as u64 * 37) % 900 },
            failed: i == 20 || i == 41,
        })
        .collect()
}

#[test]
fn history_charts_read_in_a_browser() {
    let points = runs();
    let last = points.last().expect("runs").ended_at;
    let forecast = Forecast {
        at: last,
        margin_seconds: 129_500,
        eta_seconds: Some(86_400),
    };
    let hostile = "</svg><script>alert(1)</script>";
    let page = Page {
        title: format!("handoff status: {hostile}"),
        charts: history_charts(&points, Some(&forecast)),
        sections: vec![Section {
            heading: "figures".into(),
            rows: vec![
                ("consumer".into(), format!("{hostile} on db.orders")),
                ("oplog margin".into(), "1d 11h 58m (129500 s)".into()),
            ],
        }],
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("history.html");
    page.write(&path).expect("written");
    let shot = check_report(
        &path,
        &[
            hostile,
            "Lag per run",
            "Oplog margin per run",
            "Events handed off per run",
            "lag at the run's end (s)",
            "oplog margin (days)",
            "events handed off (events)",
            "failed run",
            "forecast: 0 at 2026-11-03 09:30:00 UTC",
            "129500 s",
        ],
        3,
    );
    assert!(shot.ends_with("history.png"));

    // No runs: a line saying so, no chart.
    let empty = Page {
        title: "handoff status: c".into(),
        charts: history_charts(&[], None),
        sections: Vec::new(),
    };
    let path = dir.path().join("history-empty.html");
    empty.write(&path).expect("written");
    check_report(&path, &["Run history", "no runs recorded yet"], 0);
}

/// The check itself fails a page that breaks its rules, naming each broken rule.
#[test]
fn the_browser_check_fails_a_page_that_breaks_the_rules() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("broken.html");
    std::fs::write(
        &path,
        "<!DOCTYPE html><html><body><h1>broken</h1>\
         <p style=\"visibility:hidden\">hidden words</p>\
         <div id=\"wide\" style=\"width:900px\">wide</div>\
         <svg viewBox=\"0 0 10 10\" width=\"10\" height=\"10\"><text x=\"1\" y=\"5\">empty</text></svg>\
         <img src=\"missing.png\" alt=\"\">\
         <script>document.title = 'ran';</script></body></html>",
    )
    .expect("write the page");
    let failed = std::panic::catch_unwind(|| check_report(&path, &["broken", "hidden words"], 1))
        .expect_err("the check fails");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    for expected in [
        "at 400 px: the page scrolls sideways",
        "at 400 px: wider than the page: \"div#wide from",
        "at 1280 px: \"hidden words\" is not visible",
        "at 1280 px: 0 charts drawn with plotted marks, fewer than 1",
        "at 1280 px: the report has 1 scripts",
        "at 1280 px: the report fetches or refers to [\"<img src=\\\"missing.png\\\"",
    ] {
        assert!(message.contains(expected), "{expected:?} in: {message}");
    }
    assert!(!message.contains("\"broken\" is not visible"), "{message}");
}
