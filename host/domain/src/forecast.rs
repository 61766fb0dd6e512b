//! When a consumer's checkpoint would fall off the oplog if the current rates hold, estimated
//! from its run history and where it stands now.
//!
//! The margin (checkpoint time minus the oplog's oldest time) moves two ways:
//! - the oldest entry advances as the oplog discards history, at `o` seconds of cluster time per
//!   second (1 once the oplog is full and the write rate steady; 0 while it still grows): fitted
//!   by least squares over the runs' figures and the present;
//! - the checkpoint advances only while a run commits, at `c` seconds of cluster time per second
//!   on average over the runs (fitted over the figures each run read at its end: the same moment
//!   of every cycle, so the schedule's gaps are averaged in).
//!
//! Between runs the margin only shrinks, so it is smallest just before a run. With runs every
//! `g` seconds (the mean gap of the recorded runs), `s` seconds since the last one and margin
//! `m` now, the margin just before the next run is `low = m - o * max(g - s, 0)`:
//! - `low <= 0`: the checkpoint falls off before the next run is due, in `m / o` seconds;
//! - else, when `c >= o`, the consumer keeps up: no loss while the rates hold;
//! - else the margin before each run shrinks by `(o - c) * g` a cycle: the loss comes in about
//!   `max(g - s, 0) + low / (o - c)` seconds (accurate to about one gap).
//!
//! A consumer whose last run is more than two gaps old has stopped running (a paused schedule,
//! runs failing before they take the consumer): its checkpoint does not move until the next
//! run, so the loss comes in `m / o`, said as such. A loss further than ten years away is no
//! loss at these rates.
//!
//! Nothing is guessed: without a known margin, or with fewer than [`MIN_RUNS`] runs with figures
//! over a span of time, the forecast is unknown and says why.

use serde_json::{Value, json};

use super::history::RunRecord;
use super::position::Position;

/// Runs with figures a forecast needs.
pub const MIN_RUNS: usize = 3;
/// The most recent runs a forecast fits its rates to.
pub const FIT_RUNS: usize = 10;
/// An oldest-entry rate under this is an oplog that keeps everything (not full yet).
const DISCARDING: f64 = 0.01;
/// Runs this many gaps overdue: the consumer has stopped running.
const STALLED_GAPS: f64 = 2.0;
/// A loss further away than this is none at these rates.
const HORIZON_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// What the rates say.
#[derive(Debug, Clone, PartialEq)]
pub enum Forecast {
    /// The checkpoint already fell off the oplog.
    Lost,
    /// It falls off in about `eta_seconds`.
    FallsOff { eta_seconds: i64, basis: Basis },
    /// Not while the rates hold.
    Holds { basis: Basis },
    /// Not estimable, and why.
    Unknown { why: &'static str },
}

/// The figures a forecast rests on.
#[derive(Debug, Clone, PartialEq)]
pub struct Basis {
    /// Runs fitted.
    pub runs: usize,
    /// From the first fitted run's end to the last's, in seconds.
    pub span_seconds: f64,
    /// How fast the oplog's oldest entry advances (cluster seconds per second).
    pub oplog_rate: f64,
    /// How fast the checkpoint advances on average (cluster seconds per second).
    pub checkpoint_rate: f64,
    /// The mean time between runs, in seconds.
    pub gap_seconds: f64,
    /// The margin now, in seconds.
    pub margin_seconds: i64,
    /// Since the last run ended, in seconds.
    pub since_last_run_seconds: f64,
}

impl Basis {
    /// Whether the last run is so long ago that the consumer has stopped running.
    pub fn stalled(&self) -> bool {
        self.since_last_run_seconds > STALLED_GAPS * self.gap_seconds
    }
}

impl Forecast {
    /// Seconds until the checkpoint falls off (0: it has); `None` when it does not while the
    /// rates hold, or when that cannot be told.
    pub fn eta_seconds(&self) -> Option<i64> {
        match self {
            Forecast::Lost => Some(0),
            Forecast::FallsOff { eta_seconds, .. } => Some(*eta_seconds),
            Forecast::Holds { .. } | Forecast::Unknown { .. } => None,
        }
    }

    fn basis(&self) -> Option<&Basis> {
        match self {
            Forecast::FallsOff { basis, .. } | Forecast::Holds { basis } => Some(basis),
            Forecast::Lost | Forecast::Unknown { .. } => None,
        }
    }

    /// The forecast in words.
    pub fn sentence(&self) -> String {
        let rates = |b: &Basis| {
            format!(
                "the checkpoint advances {:.2} s and the oplog's oldest entry {:.2} s per second, \
                 runs every {} on average, over the last {} runs",
                b.checkpoint_rate,
                b.oplog_rate,
                human(b.gap_seconds),
                b.runs
            )
        };
        match self {
            Forecast::Lost => {
                "history is already lost: the checkpoint is older than the oplog".into()
            }
            Forecast::FallsOff { eta_seconds, basis } if basis.stalled() => format!(
                "no run for {} (runs every {} on average): at the oplog's rate ({:.2} s a \
                 second) the checkpoint falls off in about {}",
                human(basis.since_last_run_seconds),
                human(basis.gap_seconds),
                basis.oplog_rate,
                human(*eta_seconds as f64)
            ),
            Forecast::FallsOff { eta_seconds, basis } => format!(
                "the checkpoint falls off the oplog in about {} if the rates hold ({})",
                human(*eta_seconds as f64),
                rates(basis)
            ),
            Forecast::Holds { basis } if basis.oplog_rate < DISCARDING => format!(
                "no loss while the rates hold: the oplog is not discarding history yet ({})",
                rates(basis)
            ),
            Forecast::Holds { basis } => format!(
                "no loss while the rates hold: the consumer keeps up ({})",
                rates(basis)
            ),
            Forecast::Unknown { why } => format!("not estimable: {why}"),
        }
    }

    /// The forecast as JSON: `eta_seconds` (null when none), `verdict`, the sentence and its
    /// basis.
    pub fn to_json(&self) -> Value {
        let verdict = match self {
            Forecast::Lost => "lost",
            Forecast::FallsOff { .. } => "falls_off",
            Forecast::Holds { .. } => "holds",
            Forecast::Unknown { .. } => "unknown",
        };
        json!({
            "verdict": verdict,
            "eta_seconds": self.eta_seconds(),
            "text": self.sentence(),
            "basis": self.basis().map(|b| json!({
                "runs": b.runs,
                "span_seconds": round(b.span_seconds),
                "oplog_rate": round(b.oplog_rate),
                "checkpoint_rate": round(b.checkpoint_rate),
                "gap_seconds": round(b.gap_seconds),
                "margin_seconds": b.margin_seconds,
                "since_last_run_seconds": round(b.since_last_run_seconds),
                "stalled": b.stalled(),
            })),
        })
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn human(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} days", s / 86_400.0)
    }
}

/// The least-squares slope of `y` over `x`; `None` when the `x` do not vary.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (sxx > f64::EPSILON).then(|| sxy / sxx)
}

/// The forecast for a consumer at `now` (its position read at `now_seconds`, this machine's time
/// in seconds since the epoch, with sub-second precision) from its `history` (any order).
pub fn forecast(history: &[RunRecord], now: &Position, now_seconds: f64) -> Forecast {
    let Some(margin) = now.oplog_margin_seconds() else {
        return Forecast::Unknown {
            why: "the margin is unknown (no checkpoint token, or the oplog cannot be read)",
        };
    };
    if margin < 0 || now.fell_off() == Some(true) {
        return Forecast::Lost;
    }
    // The rates since the operator last moved the checkpoint: a jump to now is not a pace.
    let era = history.iter().map(|r| r.moves).max().unwrap_or(0);
    let mut fitted: Vec<(f64, f64, f64)> = history
        .iter()
        .filter(|r| r.moves == era)
        .filter_map(|r| {
            Some((
                r.ended_at.timestamp_millis() as f64 / 1000.0,
                f64::from(r.checkpoint_time?.time),
                f64::from(r.oplog_oldest?.time),
            ))
        })
        .filter(|(at, ..)| *at <= now_seconds)
        .collect();
    fitted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let fitted = &fitted[fitted.len().saturating_sub(FIT_RUNS)..];
    if fitted.len() < MIN_RUNS {
        return Forecast::Unknown {
            why: "fewer than 3 runs with figures are recorded",
        };
    }
    let (first, last) = (fitted[0].0, fitted[fitted.len() - 1].0);
    let span = last - first;
    let checkpoint: Vec<(f64, f64)> = fitted.iter().map(|f| (f.0, f.1)).collect();
    let mut oldest: Vec<(f64, f64)> = fitted.iter().map(|f| (f.0, f.2)).collect();
    if let Some(window) = now.window {
        oldest.push((now_seconds, f64::from(window.oldest.time)));
    }
    let (Some(c), Some(o)) = (slope(&checkpoint), slope(&oldest)) else {
        return Forecast::Unknown {
            why: "the recorded runs all ended at the same moment",
        };
    };
    let (c, o) = (c.max(0.0), o.max(0.0));
    let gap = span / (fitted.len() - 1) as f64;
    let since = (now_seconds - last).max(0.0);
    let basis = Basis {
        runs: fitted.len(),
        span_seconds: span,
        oplog_rate: o,
        checkpoint_rate: c,
        gap_seconds: gap,
        margin_seconds: margin,
        since_last_run_seconds: since,
    };
    if o < DISCARDING {
        return Forecast::Holds { basis };
    }
    let margin_f = margin as f64;
    let until_next = (gap - since).max(0.0);
    let low = margin_f - o * until_next;
    let eta = if low <= 0.0 || basis.stalled() {
        margin_f / o
    } else if c >= o {
        return Forecast::Holds { basis };
    } else {
        until_next + low / (o - c)
    };
    if eta > HORIZON_SECONDS {
        return Forecast::Holds { basis };
    }
    Forecast::FallsOff {
        // Not yet lost: at least a second (0 says it is).
        eta_seconds: (eta.round() as i64).max(1),
        basis,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::Window;
    use bson::{DateTime, Timestamp};

    fn ts(time: f64) -> Timestamp {
        Timestamp {
            time: time as u32,
            increment: 1,
        }
    }

    /// Runs every `gap` s for `runs` runs, each ending with the checkpoint advanced `advance`
    /// cluster seconds, the oplog keeping `window` s at an oldest rate of 1; the present
    /// `since` s after the last run.
    fn scenario(
        runs: usize,
        gap: f64,
        advance: f64,
        window: f64,
        since: f64,
    ) -> (Vec<RunRecord>, Position, f64) {
        let start = 1_000_000.0;
        let mut checkpoint = start - advance;
        let history: Vec<RunRecord> = (0..runs)
            .map(|i| {
                let at = start + gap * i as f64;
                checkpoint += advance;
                RunRecord {
                    consumer: "c".into(),
                    source: "d.c".into(),
                    run: i as i64 + 1,
                    moves: 0,
                    started_at: DateTime::from_millis((at * 1000.0) as i64 - 100),
                    ended_at: DateTime::from_millis((at * 1000.0) as i64),
                    status: "HANDED_OFF".into(),
                    error_class: None,
                    exit_code: 0,
                    events_handed_off: 1,
                    events_skipped: 0,
                    events_quarantined: 0,
                    follow: false,
                    checkpoint_time: Some(ts(checkpoint)),
                    cluster_time: Some(ts(at)),
                    oplog_oldest: Some(ts(at - window)),
                    oplog_newest: Some(ts(at)),
                    figures_at: Some(at as u64),
                }
            })
            .collect();
        let now = start + gap * (runs - 1) as f64 + since;
        let position = Position {
            checkpoint: Some(ts(checkpoint)),
            cluster_now: Some(ts(now)),
            window: Some(Window {
                oldest: ts(now - window),
                newest: ts(now),
            }),
            wall_now: now as u64,
        };
        (history, position, now)
    }

    /// Steps the same scenario forward, run by run, until the margin just before a run is
    /// negative: the true time of the loss, to the second.
    fn simulated_loss(
        gap: f64,
        advance: f64,
        window: f64,
        checkpoint_now: f64,
        now: f64,
        since: f64,
    ) -> f64 {
        let mut checkpoint = checkpoint_now;
        let mut next_run = now - since + gap;
        loop {
            if next_run - window > checkpoint {
                return checkpoint + window - now;
            }
            checkpoint += advance;
            next_run += gap;
            if next_run - now > 1e7 {
                return f64::INFINITY;
            }
        }
    }

    #[test]
    fn a_consumer_falling_behind_is_forecast_within_one_gap() {
        // Every 10 s a run advances the checkpoint 5 s: half the rate of the oplog.
        let (history, position, now) = scenario(20, 10.0, 5.0, 3600.0, 4.0);
        let f = forecast(&history, &position, now);
        let eta = f.eta_seconds().expect("a loss is forecast") as f64;
        let margin = position.oplog_margin_seconds().unwrap() as f64;
        let truth = simulated_loss(
            10.0,
            5.0,
            3600.0,
            f64::from(position.checkpoint.unwrap().time),
            now,
            4.0,
        );
        assert!(
            (eta - truth).abs() <= 10.0,
            "{eta} vs {truth} (margin {margin}): {f:?}"
        );
        match &f {
            Forecast::FallsOff { basis, .. } => {
                assert!((basis.checkpoint_rate - 0.5).abs() < 0.01, "{basis:?}");
                assert!((basis.oplog_rate - 1.0).abs() < 0.01, "{basis:?}");
                assert!((basis.gap_seconds - 10.0).abs() < 0.01, "{basis:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            f.sentence().contains("falls off the oplog in about"),
            "{}",
            f.sentence()
        );
    }

    #[test]
    fn a_consumer_that_keeps_up_holds() {
        let (history, position, now) = scenario(10, 60.0, 60.0, 3600.0, 30.0);
        let f = forecast(&history, &position, now);
        assert!(matches!(f, Forecast::Holds { .. }), "{f:?}");
        assert_eq!(f.eta_seconds(), None);
        assert!(f.sentence().contains("keeps up"), "{}", f.sentence());
    }

    #[test]
    fn gaps_longer_than_the_window_lose_history_before_the_next_run() {
        // Keeps up on average, but runs every 2 h on a 1 h oplog: lost within the gap.
        let (history, position, now) = scenario(5, 7200.0, 7200.0, 3600.0, 600.0);
        let f = forecast(&history, &position, now);
        let margin = position.oplog_margin_seconds().unwrap();
        assert_eq!(f.eta_seconds(), Some(margin), "{f:?}");
    }

    #[test]
    fn the_runs_before_an_operators_move_are_not_fitted() {
        let (mut history, position, now) = scenario(12, 10.0, 5.0, 3600.0, 4.0);
        for r in history.iter_mut().skip(10) {
            r.moves = 1;
        }
        let f = forecast(&history, &position, now);
        assert!(
            matches!(f, Forecast::Unknown { .. }),
            "2 runs since the move: {f:?}"
        );
        for r in history.iter_mut().skip(8) {
            r.moves = 1;
        }
        match forecast(&history, &position, now) {
            Forecast::FallsOff { basis, .. } => assert_eq!(basis.runs, 4, "{basis:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_consumer_that_stopped_running_loses_history_at_the_oplogs_rate() {
        // Kept up every minute, then no run for 3 h on a day of oplog.
        let (history, position, now) = scenario(10, 60.0, 60.0, 86_400.0, 10_800.0);
        let f = forecast(&history, &position, now);
        let margin = position.oplog_margin_seconds().unwrap();
        let eta = f.eta_seconds().expect("a loss is forecast");
        assert!((eta - margin).abs() <= 1, "{eta} vs {margin}: {f:?}");
        assert!(
            f.sentence().starts_with("no run for 3.0 h"),
            "{}",
            f.sentence()
        );
        assert_eq!(f.to_json()["basis"]["stalled"], true);
    }

    #[test]
    fn a_loss_not_yet_come_is_at_least_a_second_away() {
        let (history, mut position, now) = scenario(10, 7200.0, 7200.0, 3600.0, 600.0);
        position.checkpoint = position.window.map(|w| w.oldest);
        assert_eq!(forecast(&history, &position, now).eta_seconds(), Some(1));
    }

    #[test]
    fn an_oplog_not_yet_full_holds() {
        let (mut history, mut position, now) = scenario(5, 10.0, 1.0, 3600.0, 1.0);
        for r in &mut history {
            r.oplog_oldest = Some(ts(1.0));
        }
        position.window = position.window.map(|w| Window {
            oldest: ts(1.0),
            ..w
        });
        let f = forecast(&history, &position, now);
        assert!(matches!(f, Forecast::Holds { .. }), "{f:?}");
        assert!(f.sentence().contains("not discarding"), "{}", f.sentence());
    }

    #[test]
    fn without_enough_runs_or_a_margin_it_says_why() {
        let (history, position, now) = scenario(2, 10.0, 5.0, 3600.0, 1.0);
        let f = forecast(&history, &position, now);
        assert!(matches!(f, Forecast::Unknown { .. }), "{f:?}");
        assert!(
            f.sentence().contains("fewer than 3 runs"),
            "{}",
            f.sentence()
        );
        let (history, mut position, now) = scenario(10, 10.0, 5.0, 3600.0, 1.0);
        position.window = None;
        assert!(matches!(
            forecast(&history, &position, now),
            Forecast::Unknown { .. }
        ));
        position.checkpoint = Some(ts(1.0));
        position.window = Some(Window {
            oldest: ts(50.0),
            newest: ts(now),
        });
        assert_eq!(forecast(&history, &position, now), Forecast::Lost);
    }
}
