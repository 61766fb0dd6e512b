//! Backends: where change events come from and where the checkpoint and outbox live.
//!
//! Each backend implements one of the two traits of [`handoff_domain`], so that any source pairs
//! with any store: a [`ChangeSource`](handoff_domain::ChangeSource) (the deployment's identity and
//! its change stream) and a [`CheckpointStore`](handoff_domain::CheckpointStore) (the checkpoint
//! compare-and-set and the record inserts, atomically).
//!
//! - `replay`: a recorded change stream (the fixture format) served with a real server's resume
//!   semantics;
//! - `redb_store`: checkpoint and outbox in an embedded ACID store on disk; `redb_ledger`:
//!   delivery ledgers beside them;
//! - `mongo`: a MongoDB replica set through the official driver (source and store);
//! - `memory`: an in-memory store for tests and benchmarks;
//! - `snapshot`: documents an operator command read, as a stream, and a store that keeps the
//!   policy's commits for the command to write.

pub mod memory;
pub mod redb_ledger;
pub mod redb_store;
pub mod replay;
pub mod snapshot;

/// Checks both embedded stores share.
#[cfg(test)]
pub(crate) mod checks {
    use bson::{Document, RawDocumentBuf, doc};

    use handoff_domain::checkpoint::{self, Mode};
    use handoff_domain::store::SPLIT_EVENTS_WRITTEN;
    use handoff_domain::{CheckpointStore, Collections, Commit, CommitError, Consumer};

    use crate::redb_store::RedbStore;

    /// An embedded store in `dir` (checkpoints `cp`, outbox `ob`, quarantine `qb`).
    pub(crate) fn temp_store(dir: &tempfile::TempDir) -> RedbStore {
        let collections = Collections {
            checkpoints: "cp".into(),
            outbox: "ob".into(),
            quarantine: "qb".into(),
        };
        RedbStore::open(
            &dir.path().join("s.redb"),
            &collections,
            std::time::Duration::from_secs(1),
        )
        .unwrap()
    }

    /// The records of event `op` handed off under `c/X`: whole, or in `n` fragments (tokens of
    /// the test server's shape).
    fn records(op: u32, n: Option<u32>) -> Vec<RawDocumentBuf> {
        let token = |fragment: Option<u32>| {
            let whole = format!("82634F1A2B0000000101{op:08X}00");
            fragment.map_or(whole.clone(), |k| format!("{whole}{k:08X}"))
        };
        let record = |id: String, event: Document| {
            let record = doc! { "_id": id, "consumer": "c", "source": "db.coll", "event": event };
            RawDocumentBuf::try_from(&record).unwrap()
        };
        match n {
            None => vec![record(
                "c/X".into(),
                doc! { "_id": { "_data": token(None) } },
            )],
            Some(n) => (1..=n)
                .map(|k| {
                    record(
                        format!("c/X.{k}of{n}"),
                        doc! {
                            "_id": { "_data": token(Some(k - 1)) },
                            "splitEvent": { "fragment": k as i32, "of": n as i32 },
                        },
                    )
                })
                .collect(),
        }
    }

    /// An event stored in two fragments is one event when it comes again whole or in three
    /// fragments; another event under its ID refuses the commit.
    pub(crate) fn a_split_event_is_one_event_however_split(store: &dyn CheckpointStore) {
        let consumer = Consumer {
            consumer: "c".into(),
            source: "db.coll".into(),
        };
        store
            .ensure_checkpoint("c", checkpoint::initial("c", "db.coll", "rs"))
            .unwrap();
        let tokens: Vec<Document> = (1..=5)
            .map(|n| doc! { "_data": format!("82{n:02}") })
            .collect();
        let commit = |at: usize, outbox: Vec<RawDocumentBuf>| {
            store.commit(&Commit {
                consumer: &consumer,
                expected: at.checked_sub(1).map(|i| &tokens[i]),
                next: &tokens[at],
                mode: Mode::ResumeAfter,
                outbox,
                quarantine: vec![],
                lease: None,
                policy: None,
            })
        };
        assert!(
            commit(0, records(1, Some(2)))
                .unwrap()
                .duplicates
                .is_empty()
        );
        let stored = store.dump("c").unwrap();
        assert_eq!(stored.outbox.len(), 2);
        let checkpoint = stored.checkpoint.unwrap();
        assert!(checkpoint.get_bool(SPLIT_EVENTS_WRITTEN).unwrap());
        for (at, again) in [(1, records(1, None)), (2, records(1, Some(3)))] {
            let applied = commit(at, again).unwrap();
            assert_eq!(applied.duplicates, ["c/X"]);
            assert_eq!(store.dump("c").unwrap().outbox, stored.outbox);
        }
        assert!(matches!(
            commit(3, records(2, None)),
            Err(CommitError::Duplicate(id)) if id == "c/X.1of2"
        ));
        assert!(matches!(
            commit(3, records(2, Some(3))),
            Err(CommitError::Duplicate(id)) if id == "c/X.1of2"
        ));
        let after = store.dump("c").unwrap();
        assert_eq!(after.outbox, stored.outbox);
        assert_eq!(
            after.checkpoint.unwrap().get_document("token").unwrap(),
            &tokens[2]
        );
    }
}
