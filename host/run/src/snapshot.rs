//! A snapshot run: documents an operator command read (`backfill`, `reconcile`), decided by the
//! consumer's policy through its `run`, over a session with every rule of a run's events (IDs,
//! shaped records, sizes, quarantine). The session's commits are kept, not written: the command
//! writes them with its own progress, through the one transaction runner.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bson::raw::cstr;
use bson::{DateTime, Document, RawDocument, RawDocumentBuf, doc};

use handoff_backend::snapshot::{self, KeepingStore, Read, SnapshotPosition, SnapshotSource};
use handoff_domain::checkpoint::{Checkpoint, Mode, PolicyBinding};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::token::canonical_text;
use handoff_domain::{Consumer, Deployment};
use handoff_runtime::policy::Version;
use handoff_runtime::{Limits, Policy, Runtime, Settings};
use handoff_session::{OutboxOptions, RunKind, Session};

/// The first contract whose policies know snapshot runs.
pub const SNAPSHOT_CONTRACT: Version = Version {
    major: 1,
    minor: 3,
    patch: 0,
};
/// The documents one snapshot run decides at most (a run's `max-events` bound).
pub const DOCUMENTS_PER_RUN: usize = 500;
/// The virtual time a snapshot run's policy may wait for an event that never comes.
const MAX_WAIT_MS: u64 = 1000;

/// What the policy made of one document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    HandedOff,
    Skipped,
    Quarantined,
}

/// The policy's decisions over a snapshot's documents: each document's fate, in order, and the
/// records to write, each marked with the command that read it (`snapshot: {command, at}`).
#[derive(Debug, Default)]
pub struct Decided {
    pub fates: Vec<Fate>,
    pub outbox: Vec<RawDocumentBuf>,
    /// Of each outbox record, in order: the index (in the reads given) of the document it was
    /// decided from.
    pub origins: Vec<usize>,
    pub quarantine: Vec<RawDocumentBuf>,
}

impl Decided {
    pub fn count(&self, fate: Fate) -> u64 {
        self.fates.iter().filter(|f| **f == fate).count() as u64
    }
}

/// What a command gives the snapshot runs of one consumer.
pub struct Snapshots<'a> {
    pub runtime: &'a Runtime,
    pub policy: &'a Policy,
    pub params: Vec<(String, String)>,
    pub limits: Limits,
    pub outbox: OutboxOptions,
    pub consumer: Consumer,
    pub deployment: Deployment,
    pub kind: RunKind,
    pub database: String,
    pub collection: String,
}

impl Snapshots<'_> {
    /// Refuses a policy built before snapshot runs: it cannot tell a snapshot from a change, so
    /// nothing it would decide about one is known.
    pub fn check_contract(policy: &Policy, command: &str) -> Result<()> {
        if policy.contract < SNAPSHOT_CONTRACT {
            return Err(HandoffError::BadInput(format!(
                "`{command}` hands documents to the consumer's policy as snapshot events, which \
                 policies built against contract {SNAPSHOT_CONTRACT} or later decide; the policy \
                 {} was built against {}. Rebuild it with this handoff's SDK (`handoff policy \
                 build`). Nothing was read or written",
                policy.origin, policy.contract
            )));
        }
        Ok(())
    }

    /// The policy and parameters these runs decide with, as a run records them.
    pub fn binding(&self) -> PolicyBinding {
        PolicyBinding::new(&self.policy.sha256, &self.params)
    }

    /// The policy's decisions over `reads`, read at `at`, in runs of at most
    /// [`DOCUMENTS_PER_RUN`]. Nothing is written.
    pub fn decide(&self, reads: &[Read], at: &SnapshotPosition) -> Result<Decided> {
        let command = match self.kind {
            RunKind::Backfill => "backfill",
            RunKind::Repair | RunKind::Changes => "reconcile",
        };
        let marker = RawDocumentBuf::try_from(&doc! { "command": command, "at": DateTime::now() })
            .map_err(|e| HandoffError::Internal(e.into()))?;
        let mut decided = Decided::default();
        for reads in reads.chunks(DOCUMENTS_PER_RUN) {
            let events: Vec<Document> = reads
                .iter()
                .map(|read| snapshot::event(&self.database, &self.collection, read, at))
                .collect();
            let tokens: HashMap<String, usize> = events
                .iter()
                .enumerate()
                .filter_map(|(i, e)| Some((canonical_text(e.get_document("_id").ok()?), i)))
                .collect();
            let kept = self.run(events)?;
            let mut fates = vec![Fate::Skipped; reads.len()];
            let offset = decided.fates.len();
            let mut mark = |records: Vec<RawDocumentBuf>, fate: Fate| -> Result<_> {
                let mut marked = Vec::with_capacity(records.len());
                let mut origins = Vec::with_capacity(records.len());
                for mut record in records {
                    let index =
                        token_of(&record)
                            .and_then(|t| tokens.get(&t))
                            .ok_or_else(|| {
                                HandoffError::Internal(anyhow::anyhow!(
                                    "a snapshot run kept a record of no document it was given"
                                ))
                            })?;
                    fates[*index] = fate;
                    origins.push(offset + *index);
                    record.append(cstr!("snapshot"), marker.clone());
                    marked.push(record);
                }
                Ok((marked, origins))
            };
            let (outbox, origins) = mark(kept.outbox, Fate::HandedOff)?;
            let (quarantine, _) = mark(kept.quarantine, Fate::Quarantined)?;
            decided.fates.extend(fates);
            decided.origins.extend(origins);
            decided.outbox.extend(outbox);
            decided.quarantine.extend(quarantine);
        }
        Ok(decided)
    }

    /// One snapshot run over `events` (at most [`DOCUMENTS_PER_RUN`]): what its commits kept.
    fn run(&self, events: Vec<Document>) -> Result<snapshot::Kept> {
        let count = events.len();
        let store = Arc::new(KeepingStore::default());
        let source = SnapshotSource::new(self.deployment.clone(), events);
        let session = Session::new(
            self.consumer.clone(),
            self.deployment.clone(),
            Checkpoint::at(None, Mode::ResumeAfter),
            Box::new(source),
            store.clone(),
            Instant::now() + self.limits.run_timeout,
        )
        .with_kind(self.kind)
        .with_outbox_options(self.outbox)
        .with_max_events(count as u32);
        let settings = Settings {
            max_events: count as u32,
            max_wait_ms: MAX_WAIT_MS,
            params: self.params.clone(),
        };
        // On a thread of its own: the command's async runtime must not be the context of the
        // policy's WASI calls, which block on a runtime of their own.
        let summary = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("snapshot-run".into())
                .spawn_scoped(scope, || {
                    self.runtime
                        .run(self.policy, session, &settings, &self.limits)
                })
                .map_err(|e| HandoffError::Internal(e.into()))?
                .join()
                .map_err(|_| HandoffError::Internal(anyhow::anyhow!("a snapshot run panicked")))?
                .map_err(|failed| failed.error)
        })?;
        let decided = summary.committed.events as usize;
        if decided != count {
            return Err(HandoffError::Policy(format!(
                "the policy {} decided {decided} of the {count} documents of a snapshot run; \
                 nothing of them was written",
                self.policy.origin
            )));
        }
        Ok(store.take())
    }
}

/// The token of the event a record was built from: a shaped record's `token`, a quarantine
/// record's `token`, a raw record's `event._id`.
fn token_of(record: &RawDocument) -> Option<String> {
    let token = match record.get_document("token") {
        Ok(token) => token,
        Err(_) => record
            .get_document("event")
            .ok()?
            .get_document("_id")
            .ok()?,
    };
    Some(canonical_text(&Document::try_from(token).ok()?))
}
