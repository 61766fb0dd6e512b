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
    /// The record to insert: the entry, when, and by whom: the operator as named
    /// (`HANDOFF_OPERATOR`) and the process's own user, which the environment cannot name.
    pub fn document(&self) -> Document {
        doc! {
            "_id": ObjectId::new(),
            "at": DateTime::now(),
            "by": operator(),
            "os_user": os_user(),
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

/// The environment variable a workflow engine names the operator in.
pub const OPERATOR_VARIABLE: &str = "HANDOFF_OPERATOR";

/// Who is acting: `HANDOFF_OPERATOR` when set (a workflow engine names its execution there),
/// else the login name and the host, `user@host` (the name of the process's real user, else
/// `$USER`).
pub fn operator() -> String {
    if let Ok(name) = std::env::var(OPERATOR_VARIABLE)
        && !name.trim().is_empty()
    {
        return bounded(name.trim());
    }
    let user = passwd_name(rustix::process::getuid().as_raw())
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    bounded(&format!("{user}@{host}"))
}

/// The process's real user as the operating system knows it: `{uid, name}`, the name from the
/// passwd database when it lists the uid. Unlike `HANDOFF_OPERATOR` or `$USER`, nothing in the
/// environment changes it.
pub fn os_user() -> Document {
    let uid = rustix::process::getuid().as_raw();
    let mut user = doc! { "uid": i64::from(uid) };
    if let Some(name) = passwd_name(uid) {
        user.insert("name", name);
    }
    user
}

/// The name `/etc/passwd` gives `uid`, if it lists it.
fn passwd_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    name_of(&passwd, uid)
}

/// The name of `uid` in passwd-format text (`name:password:uid:…`).
fn name_of(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let listed: u32 = fields.nth(1)?.parse().ok()?;
        (listed == uid && !name.is_empty()).then(|| bounded(name))
    })
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
            "_id", "at", "by", "os_user", "consumer", "source", "command", "from", "to", "reason",
            "evidence",
        ] {
            assert!(record.contains_key(key), "{key} missing from {record}");
        }
        assert_eq!(record.get_str("reason").ok(), Some("history lost"));
        assert!(!operator().is_empty());
        assert!(operator().chars().all(|c| !c.is_control()));
        let user = record.get_document("os_user").expect("os_user");
        assert_eq!(
            user.get_i64("uid").ok(),
            Some(i64::from(rustix::process::getuid().as_raw()))
        );
    }

    #[test]
    fn the_os_user_is_named_from_the_passwd_database() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n# comment\nbroken\nci:x:1001:1001::/home/ci:/bin/sh\n";
        assert_eq!(name_of(passwd, 0).as_deref(), Some("root"));
        assert_eq!(name_of(passwd, 1001).as_deref(), Some("ci"));
        assert_eq!(name_of(passwd, 7), None);
        assert_eq!(name_of("", 0), None);
    }
}
