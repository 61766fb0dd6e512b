//! In-memory collections with multi-version documents for snapshot-isolated transactions and
//! reads at an earlier cluster time.
//!
//! Every committed write gets a commit sequence number; each document keeps the versions that
//! open transactions may still read, and those of the last `snapshot_history` seconds (see
//! [`SnapshotHistory`]). A transaction reads at the sequence number current when it started,
//! stages its writes privately and holds the documents it wrote until it ends.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bson::{Binary, Bson, Document, Timestamp, spec::BinarySubtype};

use crate::error::CommandError;
use crate::lookup::{self, Lookup};
use crate::namespace::Namespace;
use crate::oplog::{EventKind, Images, Oplog, PendingEvent, TxnInfo};
use crate::values::{DocKey, doc_key};

#[derive(Debug, Clone)]
pub struct Version {
    pub seq: u64,
    /// `None` is a deletion.
    pub doc: Option<Arc<Document>>,
}

#[derive(Debug, Default)]
pub struct DocEntry {
    /// Insertion position in the collection (natural order).
    pub record: u64,
    /// Oldest first.
    pub versions: VecDeque<Version>,
    /// The transaction that has written this document and not yet ended.
    pub held_by: Option<u64>,
}

impl DocEntry {
    pub fn latest(&self) -> Option<&Arc<Document>> {
        self.versions.back().and_then(|v| v.doc.as_ref())
    }

    pub fn latest_seq(&self) -> u64 {
        self.versions.back().map(|v| v.seq).unwrap_or(0)
    }

    pub fn at(&self, snapshot: u64) -> Option<&Arc<Document>> {
        if let Some(last) = self.versions.back()
            && last.seq <= snapshot
        {
            return last.doc.as_ref();
        }
        let n = self.versions.partition_point(|v| v.seq <= snapshot);
        n.checked_sub(1)
            .and_then(|i| self.versions.get(i))
            .and_then(|v| v.doc.as_ref())
    }

    /// Drops versions no reader at `min_snapshot` or later can read.
    fn prune(&mut self, min_snapshot: u64) {
        if self.versions.len() < 2 || self.versions[1].seq > min_snapshot {
            return;
        }
        let n = self.versions.partition_point(|v| v.seq <= min_snapshot);
        self.versions.drain(..n - 1);
    }

    /// True when the entry carries nothing anyone can see.
    fn is_dead(&self, min_snapshot: u64) -> bool {
        self.held_by.is_none()
            && match self.versions.len() {
                0 => true,
                1 => self.versions[0].doc.is_none() && self.versions[0].seq <= min_snapshot,
                _ => false,
            }
    }

    /// True when the entry keeps more than its current document: older versions, or the
    /// deletion that ended it.
    fn has_history(&self) -> bool {
        self.versions.len() > 1 || self.versions.front().is_some_and(|v| v.doc.is_none())
    }
}

#[derive(Debug)]
pub struct Collection {
    pub uuid: Binary,
    pub docs: BTreeMap<DocKey, DocEntry>,
    pub options: Document,
    /// Secondary index specifications (only `_id` is enforced as unique).
    pub indexes: Vec<Document>,
    /// The secondary indexes' lookups by equality, kept to the latest committed documents.
    lookups: Vec<Lookup>,
    /// Documents changed by a commit that kept an earlier version, by the commit's sequence
    /// number (oldest first, as long as a reader may read before it): a reader at an earlier
    /// snapshot may see them differently from the lookups.
    recent: VecDeque<(u64, DocKey)>,
    /// The open transaction that created the collection (explicitly, or by a first write or
    /// index): until it commits, only that transaction sees the collection, and it is gone if
    /// the transaction aborts.
    pub created_by: Option<u64>,
    next_record: u64,
}

impl Collection {
    /// Whether `changeStreamPreAndPostImages` is enabled: updates, replacements and deletes
    /// then keep the document before (and after) the write with their event.
    pub fn images_enabled(&self) -> bool {
        matches!(
            self.options.get("changeStreamPreAndPostImages"),
            Some(Bson::Document(d)) if matches!(d.get("enabled"), Some(Bson::Boolean(true)))
        )
    }

    /// What `listCollections` calls it: `collection`, `view` or `timeseries`.
    pub fn kind(&self) -> &'static str {
        if self.options.contains_key("viewOn") {
            "view"
        } else if self.options.contains_key("timeseries") {
            "timeseries"
        } else {
            "collection"
        }
    }

    fn new(options: Document) -> Self {
        let oid = bson::oid::ObjectId::new().bytes();
        let mut bytes = [0u8; 16];
        bytes[..12].copy_from_slice(&oid);
        bytes[12..].copy_from_slice(&std::process::id().to_be_bytes());
        bytes[6] = (bytes[6] & 0x0F) | 0x40;
        bytes[8] = (bytes[8] & 0x3F) | 0x80;
        Collection {
            uuid: Binary {
                subtype: BinarySubtype::Uuid,
                bytes: bytes.to_vec(),
            },
            docs: BTreeMap::new(),
            options,
            indexes: Vec::new(),
            lookups: Vec::new(),
            recent: VecDeque::new(),
            created_by: None,
            next_record: 0,
        }
    }

    /// Brings the lookups in line with the index specifications: a new index's lookup is built
    /// from the latest documents, a dropped one's goes.
    pub fn sync_lookups(&mut self) {
        let specs = &self.indexes;
        let named = |name: &str| specs.iter().any(|s| s.get_str("name").ok() == Some(name));
        self.lookups.retain(|l| named(&l.name));
        for spec in specs {
            let Ok(name) = spec.get_str("name") else {
                continue;
            };
            if self.lookups.iter().any(|l| l.name == name) {
                continue;
            }
            if let Some(mut lookup) = Lookup::of_spec(spec) {
                for (key, entry) in &self.docs {
                    if let Some(doc) = entry.latest() {
                        lookup.insert(key, doc);
                    }
                }
                self.lookups.push(lookup);
            }
        }
    }

    /// Commits a new version of `key`'s document at `seq` (releasing the hold of transaction
    /// `release`), keeping versions readers at `bound` or later may need, and the lookups and
    /// the record of recent changes current. True when the document keeps history to prune
    /// later.
    fn push_version(
        &mut self,
        key: &DocKey,
        seq: u64,
        doc: Option<Arc<Document>>,
        release: Option<u64>,
        bound: u64,
    ) -> bool {
        let entry = self.entry_mut(key.clone());
        let had_versions = !entry.versions.is_empty();
        let before = entry.latest().cloned();
        entry.versions.push_back(Version {
            seq,
            doc: doc.clone(),
        });
        if release.is_some() && entry.held_by == release {
            entry.held_by = None;
        }
        entry.prune(bound);
        let kept = if entry.is_dead(bound) {
            self.docs.remove(key);
            false
        } else {
            entry.has_history()
        };
        for lookup in &mut self.lookups {
            if let Some(before) = &before {
                lookup.remove(key, before);
            }
            if let Some(doc) = &doc {
                lookup.insert(key, doc);
            }
        }
        if had_versions {
            self.recent.push_back((seq, key.clone()));
        }
        kept
    }

    /// The entry for `key`, created (at the end of natural order) if missing.
    pub fn entry_mut(&mut self, key: DocKey) -> &mut DocEntry {
        let next = &mut self.next_record;
        self.docs.entry(key).or_insert_with(|| {
            *next += 1;
            DocEntry {
                record: *next,
                ..DocEntry::default()
            }
        })
    }
}

/// An open transaction's private state.
#[derive(Debug)]
pub struct Txn {
    pub id: u64,
    pub txn_number: i64,
    pub snapshot: u64,
    pub writes: HashMap<(Namespace, DocKey), Option<Arc<Document>>>,
    pub events: Vec<PendingEvent>,
}

impl Txn {
    /// A reader of the committed state at `snapshot` outside any transaction: it writes and
    /// holds nothing (id 0 is never a transaction's).
    pub fn reader(snapshot: u64) -> Txn {
        Txn {
            id: 0,
            txn_number: -1,
            snapshot,
            writes: HashMap::new(),
            events: Vec::new(),
        }
    }
}

/// Why a write statement could not be applied.
#[derive(Debug)]
pub enum WriteError {
    /// A non-transactional write found a document held by an open transaction: wait and retry.
    Blocked,
    Command(CommandError),
}

impl From<CommandError> for WriteError {
    fn from(e: CommandError) -> Self {
        WriteError::Command(e)
    }
}

/// One document change of a write statement.
#[derive(Debug)]
pub struct Change {
    pub ns: Namespace,
    pub key: DocKey,
    pub new: Option<Arc<Document>>,
    pub event: EventKind,
}

/// The committed states kept for reads at an earlier cluster time (`readConcern: {level:
/// "snapshot", atClusterTime}` outside a transaction).
///
/// Every commit is recorded with its cluster time. The state at a cluster time `T` is the one
/// the last commit at or before `T` left. A commit's state stays readable until the next commit
/// is older than the window; the front of `commits` is therefore the oldest readable state and
/// its time the oldest readable cluster time. Versions older than it are pruned: those of a
/// document written again at once, the others when the sweep of `revisit` reaches them.
#[derive(Debug)]
pub struct SnapshotHistory {
    /// Seconds of history kept; 0 keeps only the current state.
    window_secs: u64,
    /// `(cluster time, commit sequence number)`, oldest first; never empty.
    commits: VecDeque<(Timestamp, u64)>,
    /// Documents left with older versions or a deletion by the commit with this sequence
    /// number, to prune once no reader can need them.
    revisit: VecDeque<(u64, Namespace, DocKey)>,
}

impl SnapshotHistory {
    /// History of `window`, starting empty at `start` (sequence number 0).
    pub fn new(window: Duration, start: Timestamp) -> Self {
        SnapshotHistory {
            window_secs: window.as_secs(),
            commits: VecDeque::from([(start, 0)]),
            revisit: VecDeque::new(),
        }
    }

    /// The oldest cluster time a read can still be served at.
    pub fn oldest(&self) -> Timestamp {
        self.commits
            .front()
            .map(|(ts, _)| *ts)
            .unwrap_or(Timestamp {
                time: 0,
                increment: 0,
            })
    }

    /// The commit sequence number of the state at cluster time `ts`; `None` when that state is
    /// no longer kept.
    pub fn seq_at(&self, ts: Timestamp) -> Option<u64> {
        let key = (ts.time, ts.increment);
        let n = self
            .commits
            .partition_point(|(t, _)| (t.time, t.increment) <= key);
        n.checked_sub(1)
            .and_then(|i| self.commits.get(i))
            .map(|(_, seq)| *seq)
    }

    /// How many commits (and documents to revisit) the history holds.
    pub fn retained(&self) -> (usize, usize) {
        (self.commits.len(), self.revisit.len())
    }

    fn keeps_history(&self) -> bool {
        self.window_secs > 0
    }

    /// Versions at or after this sequence number must be kept for readers of the history.
    fn keep_from(&self) -> u64 {
        if !self.keeps_history() {
            return u64::MAX;
        }
        self.commits.front().map(|(_, seq)| *seq).unwrap_or(0)
    }

    /// Records a commit, forgetting the states that are now older than the window.
    fn record(&mut self, ts: Timestamp, seq: u64) {
        self.commits.push_back((ts, seq));
        self.forget(now_secs());
    }

    /// Forgets the states no read within the window (seconds before `now`) can need: those
    /// followed by a commit at least that old.
    fn forget(&mut self, now: u64) {
        while self.commits.len() > 1
            && self
                .commits
                .get(1)
                .is_some_and(|(next, _)| u64::from(next.time) + self.window_secs <= now)
        {
            self.commits.pop_front();
        }
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[derive(Debug)]
pub struct Store {
    pub collections: BTreeMap<Namespace, Collection>,
    /// Sequence number of the latest commit.
    pub seq: u64,
    pub history: SnapshotHistory,
}

impl Store {
    /// An empty store keeping `snapshot_history` of committed states from cluster time `start`.
    pub fn new(snapshot_history: Duration, start: Timestamp) -> Self {
        Store {
            collections: BTreeMap::new(),
            seq: 0,
            history: SnapshotHistory::new(snapshot_history, start),
        }
    }

    /// Versions at or after this sequence number must be kept: open transactions read at
    /// `min_snapshot` or later, readers of the history at `history.keep_from()` or later.
    fn keep_bound(&self, min_snapshot: u64) -> u64 {
        min_snapshot.min(self.history.keep_from())
    }

    /// Notes that the commit `seq` left this document with history to prune later.
    fn note_history(&mut self, seq: u64, ns: Namespace, key: DocKey) {
        if self.history.keeps_history() {
            self.history.revisit.push_back((seq, ns, key));
        }
    }

    /// Prunes the documents whose older versions no reader can need any more.
    fn sweep(&mut self, min_snapshot: u64) {
        let bound = self.keep_bound(min_snapshot);
        for coll in self.collections.values_mut() {
            while coll.recent.front().is_some_and(|(seq, _)| *seq <= bound) {
                coll.recent.pop_front();
            }
        }
        while self
            .history
            .revisit
            .front()
            .is_some_and(|(seq, _, _)| *seq <= bound)
        {
            let Some((_, ns, key)) = self.history.revisit.pop_front() else {
                break;
            };
            if let Some(coll) = self.collections.get_mut(&ns)
                && let Some(entry) = coll.docs.get_mut(&key)
            {
                entry.prune(bound);
                if entry.is_dead(bound) {
                    coll.docs.remove(&key);
                }
            }
        }
    }

    /// The commit sequence number a read at cluster time `at` sees, or why it cannot be served.
    pub fn seq_at(&self, at: Timestamp) -> Option<u64> {
        self.history.seq_at(at)
    }

    pub fn collection(&self, ns: &Namespace) -> Option<&Collection> {
        self.collections.get(ns)
    }

    pub fn ensure_collection(&mut self, ns: &Namespace) -> &mut Collection {
        self.collections
            .entry(ns.clone())
            .or_insert_with(|| Collection::new(Document::new()))
    }

    /// The collection as a reader sees it: one created by an open transaction is seen by that
    /// transaction (`txn`, its id) only.
    pub fn visible(&self, ns: &Namespace, txn: Option<u64>) -> Option<&Collection> {
        self.collections
            .get(ns)
            .filter(|c| c.created_by.is_none() || c.created_by == txn)
    }

    /// Creates a collection, inside the transaction `txn` if given; false if it exists.
    pub fn create_collection(
        &mut self,
        ns: &Namespace,
        options: Document,
        txn: Option<u64>,
    ) -> bool {
        if self.collections.contains_key(ns) {
            return false;
        }
        let mut coll = Collection::new(options);
        coll.created_by = txn;
        self.collections.insert(ns.clone(), coll);
        true
    }

    /// The databases holding a committed collection.
    pub fn database_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .collections
            .iter()
            .filter(|(_, c)| c.created_by.is_none())
            .map(|(n, _)| n.db.clone())
            .collect();
        names.dedup();
        names
    }

    /// The committed collections of a database.
    pub fn collection_names(&self, db: &str) -> Vec<String> {
        self.collections
            .iter()
            .filter(|(n, c)| n.db == db && c.created_by.is_none())
            .map(|(n, _)| n.coll.clone())
            .collect()
    }

    /// The document with this key as the reader sees it.
    pub fn get(&self, ns: &Namespace, key: &DocKey, txn: Option<&Txn>) -> Option<Arc<Document>> {
        if let Some(t) = txn
            && let Some(w) = t.writes.get(&(ns.clone(), key.clone()))
        {
            return w.clone();
        }
        let entry = self.collections.get(ns)?.docs.get(key)?;
        match txn {
            Some(t) => entry.at(t.snapshot).cloned(),
            None => entry.latest().cloned(),
        }
    }

    /// Every document of the collection as the reader sees it, in natural (insertion) order.
    pub fn scan(&self, ns: &Namespace, txn: Option<&Txn>) -> Vec<(DocKey, Arc<Document>)> {
        let Some(coll) = self.collections.get(ns) else {
            return match txn {
                Some(t) => t
                    .writes
                    .iter()
                    .filter(|((n, _), _)| n == ns)
                    .filter_map(|((_, k), d)| d.clone().map(|d| (k.clone(), d)))
                    .collect(),
                None => Vec::new(),
            };
        };
        let mut entries: Vec<(&DocKey, &DocEntry)> = coll.docs.iter().collect();
        entries.sort_unstable_by_key(|(_, e)| e.record);
        let mut out = Vec::with_capacity(entries.len());
        for (key, entry) in entries {
            let doc = match txn {
                Some(t) => match t.writes.get(&(ns.clone(), key.clone())) {
                    Some(w) => w.clone(),
                    None => entry.at(t.snapshot).cloned(),
                },
                None => entry.latest().cloned(),
            };
            if let Some(d) = doc {
                out.push((key.clone(), d));
            }
        }
        out
    }

    /// Candidate documents for a filter: direct lookups when it pins `_id` (by equality or a
    /// list of plain values) or a secondary index's leading fields, else a scan. Lookups come in
    /// natural order, as a scan's would.
    pub fn candidates(
        &self,
        ns: &Namespace,
        filter: &Document,
        txn: Option<&Txn>,
    ) -> Vec<(DocKey, Arc<Document>)> {
        if let Some(id) = pinned_id(filter) {
            let key = doc_key(id);
            return self
                .get(ns, &key, txn)
                .map(|d| vec![(key, d)])
                .unwrap_or_default();
        }
        if let Some(ids) = listed_ids(filter) {
            let keys: BTreeSet<DocKey> = ids.iter().map(doc_key).collect();
            return self.in_natural_order(ns, keys, txn);
        }
        if let Some(coll) = self.collections.get(ns)
            && let Some(mut keys) = lookup::candidates(&coll.lookups, filter)
        {
            if let Some(t) = txn {
                keys.extend(
                    t.writes
                        .keys()
                        .filter(|(n, _)| n == ns)
                        .map(|(_, k)| k.clone()),
                );
                // The record is in commit order: only its part after the snapshot is read.
                let after = coll.recent.partition_point(|(seq, _)| *seq <= t.snapshot);
                keys.extend(coll.recent.range(after..).map(|(_, k)| k.clone()));
            }
            return self.in_natural_order(ns, keys, txn);
        }
        self.scan(ns, txn)
    }

    /// The documents of `keys` the reader sees, in natural order.
    fn in_natural_order(
        &self,
        ns: &Namespace,
        keys: impl IntoIterator<Item = DocKey>,
        txn: Option<&Txn>,
    ) -> Vec<(DocKey, Arc<Document>)> {
        let docs = self.collections.get(ns).map(|c| &c.docs);
        let mut found: Vec<(u64, DocKey, Arc<Document>)> = keys
            .into_iter()
            .filter_map(|key| {
                let doc = self.get(ns, &key, txn)?;
                let record = docs
                    .and_then(|d| d.get(&key))
                    .map_or(u64::MAX, |e| e.record);
                Some((record, key, doc))
            })
            .collect();
        found.sort_by_key(|(record, _, _)| *record);
        found.into_iter().map(|(_, key, doc)| (key, doc)).collect()
    }

    /// Can this writer change the document? (Checks only; changes nothing.)
    pub fn check_writable(
        &self,
        ns: &Namespace,
        key: &DocKey,
        txn: Option<&Txn>,
    ) -> Result<(), WriteError> {
        // A collection an open transaction created is that transaction's until it ends.
        if let Some(owner) = self.collections.get(ns).and_then(|c| c.created_by) {
            match txn {
                None => return Err(WriteError::Blocked),
                Some(t) if t.id != owner => return Err(CommandError::write_conflict().into()),
                Some(_) => {}
            }
        }
        let Some(entry) = self.collections.get(ns).and_then(|c| c.docs.get(key)) else {
            return Ok(());
        };
        match (txn, entry.held_by) {
            (None, Some(_)) => Err(WriteError::Blocked),
            (None, None) => Ok(()),
            (Some(t), Some(h)) if h != t.id => Err(CommandError::write_conflict().into()),
            (Some(t), _) => {
                if entry.latest_seq() > t.snapshot
                    && !t.writes.contains_key(&(ns.clone(), key.clone()))
                {
                    Err(CommandError::write_conflict().into())
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Applies the changes of one statement: committed at once outside a transaction (one
    /// history entry per change, one cluster time), staged inside one.
    pub fn apply(
        &mut self,
        oplog: &mut Oplog,
        txn: Option<&mut Txn>,
        changes: Vec<Change>,
        min_snapshot: u64,
    ) -> Result<(), WriteError> {
        for c in &changes {
            self.check_writable(&c.ns, &c.key, txn.as_deref())?;
        }
        if changes.is_empty() {
            return Ok(());
        }
        match txn {
            Some(t) => {
                for c in changes {
                    let (created, pending) = self.pending_event(&c, Some(t));
                    t.events.extend(created);
                    let entry = self.ensure_collection(&c.ns).entry_mut(c.key.clone());
                    entry.held_by = Some(t.id);
                    t.writes.insert((c.ns.clone(), c.key), c.new);
                    t.events.push(pending);
                }
            }
            None => {
                self.seq += 1;
                let seq = self.seq;
                let bound = self.keep_bound(min_snapshot);
                let mut events = Vec::with_capacity(changes.len());
                for c in changes {
                    let (created, pending) = self.pending_event(&c, None);
                    events.extend(created);
                    events.push(pending);
                    let coll = self.ensure_collection(&c.ns);
                    let kept = coll.push_version(&c.key, seq, c.new, None, bound);
                    if kept {
                        self.note_history(seq, c.ns, c.key);
                    }
                }
                let ts = oplog.append(events, None);
                self.history.record(ts, seq);
                self.sweep(min_snapshot);
            }
        }
        Ok(())
    }

    /// The history entry of one change (with the images its collection keeps), preceded by a
    /// `create` entry when the write creates its collection. Creates the collection.
    fn pending_event(
        &mut self,
        c: &Change,
        txn: Option<&Txn>,
    ) -> (Option<PendingEvent>, PendingEvent) {
        let before = if matches!(
            c.event,
            EventKind::Update { .. } | EventKind::Replace { .. } | EventKind::Delete { .. }
        ) {
            self.get(&c.ns, &c.key, txn)
        } else {
            None
        };
        let created = self.create_collection(&c.ns, Document::new(), txn.map(|t| t.id));
        let coll = self.ensure_collection(&c.ns);
        let uuid = Some(coll.uuid.clone());
        let create = created.then(|| {
            PendingEvent::new(
                c.ns.clone(),
                EventKind::Create {
                    description: create_description(&Document::new()),
                },
                uuid.clone(),
            )
        });
        let mut pending = PendingEvent::new(c.ns.clone(), c.event.clone(), uuid);
        pending.doc = c.new.clone().or_else(|| before.clone());
        if coll.images_enabled() && before.is_some() {
            pending.images = Some(Images {
                pre: before,
                post: match c.event {
                    EventKind::Update { .. } => c.new.clone(),
                    _ => None,
                },
            });
        }
        (create, pending)
    }

    /// Makes a transaction's writes visible at one new sequence number and records its events.
    pub fn commit(&mut self, oplog: &mut Oplog, txn: Txn, info: TxnInfo, min_snapshot: u64) {
        for coll in self.collections.values_mut() {
            if coll.created_by == Some(txn.id) {
                coll.created_by = None;
            }
        }
        let wrote = !txn.writes.is_empty();
        if wrote {
            self.seq += 1;
        }
        let seq = self.seq;
        let bound = self.keep_bound(min_snapshot);
        for ((ns, key), doc) in txn.writes {
            let coll = self.ensure_collection(&ns);
            let kept = coll.push_version(&key, seq, doc, Some(txn.id), bound);
            if kept {
                self.note_history(seq, ns, key);
            }
        }
        let ts = (!txn.events.is_empty()).then(|| oplog.append(txn.events, Some(info)));
        if wrote {
            let ts = ts.unwrap_or_else(|| oplog.tick());
            self.history.record(ts, seq);
            self.sweep(min_snapshot);
        }
    }

    /// Releases a transaction's holds and discards its writes.
    pub fn abort(&mut self, txn: Txn, min_snapshot: u64) {
        let min_snapshot = self.keep_bound(min_snapshot);
        let id = txn.id;
        self.collections.retain(|_, c| c.created_by != Some(id));
        for (ns, key) in txn.writes.into_keys() {
            if let Some(coll) = self.collections.get_mut(&ns)
                && let Some(entry) = coll.docs.get_mut(&key)
            {
                if entry.held_by == Some(txn.id) {
                    entry.held_by = None;
                }
                if entry.is_dead(min_snapshot) {
                    coll.docs.remove(&key);
                }
            }
        }
    }

    /// The number of visible documents (for stats and tests).
    pub fn count(&self, ns: &Namespace) -> usize {
        self.collections
            .get(ns)
            .map(|c| c.docs.values().filter(|e| e.latest().is_some()).count())
            .unwrap_or(0)
    }
}

/// The `operationDescription` of a collection's `create` event: its options, then the
/// `_id` index.
pub fn create_description(options: &Document) -> Document {
    let mut d = options.clone();
    d.insert(
        "idIndex",
        bson::doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"},
    );
    d
}

/// The `_id` a filter pins by plain equality, if any.
pub fn pinned_id(filter: &Document) -> Option<&Bson> {
    match filter.get("_id")? {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            if d.len() == 1 { d.get("$eq") } else { None }
        }
        // Arrays and null match by element or absence; leave them to the matcher.
        Bson::Array(_) | Bson::Null => None,
        v => Some(v),
    }
}

/// The `_id`s a filter lists by `{$in: [...]}` of plain values (no pattern, no array), if it
/// does: only those documents can match.
pub fn listed_ids(filter: &Document) -> Option<&Vec<Bson>> {
    let Bson::Document(d) = filter.get("_id")? else {
        return None;
    };
    if d.len() != 1 {
        return None;
    }
    match d.get("$in")? {
        Bson::Array(values)
            if values
                .iter()
                .all(|v| !matches!(v, Bson::RegularExpression(_) | Bson::Array(_))) =>
        {
            Some(values)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(time: u32, increment: u32) -> Timestamp {
        Timestamp { time, increment }
    }

    fn insert(ns: &Namespace, id: i32, v: i32) -> Change {
        let doc = Arc::new(bson::doc! {"_id": id, "v": v});
        Change {
            ns: ns.clone(),
            key: doc_key(&Bson::Int32(id)),
            new: Some(doc.clone()),
            event: EventKind::Insert {
                id: Bson::Int32(id),
                doc,
            },
        }
    }

    fn delete(ns: &Namespace, id: i32) -> Change {
        Change {
            ns: ns.clone(),
            key: doc_key(&Bson::Int32(id)),
            new: None,
            event: EventKind::Delete {
                id: Bson::Int32(id),
            },
        }
    }

    #[test]
    fn the_history_maps_cluster_times_to_states_and_forgets_old_ones() {
        let mut h = SnapshotHistory::new(Duration::from_secs(10), ts(100, 0));
        h.commits.push_back((ts(105, 1), 1));
        h.commits.push_back((ts(105, 2), 2));
        h.commits.push_back((ts(120, 1), 3));
        assert_eq!(h.seq_at(ts(99, 9)), None);
        assert_eq!(h.seq_at(ts(100, 0)), Some(0));
        assert_eq!(h.seq_at(ts(105, 1)), Some(1));
        assert_eq!(h.seq_at(ts(110, 0)), Some(2));
        assert_eq!(h.seq_at(ts(130, 0)), Some(3));
        // At 116 the state of (105, 2) is still needed for reads at 106..120.
        h.forget(116);
        assert_eq!(h.oldest(), ts(105, 2));
        assert_eq!(h.keep_from(), 2);
        assert_eq!(h.seq_at(ts(105, 1)), None);
        // Long after, only the latest state remains.
        h.forget(1_000);
        assert_eq!(h.oldest(), ts(120, 1));
        assert_eq!(h.retained().0, 1);
    }

    #[test]
    fn a_list_of_ids_is_looked_up_in_natural_order_and_anything_else_is_scanned() {
        let ns = Namespace::new("d", "c");
        let mut oplog = Oplog::new(100);
        let mut store = Store::new(Duration::from_secs(300), oplog.cluster_time());
        let changes = (1..=5).rev().map(|id| insert(&ns, id, 1)).collect();
        store.apply(&mut oplog, None, changes, u64::MAX).unwrap();
        let ids = |found: Vec<(DocKey, Arc<Document>)>| -> Vec<i32> {
            found
                .iter()
                .map(|(_, d)| d.get_i32("_id").unwrap())
                .collect()
        };
        // Listed out of order, twice, as another number type, and one absent: each present
        // document once, in insertion order (5 first).
        let listed = bson::doc! {"_id": {"$in": [2, 4_i64, 2.0, 9, 5]}};
        assert!(listed_ids(&listed).is_some());
        assert_eq!(ids(store.candidates(&ns, &listed, None)), vec![5, 4, 2]);
        // Patterns, arrays and other operators beside `$in` leave it to the scan.
        let pattern = bson::Regex {
            pattern: "1".try_into().unwrap(),
            options: "".try_into().unwrap(),
        };
        for scanned in [
            bson::doc! {"_id": {"$in": [pattern]}},
            bson::doc! {"_id": {"$in": [[1, 2]]}},
            bson::doc! {"_id": {"$in": [1], "$ne": 2}},
            bson::doc! {"v": {"$in": [1]}},
        ] {
            assert!(listed_ids(&scanned).is_none(), "{scanned}");
            assert_eq!(store.candidates(&ns, &scanned, None).len(), 5);
        }
    }

    /// A change writing `doc` (its `_id` an i32) as an insert, or a replacement when `replace`.
    fn write(ns: &Namespace, doc: Document, replace: bool) -> Change {
        let id = doc.get("_id").cloned().unwrap();
        let doc = Arc::new(doc);
        Change {
            ns: ns.clone(),
            key: doc_key(&id),
            new: Some(doc.clone()),
            event: if replace {
                EventKind::Replace { id, doc }
            } else {
                EventKind::Insert { id, doc }
            },
        }
    }

    #[test]
    fn a_secondary_index_finds_what_a_scan_finds_for_every_reader() {
        let ns = Namespace::new("d", "c");
        let mut oplog = Oplog::new(1000);
        let mut store = Store::new(Duration::from_secs(300), oplog.cluster_time());
        let coll = store.ensure_collection(&ns);
        coll.indexes
            .push(bson::doc! {"v": 2, "name": "s_n", "key": {"s": 1, "n.v": -1}});
        coll.indexes
            .push(bson::doc! {"v": 2, "name": "t", "key": {"t": "text"}});
        // Documents of every shape the index meets, the index declared before and after some.
        let shape = |id: i32, round: i32| -> Document {
            let s = ["open", "done", "dead"][((id + round) % 3) as usize];
            let v = (id * 7 + round) % 4;
            match (id + round) % 8 {
                0 => bson::doc! {"_id": id, "s": s, "n": {"v": v}},
                1 => bson::doc! {"_id": id, "s": s, "n": {"v": f64::from(v)}},
                2 => bson::doc! {"_id": id, "s": [s, "open"], "n": {"v": v}},
                3 => bson::doc! {"_id": id, "s": s, "n": [{"v": v}, {"v": 9}]},
                4 => bson::doc! {"_id": id, "s": s},
                5 => bson::doc! {"_id": id, "s": s, "n": {"v": i64::from(v)}},
                6 => bson::doc! {"_id": id, "s": s, "n": 3},
                _ => bson::doc! {"_id": id, "n": {"v": v}},
            }
        };
        let none = u64::MAX;
        let first: Vec<Change> = (0..20).map(|id| write(&ns, shape(id, 0), false)).collect();
        store.apply(&mut oplog, None, first, none).unwrap();
        store.ensure_collection(&ns).sync_lookups();
        let before = store.seq;
        for round in 1..4 {
            let changes: Vec<Change> = (0..30)
                .filter(|id| (id + round) % 3 != 0)
                .map(|id| write(&ns, shape(id, round), id < 20))
                .collect();
            store.apply(&mut oplog, None, changes, none).unwrap();
            store
                .apply(&mut oplog, None, vec![delete(&ns, round * 5)], none)
                .unwrap();
        }
        // A transaction's own writes: one new document, one replaced, one deleted.
        let mut txn = Txn {
            id: 77,
            txn_number: 1,
            snapshot: store.seq,
            writes: HashMap::new(),
            events: Vec::new(),
        };
        let staged = vec![
            write(
                &ns,
                bson::doc! {"_id": 100, "s": "open", "n": {"v": 1}},
                false,
            ),
            write(&ns, bson::doc! {"_id": 1, "s": "open", "n": {"v": 2}}, true),
            delete(&ns, 2),
        ];
        store
            .apply(&mut oplog, Some(&mut txn), staged, none)
            .unwrap();
        assert!(!store.collection(&ns).unwrap().lookups.is_empty());
        let old = Txn::reader(before);
        let readers: [(&str, Option<&Txn>); 3] = [
            ("latest", None),
            ("before", Some(&old)),
            ("txn", Some(&txn)),
        ];
        let mut looked_up = 0;
        for filter in [
            bson::doc! {"s": "open"},
            bson::doc! {"s": "done", "n.v": 1},
            bson::doc! {"s": {"$in": ["dead", "done"]}, "n.v": {"$in": [0, 3.0]}},
            bson::doc! {"s": {"$eq": "open"}, "n.v": 2_i64, "_id": {"$gt": 3}},
            bson::doc! {"s": "open", "n.v": null},
            bson::doc! {"n.v": 1},
            bson::doc! {"t": "x"},
        ] {
            let indexed = lookup::candidates(&store.collection(&ns).unwrap().lookups, &filter);
            looked_up += usize::from(indexed.is_some());
            for (reader, view) in readers {
                let ids = |found: Vec<(DocKey, Arc<Document>)>| -> Vec<i32> {
                    found
                        .iter()
                        .filter(|(_, d)| crate::matcher::matches(d, &filter).unwrap())
                        .map(|(_, d)| d.get_i32("_id").unwrap())
                        .collect()
                };
                let found = ids(store.candidates(&ns, &filter, view));
                let scanned = ids(store.scan(&ns, view));
                assert_eq!(found, scanned, "{filter} read {reader}");
            }
        }
        assert_eq!(looked_up, 5);
        // The lookup reads only what can match (and what it cannot place): fewer than a scan.
        let open = bson::doc! {"s": "dead", "n.v": 0};
        assert!(store.candidates(&ns, &open, None).len() < store.scan(&ns, None).len() / 2);
        // Dropped, the index is no longer looked up.
        let coll = store.ensure_collection(&ns);
        coll.indexes.clear();
        coll.sync_lookups();
        assert!(lookup::candidates(&coll.lookups, &open).is_none());
    }

    #[test]
    fn versions_are_kept_within_the_window_and_swept_after() {
        let ns = Namespace::new("d", "c");
        let mut oplog = Oplog::new(100);
        let mut store = Store::new(Duration::from_secs(300), oplog.cluster_time());
        let none = u64::MAX;
        store
            .apply(
                &mut oplog,
                None,
                vec![insert(&ns, 1, 1), insert(&ns, 2, 1)],
                none,
            )
            .unwrap();
        let first = store.seq;
        let mut update = insert(&ns, 1, 2);
        update.event = EventKind::Replace {
            id: Bson::Int32(1),
            doc: update.new.clone().unwrap(),
        };
        store.apply(&mut oplog, None, vec![update], none).unwrap();
        store
            .apply(&mut oplog, None, vec![delete(&ns, 2)], none)
            .unwrap();
        let key = |id: i32| doc_key(&Bson::Int32(id));
        let coll = store.collection(&ns).unwrap();
        // Both documents keep their history: the old version, the deletion.
        assert_eq!(coll.docs[&key(1)].versions.len(), 2);
        assert_eq!(coll.docs[&key(2)].versions.len(), 2);
        let reader = Txn::reader(first);
        assert_eq!(store.scan(&ns, Some(&reader)).len(), 2);
        assert_eq!(store.scan(&ns, None).len(), 1);
        assert_eq!(store.history.retained(), (4, 2));
        // Once the window has passed, the sweep leaves only the current state.
        store.history.forget(u64::MAX);
        store.sweep(none);
        assert_eq!(store.history.retained(), (1, 0));
        let coll = store.collection(&ns).unwrap();
        assert_eq!(coll.docs[&key(1)].versions.len(), 1);
        assert!(!coll.docs.contains_key(&key(2)));
        assert_eq!(store.seq_at(oplog.cluster_time()), Some(store.seq));
        // An open transaction's snapshot holds versions back from the sweep.
        let mut update = insert(&ns, 1, 3);
        update.event = EventKind::Replace {
            id: Bson::Int32(1),
            doc: update.new.clone().unwrap(),
        };
        let held = store.seq;
        store.apply(&mut oplog, None, vec![update], held).unwrap();
        store.history.forget(u64::MAX);
        store.sweep(held);
        assert_eq!(
            store.collection(&ns).unwrap().docs[&key(1)].versions.len(),
            2
        );
        store.sweep(none);
        assert_eq!(
            store.collection(&ns).unwrap().docs[&key(1)].versions.len(),
            1
        );
    }
}
