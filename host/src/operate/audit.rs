//! Audit records: who changed a consumer's state, from what, to what, why, on what evidence.
//!
//! Acting commands build an [`AuditEntry`] and insert [`AuditEntry::document`] in the same
//! transaction as their change, so a change without its record (or the reverse) cannot exist.

use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document, doc};

/// The default audit collection (`--audit-collection`, `AUDIT_COLLECTION`).
pub const DEFAULT_COLLECTION: &str = "kestra_change_audit";

/// One acting command's record.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    /// The consumer whose state changed.
    pub consumer: String,
    /// Its source namespace, `db.coll`.
    pub source: String,
    /// The command as the operator would type it again, without credentials.
    pub command: String,
    /// The state before (e.g. the checkpoint's mode and position).
    pub from: Bson,
    /// The state after.
    pub to: Bson,
    /// The operator's reason, as given.
    pub reason: String,
    /// What the command saw when it decided: figures, not documents.
    pub evidence: Document,
}

impl AuditEntry {
    /// The record to insert: the entry, when, and by whom.
    pub fn document(&self) -> Document {
        doc! {
            "_id": ObjectId::new(),
            "at": DateTime::now(),
            "by": operator(),
            "consumer": &self.consumer,
            "source": &self.source,
            "command": &self.command,
            "from": self.from.clone(),
            "to": self.to.clone(),
            "reason": &self.reason,
            "evidence": self.evidence.clone(),
        }
    }
}

/// Who is acting: `HANDOFF_OPERATOR` when set (a workflow engine names its execution there),
/// else the login name and the host, `user@host`.
pub fn operator() -> String {
    if let Ok(name) = std::env::var("HANDOFF_OPERATOR")
        && !name.trim().is_empty()
    {
        return bounded(name.trim());
    }
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    bounded(&format!("{user}@{host}"))
}

fn bounded(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_carries_every_field() {
        let entry = AuditEntry {
            consumer: "c".into(),
            source: "db.orders".into(),
            command: "checkpoint reset --to now".into(),
            from: Bson::Document(doc! { "mode": "resumeAfter" }),
            to: Bson::Document(doc! { "mode": "startAfter" }),
            reason: "history lost".into(),
            evidence: doc! { "gap_seconds": 12 },
        };
        let record = entry.document();
        for key in [
            "_id", "at", "by", "consumer", "source", "command", "from", "to", "reason", "evidence",
        ] {
            assert!(record.contains_key(key), "{key} missing from {record}");
        }
        assert_eq!(record.get_str("reason").ok(), Some("history lost"));
        assert!(!operator().is_empty());
        assert!(operator().chars().all(|c| !c.is_control()));
    }
}
