//! Charts of a consumer's runs over time, drawn as inline SVG: lag per run, oplog margin per run
//! with the forecast of when the checkpoint falls off the oplog, events handed off per run.
//! Failed runs are marked on each.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::axis::{TimeAxis, duration_unit, number, utc_text};
use handoff_domain::text::escape_chars;

/// The drawing's size in SVG units; the page scales it to its width.
pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 300;

/// Markers on every point up to this many runs (beyond, the line alone).
const MARKED_POINTS: usize = 150;

/// The strip between the title and the plot that holds the legend, the margin around the plot
/// and the room of the value axis's labels, in SVG units.
const LEGEND_HEIGHT: u32 = 26;
const MARGIN_PX: i32 = 14;
const Y_LABELS_PX: i32 = 78;

pub const LINE: RGBColor = RGBColor(31, 119, 180);
pub const MARGIN: RGBColor = RGBColor(44, 160, 44);
pub const FORECAST: RGBColor = RGBColor(255, 127, 14);
pub const FAILED: RGBColor = RGBColor(214, 39, 40);
pub const ZERO: RGBColor = RGBColor(110, 110, 110);

/// One run as the charts show it.
#[derive(Clone, Debug, PartialEq)]
pub struct RunPoint {
    pub ended_at: bson::DateTime,
    pub lag_seconds: Option<i64>,
    pub oplog_margin_seconds: Option<i64>,
    pub events: u64,
    pub failed: bool,
}

/// The oplog margin at `at`, and in how many seconds it would reach zero at the present pace
/// (`None`: it does not shrink, or cannot be told).
#[derive(Clone, Debug, PartialEq)]
pub struct Forecast {
    pub at: bson::DateTime,
    pub margin_seconds: i64,
    pub eta_seconds: Option<i64>,
}

/// A chart of the report: an SVG drawing, or a line of text where there is nothing to draw.
#[derive(Clone, Debug)]
pub struct Chart {
    title: String,
    body: Body,
}

#[derive(Clone, Debug)]
enum Body {
    Svg(String),
    Note(String),
}

impl Chart {
    pub fn title(&self) -> &str {
        &self.title
    }

    /// The drawing (`<svg …>…</svg>`), when there is one.
    pub fn svg(&self) -> Option<&str> {
        match &self.body {
            Body::Svg(svg) => Some(svg),
            Body::Note(_) => None,
        }
    }

    /// The chart as a block of the page: every text in it escaped.
    pub fn to_html(&self) -> String {
        match &self.body {
            Body::Svg(svg) => format!("<figure class=\"chart\">{svg}</figure>"),
            Body::Note(note) => format!(
                "<p class=\"chart-note\"><strong>{}</strong>: {}</p>",
                super::text(&self.title),
                super::text(note)
            ),
        }
    }

    fn note(title: &str, note: String) -> Chart {
        Chart {
            title: title.to_string(),
            body: Body::Note(note),
        }
    }
}

/// The charts of a consumer's runs (in any order): lag per run, oplog margin per run with the
/// forecast as a dashed line down to zero, events handed off per run. No runs: one line saying
/// so instead.
pub fn history_charts(points: &[RunPoint], forecast: Option<&Forecast>) -> Vec<Chart> {
    if points.is_empty() {
        return vec![Chart::note("Run history", "no runs recorded yet".into())];
    }
    let mut points = points.to_vec();
    points.sort_by_key(|p| p.ended_at);
    let seconds = |v: Option<i64>| v.map(|s| s as f64);
    vec![
        TimeChart {
            title: "Lag per run",
            value: "lag at the run's end",
            series: "lag",
            kind: Kind::Duration,
            values: points.iter().map(|p| seconds(p.lag_seconds)).collect(),
            forecast: None,
        }
        .draw(&points),
        TimeChart {
            title: "Oplog margin per run",
            value: "oplog margin",
            series: "margin",
            kind: Kind::Duration,
            values: points
                .iter()
                .map(|p| seconds(p.oplog_margin_seconds))
                .collect(),
            forecast,
        }
        .draw(&points),
        TimeChart {
            title: "Events handed off per run",
            value: "events handed off",
            series: "events",
            kind: Kind::Count,
            values: points.iter().map(|p| Some(p.events as f64)).collect(),
            forecast: None,
        }
        .draw(&points),
    ]
}

/// Durations are drawn as lines in a readable unit, counts as bars.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Duration,
    Count,
}

/// One chart over time: a value per run (seconds or a count; `None` where unknown).
struct TimeChart<'a> {
    title: &'a str,
    /// The value axis's caption (its unit is added).
    value: &'a str,
    /// The legend's name of the series.
    series: &'a str,
    kind: Kind,
    values: Vec<Option<f64>>,
    forecast: Option<&'a Forecast>,
}

type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// The forecast as drawn: the margin now, a line from it to zero (or to the chart's edge when
/// zero is far beyond the runs) when the time to zero is known, and its legend.
struct ForecastLine {
    from: (f64, f64),
    to: Option<(f64, f64)>,
    label: String,
}

impl TimeChart<'_> {
    /// The chart, or a line saying why it could not be drawn.
    fn draw(&self, points: &[RunPoint]) -> Chart {
        if points.is_empty() {
            return Chart::note(self.title, "no runs recorded yet".into());
        }
        let mut svg = String::new();
        match self.draw_into(points, &mut svg) {
            Ok(()) => Chart {
                title: self.title.to_string(),
                body: Body::Svg(responsive(&svg, self.title)),
            },
            Err(e) => Chart::note(self.title, format!("the chart could not be drawn: {e}")),
        }
    }

    fn draw_into(&self, points: &[RunPoint], svg: &mut String) -> Drawn {
        let times: Vec<f64> = points
            .iter()
            .map(|p| p.ended_at.timestamp_millis() as f64)
            .collect();
        let (Some(&first), Some(&last)) = (times.first(), times.last()) else {
            return Ok(());
        };
        let forecast = self.forecast.map(|f| forecast_line(f, last - first));
        let (mut lo, mut hi) = (first, last);
        if let Some(f) = &forecast {
            lo = lo.min(f.from.0);
            hi = hi.max(f.from.0).max(f.to.map_or(f.from.0, |to| to.0));
        }
        let pad = if hi > lo {
            (hi - lo) * 0.04
        } else {
            1_800_000.0
        };
        let (lo, hi) = (lo - pad, hi + pad);
        let axis = TimeAxis::new(lo, hi);
        let x_caption = axis.caption("run ended");

        let known: Vec<f64> = self.values.iter().flatten().copied().collect();
        let extra: Vec<f64> = forecast.iter().map(|f| f.from.1).collect();
        let max_abs = known
            .iter()
            .chain(&extra)
            .fold(0.0f64, |m, v| m.max(v.abs()));
        let (unit, per) = match self.kind {
            Kind::Duration => duration_unit(max_abs),
            Kind::Count => ("events", 1.0),
        };
        let scaled = |v: f64| v / per;
        let (mut y_lo, mut y_hi) = known
            .iter()
            .chain(&extra)
            .fold((0.0f64, 0.0f64), |(l, h), v| {
                (l.min(scaled(*v)), h.max(scaled(*v)))
            });
        if y_hi - y_lo <= 0.0 {
            y_hi = y_lo + 1.0;
        }
        let head = (y_hi - y_lo) * 0.1;
        y_hi += head;
        if y_lo < 0.0 {
            y_lo -= head;
        }

        let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let title = escape_chars(self.title);
        let titled = root.titled(title.as_str(), ("sans-serif", 24))?;
        let (legend_area, plot_area) = titled.split_vertically(LEGEND_HEIGHT);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(MARGIN_PX)
            .x_label_area_size(52)
            .y_label_area_size(Y_LABELS_PX)
            .build_cartesian_2d(axis, y_lo..y_hi)?;
        let y_label = |y: &f64| number(*y);
        chart
            .configure_mesh()
            .y_label_formatter(&y_label)
            .y_labels(6)
            .x_desc(x_caption)
            .y_desc(format!("{} ({unit})", self.value))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .light_line_style(WHITE)
            .bold_line_style(BLACK.mix(0.12))
            .draw()?;

        let xy: Vec<(f64, Option<f64>)> = times
            .iter()
            .zip(&self.values)
            .map(|(t, v)| (*t, v.map(scaled)))
            .collect();
        let mut legend = Vec::new();
        if self.kind == Kind::Duration {
            chart.draw_series(LineSeries::new(
                [(lo, 0.0), (hi, 0.0)],
                ZERO.stroke_width(1),
            ))?;
        }
        let color = if self.forecast.is_some() {
            MARGIN
        } else {
            LINE
        };
        let per_run = format!("{} per run", self.series);
        match self.kind {
            Kind::Duration => {
                for segment in known_runs(&xy) {
                    chart.draw_series(LineSeries::new(segment, color.stroke_width(2)))?;
                }
                if xy.len() <= MARKED_POINTS {
                    chart.draw_series(
                        xy.iter().filter_map(|(t, v)| {
                            v.map(|v| Circle::new((*t, v), 3, color.filled()))
                        }),
                    )?;
                }
                legend.push((Sample::Line(color), per_run));
            }
            Kind::Count => {
                let half = bar_half_width(&times, hi - lo);
                chart.draw_series(points.iter().zip(&xy).filter_map(|(p, (t, v))| {
                    let fill = if p.failed { FAILED } else { LINE };
                    v.map(|v| Rectangle::new([(t - half, 0.0), (t + half, v)], fill.filled()))
                }))?;
                legend.push((Sample::Bar(LINE), per_run));
            }
        }
        if let Some(f) = &forecast {
            let from = (f.from.0, scaled(f.from.1));
            if let Some(to) = f.to {
                chart.draw_series(DashedLineSeries::new(
                    [from, (to.0, scaled(to.1))],
                    9,
                    6,
                    FORECAST.stroke_width(2),
                ))?;
            }
            chart.draw_series([Circle::new(from, 4, FORECAST.filled())])?;
            legend.push((Sample::Dashed(FORECAST), f.label.clone()));
        }
        let failed: Vec<(f64, f64)> = points
            .iter()
            .zip(&xy)
            .filter(|(p, _)| p.failed)
            .map(|(_, (t, v))| (*t, v.unwrap_or(y_lo.max(0.0))))
            .collect();
        if !failed.is_empty() {
            chart.draw_series(
                failed
                    .iter()
                    .map(|p| Cross::new(*p, 6, FAILED.stroke_width(3))),
            )?;
            legend.push((Sample::Cross(FAILED), "failed run".to_string()));
        }
        drop(chart);
        draw_legend(&legend_area, &legend)?;
        root.present()
    }
}

/// How a legend entry shows its series.
enum Sample {
    Line(RGBColor),
    Dashed(RGBColor),
    Bar(RGBColor),
    Cross(RGBColor),
}

/// The legend in one line above the plot, from the plot's left edge: it never hides a point.
fn draw_legend(area: &DrawingArea<SVGBackend<'_>, Shift>, entries: &[(Sample, String)]) -> Drawn {
    let style =
        TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let y = LEGEND_HEIGHT as i32 / 2;
    let mut x = MARGIN_PX + Y_LABELS_PX;
    for (sample, label) in entries {
        match sample {
            Sample::Line(color) => area.draw(&PathElement::new(
                [(x, y), (x + 22, y)],
                color.stroke_width(2),
            ))?,
            Sample::Dashed(color) => {
                for dash in [x, x + 14] {
                    area.draw(&PathElement::new(
                        [(dash, y), (dash + 8, y)],
                        color.stroke_width(2),
                    ))?;
                }
            }
            Sample::Bar(color) => area.draw(&Rectangle::new(
                [(x + 5, y - 6), (x + 17, y + 6)],
                color.filled(),
            ))?,
            Sample::Cross(color) => {
                area.draw(&Cross::new((x + 11, y), 5, color.stroke_width(3)))?
            }
        }
        let text = escape_chars(label);
        area.draw_text(&text, &style, (x + 28, y))?;
        let (width, _) = area.estimate_text_size(&text, &style)?;
        x += 28 + width as i32 + 26;
    }
    Ok(())
}

/// The runs of known values one after another: one line each (unknown values break the line).
fn known_runs(xy: &[(f64, Option<f64>)]) -> Vec<Vec<(f64, f64)>> {
    let mut segments = vec![Vec::new()];
    for (t, v) in xy {
        match (v, segments.last_mut()) {
            (Some(v), Some(segment)) => segment.push((*t, *v)),
            (None, Some(segment)) if !segment.is_empty() => segments.push(Vec::new()),
            _ => {}
        }
    }
    segments.retain(|s: &Vec<(f64, f64)>| !s.is_empty());
    segments
}

/// Half a bar's width: bars of neighbouring runs do not touch; a lone run's bar is narrow.
fn bar_half_width(times: &[f64], span: f64) -> f64 {
    let closest = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .filter(|gap| *gap > 0.0)
        .fold(f64::INFINITY, f64::min);
    (closest * 0.3).min(span * 0.01).max(span * 0.001)
}

/// The forecast line: from the margin at `at` down to zero at `at + eta`. Zero is drawn only
/// within twice the runs' span (at least a day) after `at`; beyond, the line stops at that edge
/// and the legend gives the date. No time to zero: the margin now alone.
fn forecast_line(forecast: &Forecast, runs_span: f64) -> ForecastLine {
    let at = forecast.at.timestamp_millis() as f64;
    let from = (at, forecast.margin_seconds as f64);
    let Some(eta) = forecast.eta_seconds else {
        return ForecastLine {
            from,
            to: None,
            label: "margin now: no time to 0 foreseen".into(),
        };
    };
    let eta = eta.max(0) as f64 * 1_000.0;
    let horizon = (2.0 * runs_span).max(86_400_000.0);
    let zero = utc_text(at + eta);
    if eta <= horizon {
        ForecastLine {
            from,
            to: Some((at + eta, 0.0)),
            label: format!("forecast: 0 at {zero}"),
        }
    } else {
        ForecastLine {
            from,
            to: Some((at + horizon, from.1 * (1.0 - horizon / eta))),
            label: format!("forecast: 0 at {zero} (off the chart)"),
        }
    }
}

/// The drawing made to fit its container: no fixed size (the page's style sets its width, the
/// view box its proportions), no namespace address (inline SVG needs none), its title for
/// assistive technology.
fn responsive(svg: &str, title: &str) -> String {
    let body = svg
        .strip_prefix("<svg ")
        .and_then(|rest| rest.split_once('>'))
        .map_or(svg, |(_, body)| body);
    format!(
        "<svg viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\">\
         <title>{}</title>{body}",
        super::text(title)
    )
}

#[cfg(test)]
#[path = "chart_tests.rs"]
mod tests;
