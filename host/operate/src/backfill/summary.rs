//! What a backfill did, for machines (JSON) and for people.

use std::time::Duration;

use handoff_domain::text::{escape_name, escape_untrusted};

/// What a backfill did.
#[derive(Debug, Clone, PartialEq)]
pub struct BackfillSummary {
    pub consumer: String,
    pub source: String,
    /// Every document was decided by the policy.
    pub done: bool,
    /// Nothing was left to do when this invocation started.
    pub already_done: bool,
    /// Whether this invocation continued a saved state.
    pub resumed: bool,
    pub restarted: bool,
    /// Whether the consumer's checkpoint was given a token.
    pub checkpoint_created: bool,
    /// Totals of the whole backfill (every invocation since its start).
    pub chunks: i64,
    pub rows: i64,
    pub dropped: i64,
    /// This invocation's share.
    pub run_chunks: i64,
    /// Documents the policy decided, and how: handed off, quarantined, skipped.
    pub run_rows: i64,
    pub run_handed_off: i64,
    pub run_quarantined: i64,
    pub run_skipped: i64,
    pub run_dropped: i64,
    pub elapsed: Duration,
}

impl BackfillSummary {
    /// The summary for machines.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "consumer": self.consumer,
            "source": self.source,
            "done": self.done,
            "already_done": self.already_done,
            "resumed": self.resumed,
            "restarted": self.restarted,
            "checkpoint_created": self.checkpoint_created,
            "chunks": self.chunks,
            "rows": self.rows,
            "dropped": self.dropped,
            "this_run": {
                "chunks": self.run_chunks,
                "rows": self.run_rows,
                "handed_off": self.run_handed_off,
                "quarantined": self.run_quarantined,
                "skipped": self.run_skipped,
                "dropped": self.run_dropped,
            },
            "elapsed_seconds": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        })
    }

    /// The summary for people.
    pub fn human(&self) -> String {
        let mut text = format!(
            "backfill of {} for consumer {}: {}\n",
            escape_untrusted(&self.source, 200),
            escape_name(&self.consumer, 64),
            if self.already_done {
                "already done (nothing to do; --restart starts over)"
            } else if self.done {
                "done"
            } else {
                "not done"
            }
        );
        text.push_str(&format!(
            "  chunks {}, documents decided by the policy {}, rows superseded by stream events {}\n",
            self.chunks, self.rows, self.dropped
        ));
        text.push_str(&format!(
            "  this run: chunks {}, documents {} (handed off {}, quarantined {}, skipped {}), superseded {}, {:.1} s{}{}\n",
            self.run_chunks,
            self.run_rows,
            self.run_handed_off,
            self.run_quarantined,
            self.run_skipped,
            self.run_dropped,
            self.elapsed.as_secs_f64(),
            if self.resumed { ", resumed" } else { "" },
            if self.restarted { ", restarted" } else { "" },
        ));
        if self.checkpoint_created {
            text.push_str(
                "  the consumer's checkpoint was started at the stream's current position\n",
            );
        }
        text
    }
}
