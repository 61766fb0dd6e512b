//! `deliver dead`: a delivery's dead records listed, replayed (pending again, attempts from
//! zero) or discarded (ignored), each change audited — who, when, why — in the same transaction
//! as the entries it changes, in the audit collection and in each entry's own `audit` list.

use bson::{Bson, DateTime, doc};
use serde_json::{Value, json};

use crate::audit::{AuditEntry, operator};
use handoff_domain::delivery::{Entry, Status, entry_id};
use handoff_domain::error::Result;
use handoff_domain::ledger::{DeadChange, Ledger, Names};
use handoff_domain::text::escape_untrusted;

/// Entries changed per transaction (each with its audit record).
pub const CHANGE_BATCH: usize = 500;
/// The most dead entries one listing reads.
pub const MAX_LIST: usize = 10_000;

/// Which dead entries an action takes.
#[derive(Clone, Debug)]
pub enum Selection {
    /// These records (`<consumer>/<event id>`, or the event IDs alone).
    Ids(Vec<String>),
    /// Every dead entry of the delivery.
    All,
}

/// What an action does to a dead entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Pending again: the next `deliver` tries it, attempts from zero.
    Replay,
    /// Ignored: never delivered.
    Discard,
}

impl Action {
    fn status(self) -> Status {
        match self {
            Action::Replay => Status::Pending,
            Action::Discard => Status::Ignored,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Discard => "discard",
        }
    }
}

/// The delivery's dead entries, in admission order, at most `limit`.
pub fn list(ledger: &dyn Ledger, names: &Names, limit: usize) -> Result<Vec<Entry>> {
    let documents = ledger.entries_of(names, Status::Dead, None, limit.clamp(1, MAX_LIST))?;
    Ok(documents.iter().filter_map(Entry::from_document).collect())
}

/// The dead entries as JSON: one object each, text fields escaped and bounded.
pub fn to_json(entries: &[Entry]) -> Value {
    let items: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "record": escape_untrusted(&e.record, 400),
                "seq": e.seq,
                "attempts": e.attempts,
                "error_class": e.error_class.as_deref().map(|t| escape_untrusted(t, 40)),
                "error": e.error.as_deref().map(|t| escape_untrusted(t, 500)),
                "updated_at": e.updated.map(|t| t.try_to_rfc3339_string().unwrap_or_default()),
            })
        })
        .collect();
    json!({ "count": entries.len(), "dead": items })
}

/// The dead entries as a table.
pub fn table(entries: &[Entry]) -> String {
    let mut text = format!("{} dead\n", entries.len());
    if entries.is_empty() {
        return text;
    }
    text.push_str("SEQ      ATTEMPTS  CLASS       RECORD  ERROR\n");
    for e in entries {
        text.push_str(&format!(
            "{:<8} {:<9} {:<11} {}  {}\n",
            e.seq,
            e.attempts,
            escape_untrusted(e.error_class.as_deref().unwrap_or("-"), 11),
            escape_untrusted(&e.record, 120),
            escape_untrusted(e.error.as_deref().unwrap_or("-"), 160),
        ));
    }
    text
}

/// What an action changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Entries found dead and changed.
    pub changed: u64,
    /// Named records that were not dead (or not in the ledger): left as they are.
    pub not_dead: Vec<String>,
}

/// Replays or discards the selected dead entries, `CHANGE_BATCH` per transaction, each batch
/// with one audit record saying who, when, why and which entries.
pub fn change(
    ledger: &dyn Ledger,
    names: &Names,
    selection: &Selection,
    action: Action,
    reason: &str,
    command: &str,
) -> Result<Changed> {
    let ids: Vec<String> = match selection {
        Selection::Ids(records) => records
            .iter()
            .map(|r| {
                let record = if r.starts_with(&format!("{}/", names.consumer)) {
                    r.clone()
                } else {
                    format!("{}/{r}", names.consumer)
                };
                entry_id(&names.delivery, &record)
            })
            .collect(),
        Selection::All => {
            let mut all = Vec::new();
            let mut after = None;
            loop {
                let page = ledger.entries_of(names, Status::Dead, after, MAX_LIST)?;
                let Some(last) = page.last().and_then(Entry::from_document) else {
                    break;
                };
                after = Some(last.seq);
                all.extend(
                    page.iter()
                        .filter_map(|d| d.get_str("_id").ok().map(str::to_string)),
                );
            }
            all
        }
    };
    let by = operator();
    let mut result = Changed::default();
    let mut changed_ids = std::collections::HashSet::new();
    for batch in ids.chunks(CHANGE_BATCH) {
        let note = doc! {
            "at": DateTime::now(), "by": &by, "action": action.as_str(), "reason": reason,
        };
        let changes: Vec<DeadChange<'_>> = batch
            .iter()
            .map(|entry| DeadChange {
                entry,
                to: action.status(),
                note: note.clone(),
            })
            .collect();
        let audit = AuditEntry {
            consumer: names.consumer.clone(),
            source: format!("{}.{}", names.database, names.outbox),
            command: command.to_string(),
            from: Bson::Document(doc! { "status": Status::Dead.as_str() }),
            to: Bson::Document(doc! { "status": action.status().as_str() }),
            reason: reason.to_string(),
            evidence: doc! {
                "delivery": &names.delivery,
                "entries": batch.iter().take(100).map(|e| Bson::String(e.clone())).collect::<Vec<_>>(),
                "selected": batch.len() as i64,
            },
        }
        .document();
        let changed = ledger.change_dead(names, &changes, &audit)?;
        result.changed += changed.len() as u64;
        changed_ids.extend(changed);
    }
    if let Selection::Ids(records) = selection {
        result.not_dead = records
            .iter()
            .zip(&ids)
            .filter(|(_, id)| !changed_ids.contains(*id))
            .map(|(record, _)| escape_untrusted(record, 200))
            .collect();
    }
    Ok(result)
}
