//! `checkpoint reset`: moves a consumer's checkpoint on an operator's decision, as a
//! compare-and-set from the checkpoint it read, with its audit record in the same transaction.
//!
//! The new position is a token the deployment itself gives: the stream's current position
//! (`now`), the position just before a cluster time (`startAtOperationTime`), or a token the
//! operator holds (checked as a resume token). A reset never happens under a run that holds the
//! consumer's lease, and never to a time the oplog no longer holds.

use bson::{Bson, Document, Timestamp, doc};
use serde_json::{Value, json};

use super::audit::AuditEntry;
use handoff_domain::checkpoint::{self, Mode};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::position::{Position, iso, time_json};
use handoff_domain::text::escape_untrusted;
use handoff_mongo::operator::{self, CheckpointMove};
use handoff_mongo::transaction::Failure;
use handoff_mongo::{Connection, OperationError, window};

/// Where the checkpoint goes.
#[derive(Debug, Clone, PartialEq)]
pub enum To {
    /// The stream's current position: everything before now is skipped.
    Now,
    /// Just before this cluster time: events from it on are handed off.
    Time(Timestamp),
    /// A token the operator holds, with the mode to resume with.
    Token(Document, Mode),
}

impl To {
    fn describe(&self) -> String {
        match self {
            To::Now => "--to now".into(),
            To::Time(t) => format!("--to-time {}.{}", t.time, t.increment),
            To::Token(_, mode) => format!("--to-token <token> --mode {}", mode.as_str()),
        }
    }
}

/// The consumer whose checkpoint moves.
pub struct Target<'a> {
    /// What the consumer watches (its checkpoint's `source` follows from it).
    pub scope: handoff_domain::config::Scope,
    pub database: &'a str,
    pub collection: &'a str,
    pub consumer: &'a str,
    pub checkpoints: &'a str,
    pub audit: &'a str,
}

/// What a reset would do, read before doing it (all a dry run shows).
#[derive(Debug, Clone)]
pub struct Plan {
    pub consumer: String,
    pub source: String,
    /// The checkpoint as read (none: the consumer never ran; the reset creates it).
    pub current: Option<Document>,
    pub to_token: Document,
    pub to_mode: Mode,
    /// The current position's figures against the deployment.
    pub before: Position,
    /// The new position's cluster time.
    pub to_time: Option<Timestamp>,
    pub to: To,
}

impl Plan {
    /// Seconds of history the reset skips (positive) or hands off again (negative), when both
    /// times are known.
    pub fn gap_seconds(&self) -> Option<i64> {
        Some(i64::from(self.to_time?.time) - i64::from(self.before.checkpoint?.time))
    }

    /// Why applying the plan now would be refused: a run holds the consumer's lease.
    pub fn refusal(&self) -> Option<String> {
        held_by_run(self.current.as_ref()?, "resetting")
    }

    fn previous_json(&self) -> Value {
        match &self.current {
            None => json!(null),
            Some(c) => json!({
                "mode": escape_untrusted(c.get_str("mode").unwrap_or("resumeAfter"), 32),
                "has_token": matches!(c.get("token"), Some(Bson::Document(_))),
                "cluster_time": self.before.checkpoint.map(time_json),
                "revision": revision(c),
            }),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "consumer": self.consumer,
            "source": self.source,
            "from": self.previous_json(),
            "to": {
                "mode": self.to_mode.as_str(),
                "cluster_time": self.to_time.map(time_json),
            },
            "gap_seconds": self.gap_seconds(),
            "before": self.before.to_json(),
            "refused": self.refusal(),
        })
    }

    /// The human view.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let time = |t: Option<Timestamp>| {
            t.map_or("unknown".into(), |t| {
                format!("{} ({}.{})", iso(t), t.time, t.increment)
            })
        };
        let from = match &self.current {
            None => "no checkpoint".to_string(),
            Some(c) => format!(
                "{} at {}",
                escape_untrusted(c.get_str("mode").unwrap_or("resumeAfter"), 32),
                time(self.before.checkpoint)
            ),
        };
        let gap = match self.gap_seconds() {
            Some(g) if g > 0 => format!(
                "{g} s of history skipped: changes in it are never handed off; reconcile --repair after the reset"
            ),
            Some(g) if g < 0 => format!(
                "{} s of history handed off again (records already stored are not written twice)",
                -g
            ),
            Some(_) => "none".into(),
            None => "unknown".into(),
        };
        vec![
            ("consumer", format!("{} on {}", self.consumer, self.source)),
            ("from", from),
            (
                "to",
                format!("{} at {}", self.to_mode.as_str(), time(self.to_time)),
            ),
            ("gap", gap),
            (
                "refused",
                self.refusal()
                    .unwrap_or_else(|| "no: nothing holds the consumer".into()),
            ),
        ]
    }
}

/// Why a checkpoint cannot be moved now (`doing` names the move): a run holds its lease.
pub(crate) fn held_by_run(current: &Document, doing: &str) -> Option<String> {
    let until = current.get_datetime("leaseUntil").ok()?;
    (*until > bson::DateTime::now()).then(|| {
        format!(
            "a run ({}) holds this consumer until {}: let it end or stop it before {doing}; \
             if it died, `handoff lease release` gives its lease back",
            escape_untrusted(current.get_str("owner").unwrap_or("unknown"), 128),
            until.try_to_rfc3339_string().unwrap_or_default()
        )
    })
}

/// The refusal of a move whose checkpoint changed since it was read.
fn changed_since_read() -> HandoffError {
    HandoffError::Conflict(
        "the checkpoint changed since it was read (a run committed or renewed its lease, or \
         another command acted): nothing was written; look again with status and retry"
            .into(),
    )
}

/// Matches only the checkpoint at the revision it was read at.
pub(crate) fn same_revision(filter: &mut Document, current: &Document) {
    match revision(current) {
        Some(r) => filter.insert("revision", r),
        None => filter.insert("revision", doc! { "$exists": false }),
    };
}

/// Applies an audited move of a checkpoint (`what` names it in a failure): the checkpoint
/// updated and its audit record inserted in one transaction, or nothing.
pub(crate) fn apply_move(
    connection: &Connection,
    change: &CheckpointMove<'_>,
    what: &str,
) -> Result<()> {
    match connection.block_on(operator::move_checkpoint(connection, change)) {
        Ok(()) => Ok(()),
        // The checkpoint moved since it was read, or (its audit record already stored) a commit
        // of this move went through unseen: done or overtaken.
        Err(Failure::Refused(())) => Err(changed_since_read()),
        Err(Failure::Failed(error)) => Err(unavailable(error)),
        Err(Failure::Unknown(error)) => Err(HandoffError::Unavailable(format!(
            "the {what}'s commit did not complete ({}): it may or may not have been applied; \
             look at `handoff status` and the audit collection before retrying",
            error.text
        ))),
    }
}

fn revision(stored: &Document) -> Option<i64> {
    match stored.get("revision") {
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        _ => None,
    }
}

/// A failed read or write in the command's failure classes.
fn unavailable(error: OperationError) -> HandoffError {
    match error.command_code {
        Some(286) => HandoffError::HistoryLost(
            "that cluster time is no longer in the oplog: the position cannot be reached; \
             reset to a later time or to now"
                .into(),
        ),
        Some(13 | 18) => HandoffError::unauthorized(&error.text),
        _ => HandoffError::Unavailable(format!("{}: {}", error.what, error.text)),
    }
}

/// The position a change stream of the source reports before its first event: now, or just
/// before `at`.
async fn stream_position(
    connection: &Connection,
    target: &Target<'_>,
    at: Option<Timestamp>,
) -> Result<Document> {
    operator::opening_token(
        connection,
        target.database,
        target.collection,
        at,
        "the stream's position could not be read",
    )
    .await
    .map_err(unavailable)?
    .filter(checkpoint::is_resume_token)
    .ok_or_else(|| {
        HandoffError::Unavailable(
            "the deployment gave no resume token for that position (MongoDB 4.0.7 or later is required)"
                .into(),
        )
    })
}

/// Whether a position after the deployment's present is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahead {
    /// Refused: such a position skips every event until then without a trace.
    Refuse,
    /// Accepted on the operator's word (`--allow-future`).
    Allow,
}

/// Reads the checkpoint and the new position: what the reset would do.
pub fn plan(connection: &Connection, target: &Target<'_>, to: To, ahead: Ahead) -> Result<Plan> {
    let source = target.scope.source(target.database, target.collection);
    connection.block_on(async {
        let current = operator::consumer_document(
            connection,
            target.database,
            target.checkpoints,
            target.consumer,
            "the checkpoint could not be read",
        )
        .await
        .map_err(unavailable)?;
        let Some(stored) = &current else {
            return Err(HandoffError::BadInput(format!(
                "consumer {} has no checkpoint in {}.{}: check --consumer-id and the collection \
                 names (a first `handoff run` creates the checkpoint)",
                escape_untrusted(target.consumer, 64),
                target.database,
                target.checkpoints
            )));
        };
        {
            if stored.get_str("source").ok() != Some(source.as_str()) {
                return Err(HandoffError::Mismatch(format!(
                    "the checkpoint of {} belongs to another source ({}), not {source}; reset it \
                     with its own --scope, --database and --collection",
                    target.consumer,
                    escape_untrusted(stored.get_str("source").unwrap_or("none"), 256)
                )));
            }
            checkpoint::check_pin(
                stored,
                connection.deployment().pin(),
                "a token of this one cannot continue it; use a new consumer id",
            )?;
        }
        let (to_token, to_mode) = match &to {
            To::Now => (stream_position(connection, target, None).await?, Mode::ResumeAfter),
            To::Time(t) => (stream_position(connection, target, Some(*t)).await?, Mode::ResumeAfter),
            To::Token(token, mode) => {
                if !checkpoint::is_resume_token(token) {
                    return Err(HandoffError::BadInput(
                        "--to-token must be a resume token: {\"_data\": \"<hex>\"} (and optionally _typeBits)".into(),
                    ));
                }
                (token.clone(), *mode)
            }
        };
        let token = current.as_ref().and_then(|c| c.get_document("token").ok());
        let before = window::position(connection, token).await;
        let to_time = handoff_domain::token::cluster_time(&to_token);
        // The server may accept a start it cannot serve until the stream is read: the window
        // is checked here for a time as for a token.
        if let (Some(window), Some(t)) = (before.window, to_time)
            && (t.time, t.increment) < (window.oldest.time, window.oldest.increment)
        {
            return Err(HandoffError::HistoryLost(format!(
                "{} stands before the oldest entry of the oplog ({}): the stream cannot resume \
                 there; choose a later time, or --to now",
                match &to {
                    To::Token(..) => "--to-token",
                    _ => "--to-time",
                },
                iso(window.oldest)
            )));
        }
        // A position after the present would pass over every event written until then, and
        // a run would find nothing wrong: refused unless the operator says it is meant.
        let target_position = Position {
            checkpoint: to_time,
            ..before.clone()
        };
        if let Some(seconds) = target_position.ahead_seconds()
            && ahead == Ahead::Refuse
        {
            return Err(HandoffError::BadInput(format!(
                "{} stands {seconds} s after the deployment's present ({}): every event written \
                 until then would be skipped without a trace; check the time (it is UTC), or \
                 pass --allow-future if that is what is meant",
                match &to {
                    To::Token(..) => "--to-token",
                    _ => "--to-time",
                },
                before
                    .cluster_now
                    .map_or_else(|| "by this machine's clock".to_string(), iso)
            )));
        }
        Ok(Plan {
            consumer: target.consumer.to_string(),
            source,
            current,
            to_token,
            to_mode,
            before,
            to_time,
            to,
        })
    })
}

/// Applies `plan`: the checkpoint moves only if it is still the one the plan read and no run
/// holds it; the audit record is written in the same transaction.
pub fn apply(
    connection: &Connection,
    target: &Target<'_>,
    plan: &Plan,
    reason: &str,
) -> Result<()> {
    let command = format!(
        "checkpoint reset --consumer-id {} {}",
        plan.consumer,
        plan.to.describe()
    );
    apply_as(connection, target, plan, reason, &As::command(command))
}

/// What a move made for another command records besides the reset's own fields.
pub(crate) struct As {
    /// The command, as its audit record names it.
    pub command: String,
    /// More fields the same update sets on the checkpoint.
    pub set: Document,
    /// More figures for the audit record's evidence.
    pub evidence: Document,
}

impl As {
    fn command(command: String) -> As {
        As {
            command,
            set: Document::new(),
            evidence: Document::new(),
        }
    }
}

/// [`apply`], the move recorded as `how` says: one compare-and-set for every command that
/// moves a checkpoint to a new position.
pub(crate) fn apply_as(
    connection: &Connection,
    target: &Target<'_>,
    plan: &Plan,
    reason: &str,
    how: &As,
) -> Result<()> {
    if reason.trim().is_empty() {
        return Err(HandoffError::BadInput(
            "--reason must say why the checkpoint moves".into(),
        ));
    }
    if let Some(refusal) = plan.refusal() {
        return Err(HandoffError::Conflict(refusal));
    }
    let entry = AuditEntry {
        consumer: plan.consumer.clone(),
        source: plan.source.clone(),
        command: how.command.clone(),
        from: Bson::try_from(plan.previous_json()).unwrap_or(Bson::Null),
        to: Bson::try_from(json!({
            "mode": plan.to_mode.as_str(),
            "cluster_time": plan.to_time.map(time_json),
        }))
        .unwrap_or(Bson::Null),
        reason: reason.trim().to_string(),
        evidence: match Bson::try_from(json!({
            "gap_seconds": plan.gap_seconds(),
            "before": plan.before.to_json(),
        })) {
            Ok(Bson::Document(mut d)) => {
                d.extend(how.evidence.clone());
                d
            }
            _ => how.evidence.clone(),
        },
    };
    // A plan always holds the checkpoint it read (a missing one is refused).
    let Some(current) = &plan.current else {
        return Err(changed_since_read());
    };
    let mut filter = doc! { "_id": target.consumer };
    filter.insert("token", current.get("token").cloned().unwrap_or(Bson::Null));
    match current.get("mode") {
        Some(mode) => filter.insert("mode", mode.clone()),
        None => filter.insert("mode", doc! { "$exists": false }),
    };
    same_revision(&mut filter, current);
    let record = entry.document();
    let mut set = doc! { "token": plan.to_token.clone(), "mode": plan.to_mode.as_str() };
    set.extend(how.set.clone());
    let change = CheckpointMove {
        database: target.database,
        checkpoints: target.checkpoints,
        audit: target.audit,
        filter,
        // Counted: the runs before the move are not the consumer's pace (the forecast).
        update: doc! { "$set": set, "$inc": { "revision": 1_i64, handoff_domain::history::MOVES_FIELD: 1_i64 } },
        record: &record,
    };
    apply_move(connection, &change, "reset")?;
    tracing::warn!(
        consumer = %plan.consumer,
        to_mode = plan.to_mode.as_str(),
        gap_seconds = plan.gap_seconds(),
        "checkpoint reset"
    );
    Ok(())
}
