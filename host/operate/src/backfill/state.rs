//! A backfill's saved progress: the state document, one per consumer, that says where the
//! chunks resume and what the next commit compares against.

use bson::{Bson, DateTime, Document, doc};

/// The saved progress of a consumer's backfill.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub source: String,
    pub last_key: Option<Bson>,
    pub chunks: i64,
    pub rows: i64,
    pub dropped: i64,
    pub started_at: DateTime,
    pub done: bool,
}

impl State {
    pub(super) fn fresh(source: &str, now: DateTime) -> State {
        State {
            source: source.to_string(),
            last_key: None,
            chunks: 0,
            rows: 0,
            dropped: 0,
            started_at: now,
            done: false,
        }
    }

    /// Reads a state document; `None` when its shape is not one this command writes.
    pub fn from_document(stored: &Document) -> Option<State> {
        let number = |key: &str| match stored.get(key) {
            Some(Bson::Int64(n)) if *n >= 0 => Some(*n),
            Some(Bson::Int32(n)) if *n >= 0 => Some(i64::from(*n)),
            _ => None,
        };
        Some(State {
            source: stored.get_str("source").ok()?.to_string(),
            last_key: match stored.get("last_key") {
                None | Some(Bson::Null) => None,
                Some(key) => Some(key.clone()),
            },
            chunks: number("chunks")?,
            rows: number("rows")?,
            dropped: number("dropped").unwrap_or(0),
            started_at: *stored.get_datetime("started_at").ok()?,
            done: stored.get_bool("done").ok()?,
        })
    }

    /// The document saved for `consumer`.
    pub fn to_document(&self, consumer: &str, now: DateTime) -> Document {
        doc! {
            "_id": consumer,
            "source": &self.source,
            "last_key": self.last_key.clone().unwrap_or(Bson::Null),
            "chunks": self.chunks,
            "rows": self.rows,
            "dropped": self.dropped,
            "started_at": self.started_at,
            "updated_at": now,
            "done": self.done,
        }
    }

    /// The compare-and-set filter that matches this state (and no later one).
    pub(super) fn filter(&self, consumer: &str) -> Document {
        doc! {
            "_id": consumer,
            "chunks": self.chunks,
            "last_key": { "$eq": self.last_key.clone().unwrap_or(Bson::Null) },
            "done": self.done,
        }
    }

    /// Figures for the audit record (no keys, no documents).
    pub(super) fn figures(&self) -> Document {
        doc! { "source": &self.source, "chunks": self.chunks, "rows": self.rows, "dropped": self.dropped, "done": self.done }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_its_filter_names_it() {
        let mut state = State::fresh("db.orders", DateTime::from_millis(1));
        state.last_key = Some(Bson::Int32(500));
        state.chunks = 3;
        state.rows = 1490;
        state.dropped = 10;
        let stored = state.to_document("c", DateTime::from_millis(2));
        assert_eq!(State::from_document(&stored), Some(state.clone()));
        let filter = state.filter("c");
        assert_eq!(filter.get_i64("chunks").unwrap(), 3);
        assert_eq!(
            filter.get_document("last_key").unwrap(),
            &doc! { "$eq": 500 }
        );
        let fresh = State::fresh("db.orders", DateTime::from_millis(1))
            .to_document("c", DateTime::from_millis(1));
        assert_eq!(fresh.get("last_key"), Some(&Bson::Null));
        assert!(State::from_document(&doc! { "_id": "c", "source": "x" }).is_none());
    }
}
