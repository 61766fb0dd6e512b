//! The recovery marker: what a recovery records in the checkpoint when it moves it, kept until
//! its repair is complete.

use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document, Timestamp, doc};
use serde_json::{Value, json};

use handoff_domain::position::{iso, time_json};
use handoff_domain::text::escape_untrusted;

/// The checkpoint's field that holds the marker.
pub const FIELD: &str = "recovering";

/// Why a consumer's saved position can no longer be read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Its token is older than the oplog (a run's exit 6).
    HistoryLost,
    /// Its token cannot resume with its mode (exit 7).
    InvalidToken,
    /// The server ends the stream for good (exit 8).
    StreamFatal,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::HistoryLost => "history lost",
            Cause::InvalidToken => "invalid token",
            Cause::StreamFatal => "stream fatal",
        }
    }

    fn parse(text: &str) -> Option<Cause> {
        [Cause::HistoryLost, Cause::InvalidToken, Cause::StreamFatal]
            .into_iter()
            .find(|c| c.as_str() == text)
    }

    /// What it means, for people.
    pub fn explained(self) -> &'static str {
        match self {
            Cause::HistoryLost => "the checkpoint's token is older than the oldest oplog entry",
            Cause::InvalidToken => "the checkpoint's token cannot resume with its mode",
            Cause::StreamFatal => "the server ends the stream from the checkpoint for good",
        }
    }
}

/// A recovery in progress: the checkpoint was moved, the repair is not complete yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub id: ObjectId,
    /// When the checkpoint was moved.
    pub since: DateTime,
    pub reason: String,
    pub cause: Option<Cause>,
    /// The old checkpoint's cluster time.
    pub lost_from: Option<Timestamp>,
    /// The oldest oplog entry's time when the loss was seen (history lost), else the new position's.
    pub lost_to: Option<Timestamp>,
    /// The estimated seconds of history no run handed off.
    pub gap_seconds: Option<i64>,
    /// The new position's cluster time.
    pub to: Option<Timestamp>,
    /// The marker as stored (what its clearing compares with): `None` until stored.
    pub stored: Option<Document>,
}

impl Marker {
    /// A new marker (not stored yet).
    pub fn new(reason: &str, cause: Cause) -> Marker {
        Marker {
            id: ObjectId::new(),
            since: DateTime::now(),
            reason: reason.to_string(),
            cause: Some(cause),
            lost_from: None,
            lost_to: None,
            gap_seconds: None,
            to: None,
            stored: None,
        }
    }

    /// The marker a checkpoint holds, if any (whatever its fields: one that is no document is
    /// none).
    pub fn of(checkpoint: &Document) -> Option<Marker> {
        let stored = checkpoint.get_document(FIELD).ok()?;
        let time = |key: &str| stored.get_timestamp(key).ok();
        Some(Marker {
            id: stored
                .get_object_id("id")
                .unwrap_or_else(|_| ObjectId::from_bytes([0; 12])),
            since: stored
                .get_datetime("since")
                .copied()
                .unwrap_or(DateTime::MIN),
            reason: stored.get_str("reason").unwrap_or_default().to_string(),
            cause: stored.get_str("cause").ok().and_then(Cause::parse),
            lost_from: time("lost_from"),
            lost_to: time("lost_to"),
            gap_seconds: match stored.get("gap_seconds") {
                Some(Bson::Int64(n)) => Some(*n),
                Some(Bson::Int32(n)) => Some(i64::from(*n)),
                _ => None,
            },
            to: time("to"),
            stored: Some(stored.clone()),
        })
    }

    /// The marker as the checkpoint stores it.
    pub fn document(&self) -> Document {
        let time = |t: Option<Timestamp>| t.map_or(Bson::Null, Bson::Timestamp);
        doc! {
            "id": self.id,
            "since": self.since,
            "reason": &self.reason,
            "cause": self.cause.map(Cause::as_str),
            "lost_from": time(self.lost_from),
            "lost_to": time(self.lost_to),
            "gap_seconds": self.gap_seconds,
            "to": time(self.to),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "since": self.since.try_to_rfc3339_string().ok(),
            "reason": escape_untrusted(&self.reason, 500),
            "cause": self.cause.map(Cause::as_str),
            "lost_from": self.lost_from.map(time_json),
            "lost_to": self.lost_to.map(time_json),
            "gap_seconds": self.gap_seconds,
            "to": self.to.map(time_json),
        })
    }

    /// The lost window, for people: `FROM to TO (about N s)`.
    pub fn window(&self) -> String {
        let time = |t: Option<Timestamp>| {
            t.map_or("unknown".to_string(), |t| {
                format!("{} ({}.{})", iso(t), t.time, t.increment)
            })
        };
        let gap = self
            .gap_seconds
            .map_or("unknown".to_string(), |g| format!("about {g} s"));
        format!("{} to {} ({gap})", time(self.lost_from), time(self.lost_to))
    }

    /// `status`'s line about a recovery in progress.
    pub fn describe(&self) -> String {
        format!(
            "a recovery moved the checkpoint at {} ({}; reason: {}) and has not completed its \
             repair: `handoff recover --reason TEXT` with the consumer's flags completes it",
            self.since.try_to_rfc3339_string().unwrap_or_default(),
            self.cause.map_or("cause unknown", Cause::as_str),
            escape_untrusted(&self.reason, 200)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_reads_back_as_stored() {
        let mut marker = Marker::new("INC-42", Cause::HistoryLost);
        marker.lost_from = Some(Timestamp {
            time: 100,
            increment: 1,
        });
        marker.lost_to = Some(Timestamp {
            time: 160,
            increment: 2,
        });
        marker.gap_seconds = Some(60);
        let checkpoint = doc! { "_id": "c", FIELD: marker.document() };
        let read = Marker::of(&checkpoint).expect("a marker");
        assert_eq!(read.stored.as_ref(), Some(&marker.document()));
        assert_eq!(
            Marker {
                stored: None,
                ..read.clone()
            },
            marker
        );
        assert!(read.window().contains("about 60 s"), "{}", read.window());
        assert!(read.describe().contains("INC-42"));
        assert_eq!(read.to_json()["cause"], "history lost");
        assert!(Marker::of(&doc! { "_id": "c" }).is_none());
        assert!(Marker::of(&doc! { FIELD: 1 }).is_none());
        // A marker of unknown shape is still one: a recovery then completes it.
        let odd = Marker::of(&doc! { FIELD: { "reason": "\u{1b}[2J" } }).expect("a marker");
        assert_eq!(odd.cause, None);
        assert!(!odd.describe().contains('\u{1b}'));
    }
}
