//! An in-memory checkpoint store for tests and benchmarks: the same semantics as the embedded
//! store, without a disk.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bson::Document;

use super::{CheckpointStore, Commit, CommitError, compare_and_set, outbox_id};

#[derive(Default)]
struct State {
    checkpoints: HashMap<String, Document>,
    outbox: HashMap<String, Document>,
    order: BTreeMap<u64, String>,
}

/// Checkpoints and outbox records held in memory behind one lock (one lock = one transaction).
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

    fn commit(&self, commit: &Commit<'_>) -> Result<(), CommitError> {
        let mut state = self.lock()?;
        let stored = state
            .checkpoints
            .get(&commit.consumer.consumer)
            .ok_or(CommitError::Conflict)?;
        let updated = compare_and_set(stored, commit)?;
        let id = outbox_id(commit)?;
        if let Some(id) = &id
            && state.outbox.contains_key(id)
        {
            return Err(CommitError::Duplicate(id.clone()));
        }
        state
            .checkpoints
            .insert(commit.consumer.consumer.clone(), updated);
        if let (Some(id), Some(record)) = (id, &commit.outbox) {
            let next = state.order.len() as u64;
            state.order.insert(next, id.clone());
            state.outbox.insert(id, record.clone());
        }
        Ok(())
    }

    fn dump(&self, consumer: &str) -> Result<(Option<Document>, Vec<Document>), CommitError> {
        let state = self.lock()?;
        let records = state
            .order
            .values()
            .filter_map(|id| state.outbox.get(id))
            .filter(|record| record.get_str("consumer").ok() == Some(consumer))
            .cloned()
            .collect();
        Ok((state.checkpoints.get(consumer).cloned(), records))
    }
}
