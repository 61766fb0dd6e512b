//! Where a consumer stands against its deployment: the checkpoint's cluster time, the
//! deployment's, and the oldest time still in the oplog; from them, lag, checkpoint age and the
//! margin before the checkpoint falls off the oplog.
//!
//! Every figure is optional: a token of an unknown format has no time, a user without the right
//! to read `local.oplog.rs` sees no window. An unknown figure is reported as unknown, never
//! guessed.

use bson::{Document, Timestamp};
use serde_json::{Value, json};

/// How far a position may stand after the deployment's present before it is taken for a
/// mistake: room for the skew between an operator's clock and the deployment's.
pub const CLOCK_SKEW_ALLOWANCE_SECONDS: i64 = 60;

/// The oplog's retained history: its oldest and newest entries' times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub oldest: Timestamp,
    pub newest: Timestamp,
}

/// A consumer's position against its deployment, read at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Position {
    /// The checkpoint's token's cluster time (none: no token yet, or a token of unknown format).
    pub checkpoint: Option<Timestamp>,
    /// The deployment's current cluster time.
    pub cluster_now: Option<Timestamp>,
    /// The oplog window, when it could be read.
    pub window: Option<Window>,
    /// This machine's time, in seconds since the epoch, when the figures were read.
    pub wall_now: u64,
}

impl Position {
    /// The figures of a checkpoint `token` (if any) against the deployment's.
    pub fn of(
        token: Option<&Document>,
        cluster_now: Option<Timestamp>,
        window: Option<Window>,
    ) -> Position {
        Position {
            checkpoint: token.and_then(super::token::cluster_time),
            cluster_now,
            window,
            wall_now: wall_now(),
        }
    }

    /// How far the checkpoint is behind the deployment's cluster time, in seconds.
    pub fn lag_seconds(&self) -> Option<i64> {
        Some(i64::from(self.cluster_now?.time) - i64::from(self.checkpoint?.time))
    }

    /// How far the checkpoint stands ahead of the deployment's present, in seconds, when it
    /// does by more than [`CLOCK_SKEW_ALLOWANCE_SECONDS`]: every event before that time would be
    /// skipped without a trace. The deployment's cluster time is the present; when it is
    /// unknown, this machine's clock stands in for it.
    pub fn ahead_seconds(&self) -> Option<i64> {
        let checkpoint = i64::from(self.checkpoint?.time);
        let now = self
            .cluster_now
            .map_or(self.wall_now as i64, |t| i64::from(t.time));
        let ahead = checkpoint - now;
        (ahead > CLOCK_SKEW_ALLOWANCE_SECONDS).then_some(ahead)
    }

    /// How old the checkpoint's position is by this machine's clock, in seconds.
    pub fn checkpoint_age_seconds(&self) -> Option<i64> {
        Some(self.wall_now as i64 - i64::from(self.checkpoint?.time))
    }

    /// How far the checkpoint is ahead of the oldest time still in the oplog, in seconds: what
    /// is left before it falls off. Negative: it already has.
    pub fn oplog_margin_seconds(&self) -> Option<i64> {
        Some(i64::from(self.checkpoint?.time) - i64::from(self.window?.oldest.time))
    }

    /// The oplog's window, newest minus oldest, in seconds.
    pub fn oplog_window_seconds(&self) -> Option<i64> {
        let window = self.window?;
        Some(i64::from(window.newest.time) - i64::from(window.oldest.time))
    }

    /// Whether the checkpoint is older than the oldest entry still in the oplog (its history is
    /// gone), when both are known.
    pub fn fell_off(&self) -> Option<bool> {
        let (checkpoint, window) = (self.checkpoint?, self.window?);
        Some(
            (checkpoint.time, checkpoint.increment) < (window.oldest.time, window.oldest.increment),
        )
    }

    /// The history a resume from the oldest entry would skip, in seconds (an estimate: the
    /// oplog holds no record of what was dropped); zero when nothing fell off.
    pub fn estimated_gap_seconds(&self) -> Option<i64> {
        self.oplog_margin_seconds().map(|margin| (-margin).max(0))
    }

    /// The figures as JSON: times as `{t, i, iso}`, durations in seconds, unknown as null.
    pub fn to_json(&self) -> Value {
        json!({
            "checkpoint_cluster_time": self.checkpoint.map(time_json),
            "cluster_time": self.cluster_now.map(time_json),
            "oldest_oplog_time": self.window.map(|w| time_json(w.oldest)),
            "newest_oplog_time": self.window.map(|w| time_json(w.newest)),
            "lag_seconds": self.lag_seconds(),
            "checkpoint_age_seconds": self.checkpoint_age_seconds(),
            "oplog_margin_seconds": self.oplog_margin_seconds(),
            "oplog_window_seconds": self.oplog_window_seconds(),
            "estimated_gap_seconds": self.estimated_gap_seconds(),
            "checkpoint_ahead_seconds": self.ahead_seconds(),
        })
    }
}

/// A cluster time as JSON: seconds, increment and the UTC time it stands for.
pub fn time_json(t: Timestamp) -> Value {
    json!({ "t": t.time, "i": t.increment, "iso": iso(t) })
}

/// A cluster time as RFC 3339 UTC (to the second).
pub fn iso(t: Timestamp) -> String {
    bson::DateTime::from_millis(i64::from(t.time) * 1000)
        .try_to_rfc3339_string()
        .unwrap_or_else(|_| t.time.to_string())
}

/// Seconds since the epoch on this machine.
pub fn wall_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reads a cluster time given by an operator: `SECONDS[.INCREMENT]`, `SECONDS,INCREMENT`, or an
/// RFC 3339 time (increment 0).
pub fn parse_time(text: &str) -> Option<Timestamp> {
    let text = text.trim();
    let split = text.split_once('.').or_else(|| text.split_once(','));
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match split {
        Some((time, increment)) if numeric(time) && numeric(increment) => Some(Timestamp {
            time: time.parse().ok()?,
            increment: increment.parse().ok()?,
        }),
        None if numeric(text) => Some(Timestamp {
            time: text.parse().ok()?,
            increment: 0,
        }),
        _ => {
            let date = bson::DateTime::parse_rfc3339_str(text).ok()?;
            let seconds = u32::try_from(date.timestamp_millis().div_euclid(1000)).ok()?;
            Some(Timestamp {
                time: seconds,
                increment: 0,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn ts(time: u32, increment: u32) -> Timestamp {
        Timestamp { time, increment }
    }

    /// A token at `time` as the test server and MongoDB encode it.
    fn token(time: u32) -> Document {
        doc! { "_data": format!("82{time:08X}00000001010000000000") }
    }

    #[test]
    fn a_checkpoint_ahead_of_the_present_is_told_past_the_allowance() {
        let at = |checkpoint: u32, cluster: Option<u32>, wall: u64| Position {
            checkpoint: Some(ts(checkpoint, 1)),
            cluster_now: cluster.map(|t| ts(t, 1)),
            window: None,
            wall_now: wall,
        };
        assert_eq!(at(1_000, Some(1_000), 1_000).ahead_seconds(), None);
        assert_eq!(at(1_060, Some(1_000), 9_000).ahead_seconds(), None);
        assert_eq!(at(1_061, Some(1_000), 9_000).ahead_seconds(), Some(61));
        // Without the deployment's time, this machine's clock stands in.
        assert_eq!(at(5_000, None, 1_000).ahead_seconds(), Some(4_000));
        assert_eq!(at(1_000, None, 1_000).ahead_seconds(), None);
        assert_eq!(
            at(5_000, Some(1_000), 1_000).to_json()["checkpoint_ahead_seconds"],
            4_000
        );
    }

    #[test]
    fn figures_follow_from_the_three_times() {
        let position = Position {
            checkpoint: Some(ts(1_000, 1)),
            cluster_now: Some(ts(1_090, 4)),
            window: Some(Window {
                oldest: ts(700, 1),
                newest: ts(1_090, 4),
            }),
            wall_now: 1_100,
        };
        assert_eq!(position.lag_seconds(), Some(90));
        assert_eq!(position.checkpoint_age_seconds(), Some(100));
        assert_eq!(position.oplog_margin_seconds(), Some(300));
        assert_eq!(position.oplog_window_seconds(), Some(390));
        assert_eq!(position.fell_off(), Some(false));
        assert_eq!(position.estimated_gap_seconds(), Some(0));
        let json = position.to_json();
        assert_eq!(json["lag_seconds"], 90);
        assert_eq!(json["checkpoint_cluster_time"]["t"], 1_000);
        assert_eq!(json["oldest_oplog_time"]["iso"], "1970-01-01T00:11:40Z");
    }

    #[test]
    fn a_checkpoint_behind_the_oplog_shows_its_gap() {
        let position = Position {
            checkpoint: Some(ts(500, 9)),
            cluster_now: Some(ts(1_000, 1)),
            window: Some(Window {
                oldest: ts(620, 1),
                newest: ts(1_000, 1),
            }),
            wall_now: 1_000,
        };
        assert_eq!(position.fell_off(), Some(true));
        assert_eq!(position.oplog_margin_seconds(), Some(-120));
        assert_eq!(position.estimated_gap_seconds(), Some(120));
        // Same second, earlier increment: still fallen off.
        let same_second = Position {
            checkpoint: Some(ts(620, 0)),
            ..position
        };
        assert_eq!(same_second.fell_off(), Some(true));
    }

    #[test]
    fn unknown_stays_unknown() {
        let position = Position::of(Some(&doc! { "_data": "nothex" }), Some(ts(5, 1)), None);
        assert_eq!(position.lag_seconds(), None);
        assert_eq!(position.oplog_margin_seconds(), None);
        assert_eq!(position.fell_off(), None);
        assert!(position.to_json()["lag_seconds"].is_null());
        let known = Position::of(Some(&token(1_000)), Some(ts(1_030, 1)), None);
        assert_eq!(known.lag_seconds(), Some(30));
    }

    #[test]
    fn operators_write_times_three_ways() {
        assert_eq!(parse_time("1700000000"), Some(ts(1_700_000_000, 0)));
        assert_eq!(parse_time("1700000000.7"), Some(ts(1_700_000_000, 7)));
        assert_eq!(parse_time("1700000000,7"), Some(ts(1_700_000_000, 7)));
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z"),
            Some(ts(1_700_000_000, 0))
        );
        for bad in ["", "abc", "1.2.3", "-5", "99999999999", "1700000000.x"] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }
}
