//! The charts' axes: round UTC times on the time axis, a readable unit and compact numbers on the
//! value axis, whatever the span (one run, years of runs, absurd values).

use std::ops::Range;

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};

const SECOND: f64 = 1_000.0;
const MINUTE: f64 = 60.0 * SECOND;
const HOUR: f64 = 60.0 * MINUTE;
const DAY: f64 = 24.0 * HOUR;
const YEAR: f64 = 365.0 * DAY;

/// The steps between time ticks, in milliseconds: round in UTC (days start at midnight).
const STEPS: [f64; 25] = [
    SECOND,
    2.0 * SECOND,
    5.0 * SECOND,
    10.0 * SECOND,
    15.0 * SECOND,
    30.0 * SECOND,
    MINUTE,
    2.0 * MINUTE,
    5.0 * MINUTE,
    10.0 * MINUTE,
    15.0 * MINUTE,
    30.0 * MINUTE,
    HOUR,
    2.0 * HOUR,
    3.0 * HOUR,
    6.0 * HOUR,
    12.0 * HOUR,
    DAY,
    2.0 * DAY,
    7.0 * DAY,
    14.0 * DAY,
    30.0 * DAY,
    91.0 * DAY,
    182.0 * DAY,
    YEAR,
];

/// At most this many time ticks.
const MAX_TICKS: f64 = 7.0;

/// The time axis from `lo` to `hi` (milliseconds since the epoch, `lo < hi`): its ticks and how
/// each is written.
pub struct TimeAxis {
    pub ticks: Vec<f64>,
    step: f64,
    span: f64,
    lo: f64,
    hi: f64,
}

impl TimeAxis {
    pub fn new(lo: f64, hi: f64) -> TimeAxis {
        let span = hi - lo;
        let step = STEPS
            .iter()
            .copied()
            .find(|step| span / step <= MAX_TICKS)
            .unwrap_or_else(|| YEAR * nice_ceiling(span / YEAR / MAX_TICKS));
        let mut ticks = Vec::new();
        let mut tick = (lo / step).ceil() * step;
        while tick <= hi && ticks.len() < 2 * MAX_TICKS as usize {
            ticks.push(tick);
            tick += step;
        }
        TimeAxis {
            ticks,
            step,
            span,
            lo,
            hi,
        }
    }

    /// A tick's label: the date, the time of day or both, as the step needs.
    pub fn label(&self, ms: f64) -> String {
        let Some(text) = utc(ms) else {
            return format!("{:.0} s", ms / SECOND);
        };
        let (date, time) = (&text[..10], &text[11..19]);
        if self.step >= DAY {
            date.to_string()
        } else if self.span > DAY {
            format!("{} {}", &date[5..], &time[..5])
        } else if self.step >= MINUTE {
            time[..5].to_string()
        } else {
            time.to_string()
        }
    }

    /// The axis's caption: the times are UTC, and the day when the labels leave it out.
    pub fn caption(&self, what: &str) -> String {
        match utc(self.lo) {
            Some(text) if self.step < DAY && self.span <= DAY => {
                format!("{what} (UTC, {})", &text[..10])
            }
            Some(text) if self.step < DAY => format!("{what} (UTC, {})", &text[..4]),
            _ => format!("{what} (UTC)"),
        }
    }
}

/// The time axis as the charts' x coordinate: milliseconds mapped linearly to pixels (in floating
/// point: no span overflows), with its round ticks and their labels.
impl Ranged for TimeAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let share = (value - self.lo) / (self.hi - self.lo);
        (f64::from(limit.0) + share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for TimeAxis {
    fn format_ext(&self, value: &f64) -> String {
        self.label(*value)
    }
}

/// `YYYY-MM-DDTHH:MM:SS…Z` of a time in milliseconds, from year 1 to 9999.
pub fn utc(ms: f64) -> Option<String> {
    if !(-62_135_596_800_000.0..=253_402_300_799_999.0).contains(&ms) {
        return None;
    }
    let text = bson::DateTime::from_millis(ms as i64)
        .try_to_rfc3339_string()
        .ok()?;
    (text.len() >= 20 && text.is_char_boundary(19) && text.as_bytes()[4] == b'-').then_some(text)
}

/// A time in milliseconds as a person reads it: `2026-11-01 10:00:00 UTC`.
pub fn utc_text(ms: f64) -> String {
    match utc(ms) {
        Some(text) => format!("{} {} UTC", &text[..10], &text[11..19]),
        None => format!("{:.0} s after 1970-01-01 UTC", ms / SECOND),
    }
}

/// The unit durations up to `max_seconds` are shown in: `(name, seconds in one)`.
pub fn duration_unit(max_seconds: f64) -> (&'static str, f64) {
    match max_seconds.abs() {
        m if m < 120.0 => ("s", 1.0),
        m if m < 2.0 * 3_600.0 => ("min", 60.0),
        m if m < 2.0 * 86_400.0 => ("h", 3_600.0),
        _ => ("days", 86_400.0),
    }
}

/// A value-axis label: whole numbers as they are, fractions to two places, very large or very
/// small numbers in scientific notation.
pub fn number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e6 || (magnitude > 0.0 && magnitude < 0.01) {
        format!("{value:.1e}")
    } else if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.2}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The smallest of 1, 2, 5 × 10ⁿ at least `x` (1 for `x` below 1).
fn nice_ceiling(x: f64) -> f64 {
    if !x.is_finite() || x <= 1.0 {
        return 1.0;
    }
    let power = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|v| *v >= x)
        .unwrap_or(10.0 * power)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: f64 = 1_793_527_200_000.0; // 2026-11-01T10:00:00Z

    #[test]
    fn time_ticks_are_round_and_few_whatever_the_span() {
        for span in [
            SECOND,
            90.0 * SECOND,
            HOUR,
            3.0 * DAY,
            400.0 * DAY,
            3e4 * YEAR,
        ] {
            let axis = TimeAxis::new(T - 1.0, T + span);
            assert!(
                !axis.ticks.is_empty() && axis.ticks.len() <= 7,
                "{span}: {:?}",
                axis.ticks
            );
            assert!(axis.ticks.iter().all(|t| t % SECOND == 0.0), "{span}");
        }
        let hour = TimeAxis::new(T - 1.0, T + HOUR);
        assert_eq!(hour.label(T), "10:00");
        assert_eq!(hour.caption("run ended"), "run ended (UTC, 2026-11-01)");
        let days = TimeAxis::new(T, T + 30.0 * DAY);
        assert_eq!(days.label(T + DAY * 5.0 - 10.0 * HOUR), "2026-11-06");
        assert_eq!(days.caption("run ended"), "run ended (UTC)");
        let two_days = TimeAxis::new(T, T + 1.5 * DAY);
        assert_eq!(two_days.label(T + 2.0 * HOUR), "11-01 12:00");
        assert_eq!(two_days.caption("run ended"), "run ended (UTC, 2026)");
        assert_eq!(
            TimeAxis::new(T, T + 20.0 * SECOND).label(T + 5e3),
            "10:00:05"
        );
        // A year beyond 9999 has no date text: its seconds instead.
        let far = TimeAxis::new(T, 1e15).label(5e14);
        assert!(far.ends_with(" s"), "{far}");
    }

    #[test]
    fn values_read_well() {
        assert_eq!(number(42.0), "42");
        assert_eq!(number(-2.5), "-2.5");
        assert_eq!(number(0.333), "0.33");
        assert_eq!(number(3.2e12), "3.2e12");
        assert_eq!(duration_unit(30.0), ("s", 1.0));
        assert_eq!(duration_unit(-7_200.0).0, "h");
        assert_eq!(duration_unit(9e18).0, "days");
        assert_eq!(utc_text(T), "2026-11-01 10:00:00 UTC");
        assert_eq!(nice_ceiling(3.1), 5.0);
        assert_eq!(nice_ceiling(0.2), 1.0);
    }
}
