//! An in-memory checkpoint store for tests and benchmarks: the same semantics as the embedded
//! store, without a disk.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bson::{DateTime, Document, RawDocumentBuf};

use handoff_domain::store::{
    admit_events, apply_claim, apply_release, compare_and_set, decode_record, lookups, record_ids,
};
use handoff_domain::{Applied, CheckpointStore, Claim, Commit, CommitError, Dump};

/// Records of one kind, keyed by `_id`, remembering their commit order.
#[derive(Default)]
struct Records {
    by_id: BTreeMap<String, Document>,
    order: Vec<String>,
}

impl Records {
    /// What it holds under the IDs of the events of `records` (see [`lookups`]).
    fn holding(&self, records: &[RawDocumentBuf]) -> Result<Vec<Document>, CommitError> {
        let mut found = Vec::new();
        for lookup in lookups(records)? {
            found.extend(self.by_id.get(&lookup.key).cloned());
            found.extend(self.by_id.range(lookup.fragments).map(|(_, d)| d.clone()));
        }
        Ok(found)
    }

    fn of(&self, consumer: &str) -> Vec<Document> {
        self.order
            .iter()
            .filter_map(|id| self.by_id.get(id))
            .filter(|record| record.get_str("consumer").ok() == Some(consumer))
            .cloned()
            .collect()
    }
}

#[derive(Default)]
struct State {
    checkpoints: HashMap<String, Document>,
    outbox: Records,
    quarantine: Records,
}

/// Checkpoints and records held in memory behind one lock (one lock = one transaction).
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, CommitError> {
        self.state
            .lock()
            .map_err(|_| CommitError::Unavailable("memory store poisoned".into()))
    }
}

impl CheckpointStore for MemoryStore {
    fn ensure_checkpoint(
        &self,
        consumer: &str,
        initial: Document,
    ) -> Result<Document, CommitError> {
        let mut state = self.lock()?;
        Ok(state
            .checkpoints
            .entry(consumer.to_string())
            .or_insert(initial)
            .clone())
    }

    fn commit(&self, commit: &Commit<'_>) -> Result<Applied, CommitError> {
        let mut guard = self.lock()?;
        let state = &mut *guard;
        let stored = state
            .checkpoints
            .get(&commit.consumer.consumer)
            .ok_or(CommitError::Conflict)?;
        let updated = compare_and_set(stored, commit)?;
        let outbox_ids = record_ids(&commit.outbox)?;
        let quarantine_ids = record_ids(&commit.quarantine)?;
        let mut applied = Applied::default();
        let mut admitted = [Vec::new(), Vec::new()];
        for ((ids, docs, records), admitted) in [
            (&outbox_ids, &commit.outbox, &state.outbox),
            (&quarantine_ids, &commit.quarantine, &state.quarantine),
        ]
        .into_iter()
        .zip(&mut admitted)
        {
            let held = records.holding(docs)?;
            let insert = admit_events(docs, &held, &mut applied.duplicates)?;
            for ((id, doc), insert) in ids.iter().zip(docs).zip(insert) {
                if insert {
                    admitted.push((id.clone(), decode_record(doc)?));
                }
            }
        }
        state
            .checkpoints
            .insert(commit.consumer.consumer.clone(), updated);
        for (records, admitted) in [&mut state.outbox, &mut state.quarantine]
            .into_iter()
            .zip(admitted)
        {
            for (id, doc) in admitted {
                records.order.push(id.clone());
                records.by_id.insert(id, doc);
            }
        }
        Ok(applied)
    }

    fn claim(&self, consumer: &str, claim: &Claim) -> Result<(), CommitError> {
        let mut state = self.lock()?;
        let stored = state
            .checkpoints
            .get(consumer)
            .ok_or(CommitError::Conflict)?;
        let updated = apply_claim(stored, claim)?;
        state.checkpoints.insert(consumer.to_string(), updated);
        Ok(())
    }

    fn release(&self, consumer: &str, owner: &str, at: DateTime) -> Result<(), CommitError> {
        let mut state = self.lock()?;
        let released = state
            .checkpoints
            .get(consumer)
            .and_then(|stored| apply_release(stored, owner, at));
        if let Some(updated) = released {
            state.checkpoints.insert(consumer.to_string(), updated);
        }
        Ok(())
    }

    fn renew(&self, consumer: &str, owner: &str, until: DateTime) -> Result<(), CommitError> {
        let mut state = self.lock()?;
        let renewed = state
            .checkpoints
            .get(consumer)
            .and_then(|stored| apply_release(stored, owner, until))
            .ok_or(CommitError::Conflict)?;
        state.checkpoints.insert(consumer.to_string(), renewed);
        Ok(())
    }

    fn dump(&self, consumer: &str) -> Result<Dump, CommitError> {
        let state = self.lock()?;
        Ok(Dump {
            checkpoint: state.checkpoints.get(consumer).cloned(),
            outbox: state.outbox.of(consumer),
            quarantine: state.quarantine.of(consumer),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_split_event_is_one_event_however_split() {
        crate::checks::a_split_event_is_one_event_however_split(&super::MemoryStore::new());
    }
}
