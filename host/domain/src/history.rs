//! A consumer's run history: one small record per run against a deployment, kept in the runs
//! collection of the consumer's database (`kestra_change_runs` unless named), bounded by count.
//!
//! A run's record is written with the release of its lease, in the same command, so keeping the
//! history adds no round trip to a run; a record that cannot be written is logged and never fails
//! a run that committed. Records are slots: run `n` of a consumer (the checkpoint's `runs`
//! counter, which each run's claim increments) is stored under `{consumer, slot: n % keep}`, so a
//! consumer never holds more than `keep` records and the oldest are overwritten first.
//!
//! From the history, [`forecast`](super::forecast) estimates when the checkpoint would fall off
//! the oplog if the rates hold.

use bson::{Bson, DateTime, Document, Timestamp, doc};

use super::position::Position;

/// The runs collection when none is named.
pub const DEFAULT_RUNS: &str = "kestra_change_runs";
/// Records kept per consumer when not told otherwise.
pub const DEFAULT_KEEP: u32 = 1000;
/// Records read back for a forecast or a report: the most recent ones.
pub const READ_BACK: usize = 200;
/// The checkpoint's counter of runs (incremented by each run's claim).
pub const RUNS_FIELD: &str = "runs";
/// The checkpoint's counter of the operator's moves of it (`checkpoint reset`, `recover`): a
/// run's record keeps it, so the runs before a move are not taken for the consumer's pace.
pub const MOVES_FIELD: &str = "moves";

/// One run, as its history keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub consumer: String,
    pub source: String,
    /// The run's number for its consumer (1 for the first).
    pub run: i64,
    /// The operator's moves of the checkpoint before the run ([`MOVES_FIELD`]).
    pub moves: i64,
    pub started_at: DateTime,
    pub ended_at: DateTime,
    /// `IDLE`, `HANDED_OFF`, `INVALIDATED` or `FAILED`.
    pub status: String,
    /// The failure's class (`history_lost`, …) for a failed run.
    pub error_class: Option<String>,
    pub exit_code: u8,
    pub events_handed_off: u32,
    pub events_skipped: u32,
    pub events_quarantined: u32,
    /// Whether the run kept its stream open (follow mode).
    pub follow: bool,
    /// The figures read at the run's end; unknown when they could not be read.
    pub checkpoint_time: Option<Timestamp>,
    pub cluster_time: Option<Timestamp>,
    pub oplog_oldest: Option<Timestamp>,
    pub oplog_newest: Option<Timestamp>,
    /// This machine's time when the figures were read, in seconds since the epoch.
    pub figures_at: Option<u64>,
}

impl RunRecord {
    /// The figures of the run's end.
    pub fn with_position(mut self, position: Option<&Position>) -> RunRecord {
        if let Some(p) = position {
            self.checkpoint_time = p.checkpoint;
            self.cluster_time = p.cluster_now;
            self.oplog_oldest = p.window.map(|w| w.oldest);
            self.oplog_newest = p.window.map(|w| w.newest);
            self.figures_at = Some(p.wall_now);
        }
        self
    }

    /// The figures as a [`Position`] (what status shows of the run).
    pub fn position(&self) -> Position {
        Position {
            checkpoint: self.checkpoint_time,
            cluster_now: self.cluster_time,
            window: match (self.oplog_oldest, self.oplog_newest) {
                (Some(oldest), Some(newest)) => Some(super::position::Window { oldest, newest }),
                _ => None,
            },
            wall_now: self
                .figures_at
                .unwrap_or_else(|| (self.ended_at.timestamp_millis() / 1000).max(0) as u64),
        }
    }

    /// The record's `_id`: its consumer and slot.
    pub fn id(&self, keep: u32) -> Document {
        let slot = self.run.rem_euclid(i64::from(keep.max(1)));
        doc! { "consumer": &self.consumer, "slot": slot }
    }

    /// The stored document, figures derived from the times included (what a reader of the
    /// collection wants without decoding timestamps).
    pub fn document(&self, keep: u32) -> Document {
        let position = self.position();
        let time = |t: Option<Timestamp>| t.map_or(Bson::Null, Bson::Timestamp);
        let seconds = |s: Option<i64>| s.map_or(Bson::Null, Bson::Int64);
        doc! {
            "_id": self.id(keep),
            "consumer": &self.consumer,
            "source": &self.source,
            "run": self.run,
            "moves": self.moves,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
            "durationMs": self.ended_at.timestamp_millis() - self.started_at.timestamp_millis(),
            "status": &self.status,
            "errorClass": self.error_class.as_deref().map_or(Bson::Null, Bson::from),
            "exitCode": i32::from(self.exit_code),
            "events": {
                "handedOff": i64::from(self.events_handed_off),
                "skipped": i64::from(self.events_skipped),
                "quarantined": i64::from(self.events_quarantined),
            },
            "follow": self.follow,
            "checkpointTime": time(self.checkpoint_time),
            "clusterTime": time(self.cluster_time),
            "oplogOldest": time(self.oplog_oldest),
            "oplogNewest": time(self.oplog_newest),
            "figuresAt": self.figures_at.map_or(Bson::Null, |s| Bson::Int64(s as i64)),
            "lagSeconds": seconds(position.lag_seconds()),
            "checkpointAgeSeconds": seconds(
                self.figures_at.and(position.checkpoint_age_seconds())
            ),
            "oplogMarginSeconds": seconds(position.oplog_margin_seconds()),
            "oplogWindowSeconds": seconds(position.oplog_window_seconds()),
        }
    }

    /// A stored record read back; `None` for a document that is not one (the collection is
    /// anyone's to write: a foreign document is passed over, never trusted).
    pub fn from_document(stored: &Document) -> Option<RunRecord> {
        let time = |key: &str| stored.get_timestamp(key).ok();
        let count = |events: &Document, key: &str| -> Option<u32> {
            match events.get(key)? {
                Bson::Int64(n) => u32::try_from(*n).ok(),
                Bson::Int32(n) => u32::try_from(*n).ok(),
                _ => None,
            }
        };
        let events = stored.get_document("events").ok()?;
        let figures_at = match stored.get("figuresAt") {
            Some(Bson::Int64(s)) => u64::try_from(*s).ok(),
            _ => None,
        };
        Some(RunRecord {
            consumer: stored.get_str("consumer").ok()?.to_string(),
            source: stored.get_str("source").ok()?.to_string(),
            run: match stored.get("run")? {
                Bson::Int64(n) => *n,
                Bson::Int32(n) => i64::from(*n),
                _ => return None,
            },
            moves: match stored.get(MOVES_FIELD) {
                Some(Bson::Int64(n)) => *n,
                Some(Bson::Int32(n)) => i64::from(*n),
                _ => 0,
            },
            started_at: *stored.get_datetime("startedAt").ok()?,
            ended_at: *stored.get_datetime("endedAt").ok()?,
            status: stored.get_str("status").ok()?.to_string(),
            error_class: stored.get_str("errorClass").ok().map(str::to_string),
            exit_code: stored
                .get_i32("exitCode")
                .ok()
                .and_then(|c| u8::try_from(c).ok())?,
            events_handed_off: count(events, "handedOff")?,
            events_skipped: count(events, "skipped")?,
            events_quarantined: count(events, "quarantined")?,
            follow: stored.get_bool("follow").unwrap_or(false),
            checkpoint_time: time("checkpointTime"),
            cluster_time: time("clusterTime"),
            oplog_oldest: time("oplogOldest"),
            oplog_newest: time("oplogNewest"),
            figures_at,
        })
    }

    /// Whether the run failed.
    pub fn failed(&self) -> bool {
        self.error_class.is_some()
    }
}

/// Stored records read back, in run order (oldest first), foreign documents left out.
pub fn records(stored: &[Document]) -> Vec<RunRecord> {
    let mut records: Vec<RunRecord> = stored.iter().filter_map(RunRecord::from_document).collect();
    records.sort_by_key(|r| (r.ended_at, r.run));
    records
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::Window;

    fn record(run: i64) -> RunRecord {
        RunRecord {
            consumer: "orders".into(),
            source: "shop.orders".into(),
            run,
            moves: 0,
            started_at: DateTime::from_millis(1_000),
            ended_at: DateTime::from_millis(2_500),
            status: "HANDED_OFF".into(),
            error_class: None,
            exit_code: 0,
            events_handed_off: 7,
            events_skipped: 1,
            events_quarantined: 2,
            follow: false,
            checkpoint_time: None,
            cluster_time: None,
            oplog_oldest: None,
            oplog_newest: None,
            figures_at: None,
        }
    }

    #[test]
    fn a_record_reads_back_as_written_with_its_figures() {
        let position = Position {
            checkpoint: Some(Timestamp {
                time: 100,
                increment: 2,
            }),
            cluster_now: Some(Timestamp {
                time: 104,
                increment: 1,
            }),
            window: Some(Window {
                oldest: Timestamp {
                    time: 40,
                    increment: 1,
                },
                newest: Timestamp {
                    time: 104,
                    increment: 1,
                },
            }),
            wall_now: 105,
        };
        let written = record(3).with_position(Some(&position));
        let stored = written.document(1000);
        assert_eq!(stored.get_i64("lagSeconds").unwrap(), 4);
        assert_eq!(stored.get_i64("oplogMarginSeconds").unwrap(), 60);
        assert_eq!(stored.get_i64("oplogWindowSeconds").unwrap(), 64);
        assert_eq!(stored.get_i64("checkpointAgeSeconds").unwrap(), 5);
        assert_eq!(stored.get_i64("durationMs").unwrap(), 1_500);
        assert_eq!(RunRecord::from_document(&stored), Some(written));
    }

    #[test]
    fn runs_share_slots_modulo_what_is_kept() {
        assert_eq!(record(1).id(3), record(4).id(3));
        assert_ne!(record(1).id(3), record(2).id(3));
        assert_eq!(
            record(5).id(0),
            record(6).id(0),
            "a keep of 0 is taken as 1"
        );
    }

    #[test]
    fn foreign_documents_are_passed_over() {
        let good = record(2).document(10);
        let mut bad = good.clone();
        bad.insert("events", "many");
        let mut negative = good.clone();
        negative.insert("exitCode", -1);
        let read = records(&[doc! {"x": 1}, bad, negative, good, record(1).document(10)]);
        assert_eq!(read.iter().map(|r| r.run).collect::<Vec<_>>(), vec![1, 2]);
    }
}
