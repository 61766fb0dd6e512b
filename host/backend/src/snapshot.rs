//! A snapshot run's backend: documents an operator command read, delivered to the policy as
//! `snapshot` events, and the policy's commits kept for the command to write with its own
//! progress. Nothing here reaches a server: the command writes what was kept, through the one
//! transaction runner, once the policy has decided every document.

use std::collections::VecDeque;
use std::sync::Mutex;

use bson::{Bson, DateTime, Document, RawDocumentBuf, Timestamp, doc};
use sha2::{Digest, Sha256};

use handoff_domain::checkpoint::Claim;
use handoff_domain::store::{Applied, Dump};
use handoff_domain::time::{VirtualClock, VirtualTime};
use handoff_domain::{ChangeSource, CheckpointStore, Commit, CommitError, Deployment, Start};
use handoff_domain::{StreamError, token::canonical_text};

/// How far the virtual clock moves when the documents are all delivered (a live stream's await
/// bound): a policy waiting for more sees its wait end at once.
const AWAIT_MS: u64 = 1000;

/// Where a snapshot's documents stand in the stream: a resume token the command read (a
/// watermark's event, or a post-batch token) and its cluster time.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPosition {
    pub token: Document,
    pub cluster_time: Timestamp,
}

/// One document of a snapshot: its key and the document as read (`None`: the source no longer
/// holds it).
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub key: Bson,
    pub document: Option<Document>,
}

impl Read {
    /// A document as read, keyed by its `_id` (`None` without one).
    pub fn of(document: Document) -> Option<Read> {
        let key = document.get("_id")?.clone();
        Some(Read {
            key,
            document: Some(document),
        })
    }
}

/// The `snapshot` event of a document read at `at`: what the policy reads and what a raw outbox
/// record keeps. Its `_id` is the position's token plus the document's namespace and key, unique
/// to the document and the position, and keeps the position's `_data` (the stream's order).
pub fn event(database: &str, collection: &str, read: &Read, at: &SnapshotPosition) -> Document {
    let mut token = at.token.clone();
    token.insert(
        "snapshot",
        doc! { "ns": format!("{database}.{collection}"), "_id": read.key.clone() },
    );
    doc! {
        "_id": token,
        "operationType": "snapshot",
        "clusterTime": at.cluster_time,
        "ns": { "db": database, "coll": collection },
        "documentKey": { "_id": read.key.clone() },
        "fullDocument": read.document.clone().map_or(Bson::Null, Bson::Document),
    }
}

/// The documents of a snapshot run as a change stream that never waits and never reports a
/// watermark.
pub struct SnapshotSource {
    deployment: Deployment,
    events: VecDeque<Document>,
    clock: VirtualClock,
    digest: [u8; 32],
}

impl SnapshotSource {
    pub fn new(deployment: Deployment, events: Vec<Document>) -> SnapshotSource {
        let mut digest = Sha256::new();
        for event in &events {
            digest.update(canonical_text(event).as_bytes());
            digest.update(b"\n");
        }
        SnapshotSource {
            deployment,
            events: events.into(),
            clock: VirtualClock::new(),
            digest: digest.finalize().into(),
        }
    }
}

impl ChangeSource for SnapshotSource {
    fn deployment(&mut self) -> handoff_domain::error::Result<Deployment> {
        Ok(self.deployment.clone())
    }

    fn open(&mut self, _start: Start<Document>) -> Result<(), StreamError> {
        Ok(())
    }

    fn next(&mut self) -> Result<Option<Document>, StreamError> {
        let event = self.events.pop_front();
        if event.is_none() {
            self.clock.advance_ms(AWAIT_MS);
        }
        Ok(event)
    }

    fn watermark(&self) -> Option<Document> {
        None
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// A snapshot run sees virtual clocks and a seed of its documents: deciding the same
    /// documents twice gives the same decisions.
    fn virtual_time(&self) -> Option<VirtualTime> {
        Some(VirtualTime {
            clock: self.clock.clone(),
            wall_epoch: std::time::Duration::from_millis(
                DateTime::now().timestamp_millis().max(0) as u64
            ),
            recording_digest: self.digest,
        })
    }
}

/// The records a snapshot run's commits hold, in commit order.
#[derive(Debug, Default)]
pub struct Kept {
    pub outbox: Vec<RawDocumentBuf>,
    pub quarantine: Vec<RawDocumentBuf>,
}

/// A store that keeps a snapshot run's commits instead of writing them: the checkpoint moves only
/// in the run's own session, never in the consumer's state.
#[derive(Default)]
pub struct KeepingStore {
    kept: Mutex<Kept>,
}

impl KeepingStore {
    /// What the run's commits held.
    pub fn take(&self) -> Kept {
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl CheckpointStore for KeepingStore {
    fn ensure_checkpoint(
        &self,
        _consumer: &str,
        initial: Document,
    ) -> Result<Document, CommitError> {
        Ok(initial)
    }

    fn commit(&self, commit: &Commit<'_>) -> Result<Applied, CommitError> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.outbox.extend(commit.outbox.iter().cloned());
        kept.quarantine.extend(commit.quarantine.iter().cloned());
        Ok(Applied::default())
    }

    fn claim(&self, _consumer: &str, _claim: &Claim) -> Result<(), CommitError> {
        Ok(())
    }

    fn release(&self, _consumer: &str, _owner: &str, _at: DateTime) -> Result<(), CommitError> {
        Ok(())
    }

    fn dump(&self, _consumer: &str) -> Result<Dump, CommitError> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let decode = |records: &[RawDocumentBuf]| {
            records
                .iter()
                .filter_map(|r| Document::try_from(r.as_ref()).ok())
                .collect()
        };
        Ok(Dump {
            checkpoint: None,
            outbox: decode(&kept.outbox),
            quarantine: decode(&kept.quarantine),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position() -> SnapshotPosition {
        SnapshotPosition {
            token: doc! { "_data": "826553F1000000000301" },
            cluster_time: Timestamp {
                time: 1_700_000_000,
                increment: 3,
            },
        }
    }

    fn read(key: i32, document: Option<Document>) -> Read {
        Read {
            key: Bson::Int32(key),
            document,
        }
    }

    #[test]
    fn a_snapshot_event_has_the_shape_of_a_change_and_a_token_of_its_own() {
        let event = event(
            "db",
            "orders",
            &read(1, Some(doc! { "_id": 1, "qty": 2 })),
            &position(),
        );
        assert_eq!(event.get_str("operationType").unwrap(), "snapshot");
        assert_eq!(
            event.get_document("_id").unwrap(),
            &doc! { "_data": "826553F1000000000301", "snapshot": { "ns": "db.orders", "_id": 1 } }
        );
        assert_eq!(
            event.get_timestamp("clusterTime").unwrap(),
            position().cluster_time
        );
        assert_eq!(
            event.get_document("ns").unwrap(),
            &doc! { "db": "db", "coll": "orders" }
        );
        assert_eq!(
            event.get_document("documentKey").unwrap(),
            &doc! { "_id": 1 }
        );
        assert_eq!(
            event.get_document("fullDocument").unwrap(),
            &doc! { "_id": 1, "qty": 2 }
        );
        let gone = super::event("db", "orders", &read(1, None), &position());
        assert_eq!(gone.get("fullDocument"), Some(&Bson::Null));
    }

    #[test]
    fn tokens_differ_by_key_namespace_and_position() {
        let token = |db: &str, key: i32, at: &SnapshotPosition| {
            canonical_text(
                event(db, "orders", &read(key, None), at)
                    .get_document("_id")
                    .unwrap(),
            )
        };
        let at = position();
        let a = token("db", 7, &at);
        assert_eq!(a, token("db", 7, &at));
        assert_ne!(a, token("db", 8, &at));
        assert_ne!(a, token("other", 7, &at));
        let later = SnapshotPosition {
            token: doc! { "_data": "826553F1000000000401" },
            ..position()
        };
        assert_ne!(a, token("db", 7, &later));
    }

    #[test]
    fn the_source_delivers_once_then_waits_virtually_and_the_store_keeps_commits() {
        let deployment = Deployment::replica_set("rs", "000000000000000000000000");
        let events = vec![event("db", "o", &read(1, None), &position())];
        let mut source = SnapshotSource::new(deployment, events.clone());
        source.open(Start::Now).unwrap();
        assert_eq!(source.next().unwrap(), Some(events[0].clone()));
        let before = source.now_ms();
        assert_eq!(source.next().unwrap(), None);
        assert_eq!(source.now_ms(), before + AWAIT_MS);
        assert_eq!(source.watermark(), None);

        let store = KeepingStore::default();
        let consumer = handoff_domain::Consumer {
            consumer: "c".into(),
            source: "db.o".into(),
        };
        let record = RawDocumentBuf::try_from(&doc! { "_id": "c/1" }).unwrap();
        let token = doc! { "_data": "00" };
        store
            .commit(&Commit {
                consumer: &consumer,
                expected: None,
                next: &token,
                mode: handoff_domain::Mode::ResumeAfter,
                outbox: vec![record.clone()],
                quarantine: vec![],
                lease: None,
                policy: None,
            })
            .unwrap();
        let kept = store.take();
        assert_eq!(kept.outbox, vec![record]);
        assert!(store.take().outbox.is_empty());
    }
}
