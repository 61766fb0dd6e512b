//! `status`: where a consumer stands, read in one pass and changing nothing.

mod all;
pub use all::{MAX_CONSUMERS, Place, read_all, severity, table, to_json};

use bson::{Bson, Document, Timestamp};
use serde_json::{Value, json};

use handoff_domain::checkpoint;
use handoff_domain::config::Scope;
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::forecast::{self, Forecast};
use handoff_domain::history::{self, RunRecord};
use handoff_domain::position::{Position, iso, time_json};
use handoff_domain::text::{did_you_mean, escape_untrusted, known_names_hint};
use handoff_mongo::{Connection, OperationError, operator, window};

/// How long each outbox figure may take.
pub const OUTBOX_READ_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What `status` reads about one consumer.
#[derive(Debug, Clone)]
pub struct Status {
    pub consumer: String,
    pub source: String,
    pub checkpoint: Option<CheckpointView>,
    pub position: Position,
    /// The consumer's outbox records (none: counting took longer than allowed).
    pub outbox_records: Option<u64>,
    /// The cluster time of the outbox record inserted last.
    pub last_record_time: Option<Timestamp>,
    /// The consumer's recorded runs, oldest first (none when the history cannot be read).
    pub history: Vec<RunRecord>,
    /// When the checkpoint would fall off the oplog if the rates hold.
    pub forecast: Forecast,
}

/// The checkpoint as stored, described without its token.
#[derive(Debug, Clone)]
pub struct CheckpointView {
    pub source: Option<String>,
    pub mode: Option<String>,
    pub has_token: bool,
    pub revision: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<bson::DateTime>,
    /// A recovery that moved the checkpoint and has not completed its repair.
    pub recovering: Option<super::recover::Marker>,
}

/// Where the consumer's state lives.
pub struct Target<'a> {
    /// What the consumer watches (its checkpoint's `source` follows from it).
    pub scope: Scope,
    pub database: &'a str,
    pub collection: &'a str,
    pub consumer: &'a str,
    pub checkpoints: &'a str,
    pub outbox: &'a str,
    pub runs: &'a str,
}

/// The refusal of a consumer no checkpoint names: the consumers and databases there are, the
/// near ones suggested (a mistyped name should not read as a healthy consumer that never ran).
pub async fn unknown_consumer(
    connection: &Connection,
    database: &str,
    checkpoints: &str,
    consumer: &str,
) -> HandoffError {
    let place = format!("{}.{}", database, checkpoints);
    let shown = escape_untrusted(consumer, 64);
    let databases = operator::database_names(connection).await;
    if let Some(databases) = databases.filter(|d| !d.iter().any(|n| n == database)) {
        let hint = did_you_mean(database, databases.iter().map(String::as_str));
        return HandoffError::BadInput(format!(
            "no consumer {shown}: the database {} does not exist{hint}",
            escape_untrusted(database, 64)
        ));
    }
    // Only names a consumer can have are shown: the collection may hold anything.
    let known: Vec<String> = operator::consumer_ids(connection, database, checkpoints, 1000)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|k| {
            k.len() <= 64
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        })
        .collect();
    let hint = known_names_hint(consumer, &known, &place);
    HandoffError::BadInput(format!(
        "no consumer {shown} in {place}: it has never run here, or its name or collections \
         are mistyped{hint}"
    ))
}

impl Status {
    /// Reads the checkpoint, the deployment's figures and the outbox's.
    pub fn read(connection: &Connection, target: &Target<'_>) -> Result<Status> {
        connection.block_on(async {
            let stored = operator::consumer_document(
                connection,
                target.database,
                target.checkpoints,
                target.consumer,
                "the checkpoint",
            )
            .await
            .map_err(unavailable)?;
            if stored.is_none() {
                return Err(unknown_consumer(
                    connection,
                    target.database,
                    target.checkpoints,
                    target.consumer,
                )
                .await);
            }
            // A checkpoint of another deployment is refused as `run` refuses it: its token's
            // figures against this one would mean nothing.
            let token = match &stored {
                Some(stored) => checkpoint::token_on(stored, connection.deployment().pin())?,
                None => None,
            };
            let position = window::position(connection, token).await;
            // The outbox figures scan the outbox: on a large one they are given up after
            // OUTBOX_READ_WAIT (shown as unknown) rather than holding the command up.
            let (records, last_record_time) = operator::outbox_figures(
                connection,
                target.database,
                target.outbox,
                target.consumer,
                OUTBOX_READ_WAIT,
                "the outbox",
            )
            .await
            .map_err(unavailable)?;
            let history =
                read_history(connection, target.database, target.runs, target.consumer).await;
            Ok(Status {
                consumer: target.consumer.to_string(),
                source: target.scope.source(target.database, target.collection),
                checkpoint: stored.as_ref().map(CheckpointView::of),
                forecast: forecast::forecast(&history, &position, now_seconds()),
                position,
                outbox_records: records,
                last_record_time,
                history,
            })
        })
    }

    pub fn to_json(&self) -> Value {
        let checkpoint = self.checkpoint.as_ref().map(|c| {
            json!({
                "source": c.source,
                "mode": c.mode,
                "has_token": c.has_token,
                "revision": c.revision,
                // Only a lease still running: one given back or expired holds nothing.
                "lease": c.active_lease().map(|(owner, until)| json!({
                    "owner": owner,
                    "until": until.try_to_rfc3339_string().ok(),
                })),
                "recovering": c.recovering.as_ref().map(super::recover::Marker::to_json),
            })
        });
        let mut value = json!({
            "consumer": self.consumer,
            "source": self.source,
            "checkpoint": checkpoint,
            "outbox": {
                "records": self.outbox_records,
                "last_record_cluster_time": self.last_record_time.map(time_json),
            },
        });
        if let (Value::Object(map), Value::Object(figures)) = (&mut value, self.position.to_json())
        {
            map.extend(figures);
        }
        if let Value::Object(map) = &mut value {
            map.insert(
                "history_loss_eta_seconds".into(),
                json!(self.forecast.eta_seconds()),
            );
            map.insert("forecast".into(), self.forecast.to_json());
            map.insert("runs".into(), runs_json(&self.history));
        }
        value
    }

    /// The human view: one labelled line per figure.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let p = &self.position;
        let time = |t: Option<Timestamp>| {
            t.map_or("unknown".to_string(), |t| {
                format!("{} ({}.{})", iso(t), t.time, t.increment)
            })
        };
        let seconds = |s: Option<i64>| {
            s.map_or("unknown".to_string(), |s| {
                let sign = if s < 0 { "-" } else { "" };
                format!(
                    "{sign}{} ({s} s)",
                    super::progress::human_duration(s.unsigned_abs() as f64)
                )
            })
        };
        let checkpoint = match &self.checkpoint {
            None => "none (the consumer has not run yet)".to_string(),
            Some(c) => {
                let mut text = format!(
                    "{}, {}",
                    escape_untrusted(c.mode.as_deref().unwrap_or("resumeAfter"), 32),
                    if c.has_token {
                        "token saved"
                    } else {
                        "no token yet"
                    }
                );
                if let Some(revision) = c.revision {
                    text.push_str(&format!(", revision {revision}"));
                }
                match c.active_lease() {
                    Some((owner, until)) => {
                        text.push_str(&format!(
                            ", leased by {} until {}",
                            escape_untrusted(owner, 128),
                            until.try_to_rfc3339_string().unwrap_or_default()
                        ));
                    }
                    None => text.push_str(", lease free"),
                }
                if c.source.as_deref() != Some(self.source.as_str()) {
                    text.push_str(&format!(
                        " (belongs to {}!)",
                        escape_untrusted(c.source.as_deref().unwrap_or("no source"), 256)
                    ));
                }
                text
            }
        };
        let mut rows = vec![
            ("consumer", format!("{} on {}", self.consumer, self.source)),
            ("checkpoint", checkpoint),
            ("checkpoint at", time(p.checkpoint)),
            ("cluster time", time(p.cluster_now)),
            ("lag", seconds(p.lag_seconds())),
            ("checkpoint age", seconds(p.checkpoint_age_seconds())),
            ("oldest in oplog", time(p.window.map(|w| w.oldest))),
            ("oplog window", seconds(p.oplog_window_seconds())),
            ("oplog margin", seconds(p.oplog_margin_seconds())),
            (
                "outbox",
                format!(
                    "{} records, last at {}",
                    self.outbox_records
                        .map_or("unknown".to_string(), |n| n.to_string()),
                    time(self.last_record_time)
                ),
            ),
            ("runs", runs_text(&self.history)),
            ("forecast", self.forecast.sentence()),
        ];
        if let Some(ahead) = p.ahead_seconds() {
            rows.push((
                "ERROR",
                format!(
                    "the checkpoint stands {ahead} s after the deployment's present: every event \
                     written until then is skipped without a trace; move it back with \
                     `handoff checkpoint reset --to now` (or --to-time), then reconcile"
                ),
            ));
        }
        if let Some(marker) = self.checkpoint.as_ref().and_then(|c| c.recovering.as_ref()) {
            rows.push(("RECOVERING", marker.describe()));
        }
        if p.fell_off() == Some(true) {
            rows.push((
                "WARNING",
                format!(
                    "the checkpoint is older than the oplog: about {} s of history are gone",
                    p.estimated_gap_seconds().unwrap_or(0)
                ),
            ));
        }
        rows
    }
}

impl CheckpointView {
    /// The run holding the consumer now, and until when.
    pub fn active_lease(&self) -> Option<(&str, bson::DateTime)> {
        match (&self.lease_owner, self.lease_until) {
            (Some(owner), Some(until)) if until > bson::DateTime::now() => Some((owner, until)),
            _ => None,
        }
    }

    fn of(stored: &Document) -> CheckpointView {
        CheckpointView {
            source: stored.get_str("source").ok().map(str::to_string),
            mode: stored.get_str("mode").ok().map(str::to_string),
            has_token: matches!(stored.get("token"), Some(Bson::Document(_))),
            revision: match stored.get("revision") {
                Some(Bson::Int64(n)) => Some(*n),
                Some(Bson::Int32(n)) => Some(i64::from(*n)),
                _ => None,
            },
            lease_owner: stored.get_str("owner").ok().map(str::to_string),
            lease_until: stored.get_datetime("leaseUntil").ok().copied(),
            recovering: super::recover::Marker::of(stored),
        }
    }
}

impl Status {
    /// The run history drawn for an HTML report: lag, margin (with the forecast) and events
    /// per run.
    pub fn charts(&self) -> Vec<crate::report::Chart> {
        charts(&self.history, &self.position, &self.forecast)
    }
}

/// The charts of `history`, the margin's forecast drawn from `now`.
pub fn charts(
    history: &[RunRecord],
    now: &Position,
    forecast: &Forecast,
) -> Vec<crate::report::Chart> {
    use crate::report::{Forecast as Line, RunPoint, history_charts};
    let points: Vec<RunPoint> = history
        .iter()
        .map(|r| {
            let p = r.position();
            RunPoint {
                ended_at: r.ended_at,
                lag_seconds: p.lag_seconds(),
                oplog_margin_seconds: p.oplog_margin_seconds(),
                events: u64::from(r.events_handed_off),
                failed: r.failed(),
            }
        })
        .collect();
    let line = now.oplog_margin_seconds().map(|margin| Line {
        // The figures' second, drawn no earlier than the last run's end (to the millisecond).
        at: bson::DateTime::from_millis(
            (now.wall_now as i64).saturating_mul(1000).max(
                points
                    .iter()
                    .map(|p| p.ended_at.timestamp_millis())
                    .max()
                    .unwrap_or(0),
            ),
        ),
        margin_seconds: margin,
        eta_seconds: forecast.eta_seconds(),
    });
    history_charts(&points, line.as_ref())
}

/// A checkpoint's token, when the checkpoint belongs to this deployment: another's token has no
/// figures here (its consumer's are shown as unknown, with a warning).
pub fn pinned_token<'a>(stored: &'a Document, connection: &Connection) -> Option<&'a Document> {
    checkpoint::token_on(stored, connection.deployment().pin()).unwrap_or_else(|error| {
        tracing::warn!(
            consumer = %escape_untrusted(stored.get_str("_id").unwrap_or("?"), 64),
            reason = %error,
            "a checkpoint of another deployment: its figures are unknown here"
        );
        None
    })
}

/// The charts of a consumer's run history as `status` reads them (for another command's
/// report); none when the checkpoint cannot be read.
pub fn read_charts(
    connection: &Connection,
    database: &str,
    checkpoints: &str,
    runs: &str,
    consumer: &str,
) -> Vec<crate::report::Chart> {
    connection.block_on(async {
        let token = window::checkpoint_token(connection, database, checkpoints, consumer).await;
        let position = window::position(connection, token.as_ref()).await;
        let history = read_history(connection, database, runs, consumer).await;
        let forecast = forecast::forecast(&history, &position, now_seconds());
        charts(&history, &position, &forecast)
    })
}

/// Seconds since the epoch on this machine, to the millisecond.
pub fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A consumer's recorded runs, oldest first; none when the history cannot be read (a user
/// without `find` on it): the forecast then says it is not estimable.
pub async fn read_history(
    connection: &Connection,
    database: &str,
    runs: &str,
    consumer: &str,
) -> Vec<RunRecord> {
    let read = operator::run_history(
        connection,
        database,
        runs,
        consumer,
        history::READ_BACK as i64,
    );
    match tokio::time::timeout(window::READ_WAIT, read).await {
        Ok(Ok(stored)) => history::records(&stored),
        Err(_) => {
            tracing::warn!("reading the run history took too long; the forecast is not estimable");
            Vec::new()
        }
        Ok(Err(error)) => {
            tracing::warn!(
                error = %escape_untrusted(&error.text, 500),
                "the run history cannot be read; the forecast is not estimable"
            );
            Vec::new()
        }
    }
}

/// The runs in one line: how many are recorded, the last one, the failures among the recent.
fn runs_text(history: &[RunRecord]) -> String {
    let Some(last) = history.last() else {
        return "none recorded".into();
    };
    let recent = &history[history.len().saturating_sub(20)..];
    let failed = recent.iter().filter(|r| r.failed()).count();
    format!(
        "{} recorded; the last ended {} at {} ({} handed off); {} of the last {} failed",
        history.len(),
        escape_untrusted(&last.status, 32),
        last.ended_at.try_to_rfc3339_string().unwrap_or_default(),
        last.events_handed_off,
        failed,
        recent.len()
    )
}

fn runs_json(history: &[RunRecord]) -> Value {
    let last = history.last().map(|r| {
        json!({
            "run": r.run,
            "ended_at": r.ended_at.try_to_rfc3339_string().ok(),
            "status": escape_untrusted(&r.status, 32),
            "error_class": r.error_class.as_deref().map(|c| escape_untrusted(c, 64)),
            "events_handed_off": r.events_handed_off,
        })
    });
    json!({
        "recorded": history.len(),
        "failed": history.iter().filter(|r| r.failed()).count(),
        "last": last,
    })
}

fn unavailable(error: OperationError) -> HandoffError {
    HandoffError::Unavailable(format!("{} could not be read: {}", error.what, error.text))
}
