//! `lease release`: gives back the lease a run that died left on its consumer, so that the next
//! run (or a reset) need not wait for it to expire.
//!
//! The lease only makes a second run visible early; the checkpoint's compare-and-set on the token
//! is what keeps events from being handed off twice. Releasing the lease of a run that is in fact
//! alive therefore costs that run its next commit (a conflict, exit 3), never an event. The
//! release is a compare-and-set from the lease it read, with its audit record in the same
//! transaction.

use bson::{Bson, DateTime, doc};
use serde_json::{Value, json};

use super::audit::AuditEntry;
use super::reset::Target;
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;
use handoff_mongo::operator::{self, CheckpointMove};
use handoff_mongo::{Connection, OperationError};

/// What a release found and did.
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    pub consumer: String,
    /// The lease it gave back: its owner and end (none: no running lease was held, nothing
    /// written; a lease given back or run out holds nothing).
    pub lease: Option<(String, DateTime)>,
}

impl Released {
    pub fn to_json(&self) -> Value {
        json!({
            "consumer": self.consumer,
            "released": self.lease.as_ref().map(|(owner, until)| json!({
                "owner": owner,
                "until": until.try_to_rfc3339_string().ok(),
            })),
        })
    }

    pub fn human(&self) -> String {
        match &self.lease {
            None => format!(
                "consumer {}: no run holds a lease on it; nothing written\n",
                self.consumer
            ),
            Some((owner, until)) => format!(
                "consumer {}: released the lease of {} (until {}); audit record written\n",
                self.consumer,
                escape_untrusted(owner, 128),
                until.try_to_rfc3339_string().unwrap_or_default(),
            ),
        }
    }
}

fn failed(error: OperationError) -> HandoffError {
    match error.command_code {
        Some(13 | 18) => HandoffError::unauthorized(&error.text),
        _ => HandoffError::Unavailable(format!("{}: {}", error.what, error.text)),
    }
}

/// Releases the lease on `target`'s consumer. With `owner`, only a lease that owner holds (as
/// `handoff status` showed it) is released.
pub fn release(
    connection: &Connection,
    target: &Target<'_>,
    owner: Option<&str>,
    reason: &str,
) -> Result<Released> {
    let source = target.scope.source(target.database, target.collection);
    let consumer = target.consumer.to_string();
    let current = connection
        .block_on(operator::consumer_document(
            connection,
            target.database,
            target.checkpoints,
            target.consumer,
            "the checkpoint could not be read",
        ))
        .map_err(failed)?;
    let Some(current) = current else {
        return Err(connection.block_on(super::status::unknown_consumer(
            connection,
            target.database,
            target.checkpoints,
            target.consumer,
        )));
    };
    if current.get_str("source").ok() != Some(source.as_str()) {
        return Err(HandoffError::Mismatch(format!(
            "the checkpoint of {consumer} belongs to another source ({}), not {source}; name it \
             with its own --scope, --database and --collection",
            escape_untrusted(current.get_str("source").unwrap_or("none"), 256)
        )));
    }
    let (held_by, until) = match (current.get_str("owner"), current.get_datetime("leaseUntil")) {
        (Ok(held_by), Ok(until)) if *until > DateTime::now() => (held_by.to_string(), *until),
        _ => {
            return Ok(Released {
                consumer,
                lease: None,
            });
        }
    };
    if let Some(owner) = owner
        && owner != held_by
    {
        return Err(HandoffError::Conflict(format!(
            "the lease on {consumer} is held by {}, not {}: nothing written; look again with \
             `handoff status`",
            escape_untrusted(&held_by, 128),
            escape_untrusted(owner, 128)
        )));
    }
    let entry = AuditEntry {
        consumer: consumer.clone(),
        source,
        command: format!("lease release --consumer-id {consumer}"),
        from: Bson::Document(doc! { "owner": &held_by, "leaseUntil": until }),
        to: Bson::Null,
        reason: reason.to_string(),
        evidence: doc! { "released_at": DateTime::now() },
    };
    let mut filter = doc! { "_id": target.consumer, "owner": &held_by, "leaseUntil": until };
    super::reset::same_revision(&mut filter, &current);
    let record = entry.document();
    let change = CheckpointMove {
        database: target.database,
        checkpoints: target.checkpoints,
        audit: target.audit,
        filter,
        update: doc! {
            "$unset": { "owner": "", "leaseUntil": "" },
            "$inc": { "revision": 1_i64 },
        },
        record: &record,
    };
    super::reset::apply_move(connection, &change, "release")?;
    tracing::warn!(consumer = %consumer, "lease released");
    Ok(Released {
        consumer,
        lease: Some((held_by, until)),
    })
}
