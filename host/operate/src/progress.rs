//! Progress of long work (backfill, reconcile, a large replay, `policy test`).
//!
//! On a terminal: one line on stderr, redrawn at most five times a second, with the count, the
//! total when known, the rate and the time left. Elsewhere (a workflow engine's log): a structured
//! `tracing` line (target `handoff::progress`) at most every five seconds, and one at the end.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TERMINAL_EVERY: Duration = Duration::from_millis(200);
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// A line redrawn on stderr.
    Terminal,
    /// Periodic `tracing` lines.
    Log,
    /// Nothing (machine-readable output on stdout only, tests).
    Hidden,
}

impl Sink {
    /// The terminal when stderr is one, structured lines otherwise.
    pub fn detect() -> Sink {
        if std::io::stderr().is_terminal() {
            Sink::Terminal
        } else {
            Sink::Log
        }
    }
}

/// One piece of long work.
pub struct Progress {
    task: &'static str,
    total: Option<u64>,
    sink: Sink,
    started: Instant,
    state: Mutex<State>,
}

struct State {
    done: u64,
    shown: Option<Instant>,
}

/// What progress says at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub done: u64,
    pub total: Option<u64>,
    /// Items per second since the start.
    pub rate: f64,
    /// Seconds left at this rate, when the total is known and the rate is not zero.
    pub eta_seconds: Option<f64>,
}

impl Progress {
    /// Work called `task`, of `total` items when known, shown where [`Sink::detect`] says.
    pub fn new(task: &'static str, total: Option<u64>) -> Progress {
        Progress::to(task, total, Sink::detect())
    }

    pub fn to(task: &'static str, total: Option<u64>, sink: Sink) -> Progress {
        Progress {
            task,
            total,
            sink,
            started: Instant::now(),
            state: Mutex::new(State {
                done: 0,
                shown: None,
            }),
        }
    }

    /// `n` more items done.
    pub fn add(&self, n: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.done = state.done.saturating_add(n);
        let now = Instant::now();
        let every = match self.sink {
            Sink::Terminal => TERMINAL_EVERY,
            Sink::Log => LOG_EVERY,
            Sink::Hidden => return,
        };
        if state.shown.is_none_or(|at| now.duration_since(at) >= every) {
            state.shown = Some(now);
            self.show(self.figures_at(state.done, now), false);
        }
    }

    /// The figures now.
    pub fn figures(&self) -> Figures {
        let done = self.state.lock().unwrap_or_else(|e| e.into_inner()).done;
        self.figures_at(done, Instant::now())
    }

    /// The work ended: a last line (and the terminal line closed).
    pub fn finish(&self) {
        let figures = self.figures();
        if self.sink != Sink::Hidden {
            self.show(figures, true);
        }
    }

    fn figures_at(&self, done: u64, now: Instant) -> Figures {
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let rate = if elapsed > 0.0 {
            done as f64 / elapsed
        } else {
            0.0
        };
        let eta_seconds = match self.total {
            Some(total) if rate > 0.0 => Some(total.saturating_sub(done) as f64 / rate),
            _ => None,
        };
        Figures {
            done,
            total: self.total,
            rate,
            eta_seconds,
        }
    }

    fn show(&self, f: Figures, last: bool) {
        match self.sink {
            Sink::Hidden => {}
            Sink::Terminal => {
                let mut line = format!("\r{}: {}", self.task, f.done);
                if let Some(total) = f.total {
                    let percent = if total == 0 {
                        100.0
                    } else {
                        f.done as f64 * 100.0 / total as f64
                    };
                    line.push_str(&format!("/{total} ({percent:.0}%)"));
                }
                line.push_str(&format!(", {:.0}/s", f.rate));
                if let Some(eta) = f.eta_seconds.filter(|_| !last) {
                    line.push_str(&format!(", {} left", human_duration(eta)));
                }
                line.push_str("\x1b[K");
                if last {
                    line.push('\n');
                }
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(line.as_bytes());
                let _ = err.flush();
            }
            Sink::Log => {
                tracing::info!(
                    target: "handoff::progress",
                    task = self.task,
                    done = f.done,
                    total = f.total,
                    rate = (f.rate * 10.0).round() / 10.0,
                    eta_seconds = f.eta_seconds.map(|s| s.round() as u64),
                    finished = last,
                    "progress"
                );
            }
        }
    }
}

/// `90` → `1m30s`, `4000` → `1h06m`.
pub fn human_duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_count_and_estimate() {
        let progress = Progress::to("test", Some(100), Sink::Hidden);
        progress.add(10);
        progress.add(15);
        let f = progress.figures();
        assert_eq!(f.done, 25);
        assert_eq!(f.total, Some(100));
        assert!(f.rate > 0.0);
        let eta = f.eta_seconds.expect("a rate and a total give an ETA");
        assert!((eta - 75.0 / f.rate).abs() < 1e-6 * eta.max(1.0) + 1.0);
        let unknown = Progress::to("test", None, Sink::Hidden);
        unknown.add(3);
        assert_eq!(unknown.figures().eta_seconds, None);
    }

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(human_duration(0.2), "0s");
        assert_eq!(human_duration(59.0), "59s");
        assert_eq!(human_duration(90.0), "1m30s");
        assert_eq!(human_duration(4000.0), "1h06m");
        assert_eq!(human_duration(-3.0), "0s");
    }
}
