use super::*;

use quick_xml::events::Event;

const T: i64 = 1_793_527_200_000; // 2026-11-01T10:00:00Z

fn run(minutes: i64, lag: Option<i64>, margin: Option<i64>, events: u64, failed: bool) -> RunPoint {
    RunPoint {
        ended_at: bson::DateTime::from_millis(T + minutes * 60_000),
        lag_seconds: lag,
        oplog_margin_seconds: margin,
        events,
        failed,
    }
}

/// An element of a drawing: its name and attributes, and the text inside it.
#[derive(Debug)]
struct Element {
    name: String,
    attributes: Vec<(String, String)>,
    text: String,
}

impl Element {
    fn get(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses a drawing as XML (failing on anything not well-formed): its elements in order, the
/// root first.
fn parse(svg: &str) -> Vec<Element> {
    let mut reader = quick_xml::Reader::from_str(svg);
    reader.config_mut().check_end_names = true;
    let mut elements: Vec<Element> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    loop {
        let event = reader.read_event().expect("well-formed SVG");
        match event {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let attributes = e
                    .attributes()
                    .map(|a| {
                        let a = a.expect("a well-formed attribute");
                        let value = a.unescape_value().expect("escaped attribute").into_owned();
                        (String::from_utf8_lossy(a.key.as_ref()).into_owned(), value)
                    })
                    .collect();
                elements.push(Element {
                    name: String::from_utf8_lossy(e.name().as_ref()).into_owned(),
                    attributes,
                    text: String::new(),
                });
                if matches!(event, Event::Start(_)) {
                    open.push(elements.len() - 1);
                }
            }
            Event::Text(t) => {
                if let Some(&i) = open.last() {
                    elements[i].text.push_str(&t.decode().expect("text"));
                }
            }
            Event::GeneralRef(r) => {
                let name = r.decode().expect("reference");
                let c = quick_xml::escape::resolve_predefined_entity(&name).expect("predefined");
                if let Some(&i) = open.last() {
                    elements[i].text.push_str(c);
                }
            }
            Event::End(_) => {
                open.pop();
            }
            Event::Eof => break,
            other => panic!("unexpected {other:?} in {svg}"),
        }
    }
    assert_eq!(elements.first().map(|e| e.name.as_str()), Some("svg"));
    elements
}

fn hex(color: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", color.0, color.1, color.2)
}

/// The polylines drawn in `color`, as their numbers of points.
fn lines(elements: &[Element], color: RGBColor) -> Vec<usize> {
    elements
        .iter()
        .filter(|e| e.name == "polyline" && e.get("stroke") == Some(&hex(color)))
        .map(|e| e.get("points").unwrap_or("").split_whitespace().count())
        .collect()
}

fn count(elements: &[Element], name: &str, attribute: &str, color: RGBColor) -> usize {
    elements
        .iter()
        .filter(|e| e.name == name && e.get(attribute) == Some(&hex(color)))
        .count()
}

fn texts(elements: &[Element]) -> String {
    elements
        .iter()
        .map(|e| e.text.trim())
        .collect::<Vec<_>>()
        .join("|")
}

fn history() -> Vec<RunPoint> {
    vec![
        run(0, Some(4), Some(7_000), 12, false),
        run(10, Some(9), Some(6_500), 40, false),
        run(20, None, None, 0, true),
        run(30, Some(2), Some(5_900), 3, false),
        run(40, Some(30), Some(5_400), 120, false),
        run(50, Some(3), Some(5_000), 7, false),
    ]
}

#[test]
fn three_well_formed_charts_hold_their_series_and_the_forecast() {
    let forecast = Forecast {
        at: bson::DateTime::from_millis(T + 50 * 60_000),
        margin_seconds: 5_000,
        eta_seconds: Some(9_000),
    };
    let charts = history_charts(&history(), Some(&forecast));
    let titles: Vec<&str> = charts.iter().map(Chart::title).collect();
    assert_eq!(
        titles,
        [
            "Lag per run",
            "Oplog margin per run",
            "Events handed off per run"
        ]
    );
    let parsed: Vec<Vec<Element>> = charts
        .iter()
        .map(|c| parse(c.svg().expect("a drawing")))
        .collect();
    for (chart, elements) in charts.iter().zip(&parsed) {
        let root = &elements[0];
        assert_eq!(
            root.get("viewBox"),
            Some("0 0 960 300"),
            "{}",
            chart.title()
        );
        assert!(!chart.svg().unwrap().contains("http"), "{}", chart.title());
        let text = texts(elements);
        assert!(text.contains(chart.title()), "{text}");
        assert!(text.contains("(UTC, 2026-11-01)"), "{text}");
        assert!(text.contains("|10:00|"), "{text}");
        // The failed run: marked, and named in the legend.
        assert!(text.contains("failed run"), "{text}");
        assert!(count(elements, "line", "stroke", FAILED) >= 4, "{text}");
    }
    // Lag: the line breaks where the failed run has no lag (2 then 3 runs; and the legend's),
    // each point marked.
    let lag = &parsed[0];
    let mut lag_lines = lines(lag, LINE);
    lag_lines.sort();
    assert_eq!(lag_lines, [2, 2, 3]);
    assert_eq!(count(lag, "circle", "fill", LINE), 5);
    assert!(texts(lag).contains("lag at the run's end (s)"));
    assert!(texts(lag).contains("|10:30|"), "ticks every 10 minutes");
    assert!(lines(lag, FORECAST).is_empty());
    assert_eq!(lines(lag, ZERO), [2]);
    // Margin: in minutes, the forecast a dashed line (several dashes) with its date.
    let margin = &parsed[1];
    assert!(lines(margin, MARGIN).contains(&3));
    assert!(texts(margin).contains("oplog margin (min)"));
    assert!(
        lines(margin, FORECAST).len() >= 4,
        "{:?}",
        lines(margin, FORECAST)
    );
    assert!(texts(margin).contains("forecast: 0 at 2026-11-01 13:20:00 UTC"));
    // Events: one bar per run, the failed one in red.
    let events = &parsed[2];
    assert_eq!(
        count(events, "rect", "fill", LINE),
        5 + 1,
        "bars and legend"
    );
    assert_eq!(count(events, "rect", "fill", FAILED), 1);
    assert!(texts(events).contains("events handed off (events)"));
}

#[test]
fn without_a_forecast_no_dashed_line() {
    let charts = history_charts(&history(), None);
    let margin = parse(charts[1].svg().expect("a drawing"));
    assert!(lines(&margin, FORECAST).is_empty());
    assert!(!texts(&margin).contains("forecast"));
    // The margin line in the colour of any other.
    assert!(lines(&margin, LINE).contains(&3));
}

#[test]
fn no_runs_is_a_line_of_text_and_few_runs_still_draw() {
    let none = history_charts(&[], None);
    assert_eq!(none.len(), 1);
    assert!(none[0].svg().is_none());
    assert_eq!(
        none[0].to_html(),
        "<p class=\"chart-note\"><strong>Run history</strong>: no runs recorded yet</p>"
    );
    let one = history_charts(&[run(0, Some(5), Some(600), 3, false)], None);
    assert_eq!(one.len(), 3);
    for chart in &one {
        let elements = parse(chart.svg().expect("a drawing"));
        assert!(texts(&elements).contains("10:00"), "{}", texts(&elements));
    }
    assert_eq!(
        count(&parse(one[0].svg().unwrap()), "circle", "fill", LINE),
        1
    );
    assert_eq!(
        count(&parse(one[2].svg().unwrap()), "rect", "fill", LINE),
        2
    );
    let two = history_charts(
        &[
            run(5, None, None, 0, true),
            run(0, Some(5), Some(600), 3, false),
        ],
        Some(&Forecast {
            at: bson::DateTime::from_millis(T + 5 * 60_000),
            margin_seconds: 600,
            eta_seconds: None,
        }),
    );
    let margin = parse(two[1].svg().expect("a drawing"));
    // No time to zero: the margin now, no line.
    assert_eq!(
        lines(&margin, FORECAST),
        [2, 2],
        "the legend's two dashes only"
    );
    assert_eq!(count(&margin, "circle", "fill", MARGIN), 1);
    assert_eq!(count(&margin, "circle", "fill", FORECAST), 1);
    assert!(texts(&margin).contains("margin now: no time to 0 foreseen"));
}

#[test]
fn very_large_values_and_times_draw_sensibly() {
    let points = [
        run(0, Some(i64::MAX), Some(i64::MIN), u64::MAX, false),
        run(1, Some(0), Some(i64::MAX), 0, true),
        RunPoint {
            ended_at: bson::DateTime::MAX,
            ..run(0, Some(1), Some(1), 1, false)
        },
        RunPoint {
            ended_at: bson::DateTime::MIN,
            ..run(0, None, None, 1, false)
        },
    ];
    let forecast = Forecast {
        at: bson::DateTime::MAX,
        margin_seconds: i64::MAX,
        eta_seconds: Some(i64::MAX),
    };
    let charts = history_charts(&points, Some(&forecast));
    assert_eq!(charts.len(), 3);
    for chart in &charts {
        let elements = parse(chart.svg().expect("a drawing"));
        let text = texts(&elements);
        assert!(
            text.contains("e18") || text.contains("e19") || text.contains("e14"),
            "{text}"
        );
        assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    }
    // A forecast far beyond the runs stops at the chart's edge and gives its date.
    let far = Forecast {
        at: bson::DateTime::from_millis(T + 50 * 60_000),
        margin_seconds: 5_000,
        eta_seconds: Some(400 * 86_400),
    };
    let margin = parse(history_charts(&history(), Some(&far))[1].svg().unwrap());
    assert!(texts(&margin).contains("forecast: 0 at 2027-12-06 10:50:00 UTC (off the chart)"));
    assert!(
        texts(&margin).contains("11-02 00:00") && texts(&margin).contains("(UTC, 2026)"),
        "a day shown: {}",
        texts(&margin)
    );
}

#[test]
fn hostile_text_is_escaped() {
    let hostile = "</svg><script>alert(1)</script>\u{202e}&";
    let chart = TimeChart {
        title: hostile,
        value: "<b>lag</b>",
        series: "\"quoted\" 'x'",
        kind: Kind::Duration,
        values: vec![Some(5.0)],
        forecast: None,
    }
    .draw(&[run(0, Some(5), None, 1, false)]);
    let svg = chart.svg().expect("a drawing");
    assert!(
        !svg.contains("<script") && !svg.contains("</svg><"),
        "{svg}"
    );
    assert!(!svg.contains('\u{202e}'));
    let elements = parse(svg);
    let text = texts(&elements);
    assert!(
        text.contains("</svg><script>alert(1)</script>\\u{202e}&"),
        "{text}"
    );
    assert!(text.contains("<b>lag</b> (s)") && text.contains("\"quoted\" 'x' per run"));
    assert_eq!(
        elements.iter().filter(|e| e.name == "title").count(),
        1,
        "the drawing's own title"
    );
    let page = crate::report::Page {
        title: hostile.into(),
        charts: vec![chart, Chart::note(hostile, hostile.into())],
        sections: Vec::new(),
    }
    .to_html();
    assert_eq!(page.matches("<script").count(), 0, "{page}");
    assert_eq!(page.matches("</svg>").count(), 1, "{page}");
}

#[test]
fn charts_come_after_the_title_and_before_the_tables() {
    let page = crate::report::Page {
        title: "handoff status: c".into(),
        charts: history_charts(&history(), None),
        sections: vec![crate::report::Section {
            heading: "figures".into(),
            rows: vec![("lag".into(), "4 s".into())],
        }],
    }
    .to_html();
    let (h1, svg, table) = (
        page.find("<h1>").unwrap(),
        page.find("<svg ").unwrap(),
        page.find("<table>").unwrap(),
    );
    assert!(h1 < svg && svg < table);
    assert_eq!(page.matches("<svg ").count(), 3);
    for external in ["src=", "href=", "http", "@import", "<script"] {
        assert!(!page.contains(external), "{external}");
    }
}
