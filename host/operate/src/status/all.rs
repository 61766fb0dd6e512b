//! `status --all`: every consumer a checkpoint collection holds, with its lag, margin and
//! forecast, the worst first. The oplog window is read once for all of them.

use serde_json::{Value, json};

use super::{CheckpointView, Status, now_seconds, pinned_token, read_history, unavailable};
use handoff_domain::error::Result;
use handoff_domain::forecast::{self, Forecast};
use handoff_domain::position::Position;
use handoff_domain::text::escape_untrusted;
use handoff_mongo::{Connection, operator, window};

/// The most consumers listed.
pub const MAX_CONSUMERS: i64 = 1000;

/// Where the consumers' state lives.
pub struct Place<'a> {
    pub database: &'a str,
    pub checkpoints: &'a str,
    pub runs: &'a str,
}

/// Every consumer of `place`, worst first (see [`severity`]).
pub fn read_all(connection: &Connection, place: &Place<'_>) -> Result<Vec<Status>> {
    connection.block_on(async {
        let stored =
            operator::checkpoints(connection, place.database, place.checkpoints, MAX_CONSUMERS)
                .await
                .map_err(unavailable)?;
        if stored.len() as i64 >= MAX_CONSUMERS {
            tracing::warn!(
                listed = MAX_CONSUMERS,
                "more consumers than are listed: the first {MAX_CONSUMERS} are"
            );
        }
        let (window, cluster_now) = window::figures(connection).await;
        let mut all = Vec::new();
        for checkpoint in &stored {
            // A document a consumer cannot have written (another `_id` type) is passed over.
            let Ok(consumer) = checkpoint.get_str("_id") else {
                continue;
            };
            let token = pinned_token(checkpoint, connection);
            let position = Position::of(token, cluster_now, window);
            let history = read_history(connection, place.database, place.runs, consumer).await;
            all.push(Status {
                consumer: consumer.to_string(),
                source: checkpoint
                    .get_str("source")
                    .unwrap_or("unknown")
                    .to_string(),
                checkpoint: Some(CheckpointView::of(checkpoint)),
                forecast: forecast::forecast(&history, &position, now_seconds()),
                position,
                outbox_records: None,
                last_record_time: None,
                history,
            });
        }
        all.sort_by(|a, b| {
            severity(a)
                .partial_cmp(&severity(b))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.consumer.cmp(&b.consumer))
        });
        Ok(all)
    })
}

/// How bad a consumer's state is, smaller first: a checkpoint after the present or off the
/// oplog; then a forecast loss, soonest first; then those that cannot be forecast, the smallest
/// margin first (an unknown margin last of them); then the healthy, smallest margin first.
pub fn severity(status: &Status) -> (u8, f64) {
    let p = &status.position;
    if p.ahead_seconds().is_some() || p.fell_off() == Some(true) {
        return (0, 0.0);
    }
    let margin = p.oplog_margin_seconds().map_or(f64::MAX, |m| m as f64);
    match &status.forecast {
        Forecast::Lost => (0, 0.0),
        Forecast::FallsOff { eta_seconds, .. } => (1, *eta_seconds as f64),
        Forecast::Unknown { .. } => (2, margin),
        Forecast::Holds { .. } => (3, margin),
    }
}

/// One line per consumer: its name, source, lag, margin, forecast and last run.
pub fn table(all: &[Status]) -> String {
    let seconds = |s: Option<i64>| s.map_or("unknown".to_string(), |s| format!("{s} s"));
    let mut rows = vec![[
        "consumer".to_string(),
        "source".into(),
        "lag".into(),
        "margin".into(),
        "history lost in".into(),
        "last run".into(),
    ]];
    for status in all {
        let p = &status.position;
        let eta = match &status.forecast {
            Forecast::Lost => "LOST".to_string(),
            Forecast::FallsOff { eta_seconds, .. } => format!("{eta_seconds} s"),
            Forecast::Holds { .. } => "not at these rates".into(),
            Forecast::Unknown { .. } => "unknown".into(),
        };
        let eta = if p.ahead_seconds().is_some() {
            "ERROR: checkpoint ahead".into()
        } else {
            eta
        };
        let last = status.history.last().map_or("none".to_string(), |r| {
            format!(
                "{} {}",
                escape_untrusted(&r.status, 32),
                r.ended_at.try_to_rfc3339_string().unwrap_or_default()
            )
        });
        rows.push([
            escape_untrusted(&status.consumer, 64),
            escape_untrusted(&status.source, 128),
            seconds(p.lag_seconds()),
            seconds(p.oplog_margin_seconds()),
            eta,
            last,
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            format!("{}\n", cells.join("  ").trim_end())
        })
        .collect()
}

/// The consumers as one JSON document, worst first.
pub fn to_json(place: &Place<'_>, all: &[Status]) -> Value {
    json!({
        "database": place.database,
        "checkpoint_collection": place.checkpoints,
        "consumers": all.iter().map(Status::to_json).collect::<Vec<_>>(),
    })
}
