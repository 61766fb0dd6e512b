//! In-memory collections with multi-version documents for snapshot-isolated transactions.
//!
//! Every committed write gets a commit sequence number; each document keeps the versions that
//! open transactions may still read. A transaction reads at the sequence number current when it
//! started, stages its writes privately and holds the documents it wrote until it ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bson::{Binary, Bson, Document, spec::BinarySubtype};

use crate::error::CommandError;
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
    pub versions: Vec<Version>,
    /// The transaction that has written this document and not yet ended.
    pub held_by: Option<u64>,
}

impl DocEntry {
    pub fn latest(&self) -> Option<&Arc<Document>> {
        self.versions.last().and_then(|v| v.doc.as_ref())
    }

    pub fn latest_seq(&self) -> u64 {
        self.versions.last().map(|v| v.seq).unwrap_or(0)
    }

    pub fn at(&self, snapshot: u64) -> Option<&Arc<Document>> {
        self.versions
            .iter()
            .rev()
            .find(|v| v.seq <= snapshot)
            .and_then(|v| v.doc.as_ref())
    }

    /// Drops versions no open snapshot can read.
    fn prune(&mut self, min_snapshot: u64) {
        let keep_from = self
            .versions
            .iter()
            .rposition(|v| v.seq <= min_snapshot)
            .unwrap_or(0);
        if keep_from > 0 {
            self.versions.drain(..keep_from);
        }
    }

    /// True when the entry carries nothing anyone can see.
    fn is_dead(&self, min_snapshot: u64) -> bool {
        self.held_by.is_none()
            && match self.versions.as_slice() {
                [] => true,
                [only] => only.doc.is_none() && only.seq <= min_snapshot,
                _ => false,
            }
    }
}

#[derive(Debug)]
pub struct Collection {
    pub uuid: Binary,
    pub docs: BTreeMap<DocKey, DocEntry>,
    pub options: Document,
    /// Secondary index specifications (bookkeeping only; only `_id` is enforced).
    pub indexes: Vec<Document>,
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
            created_by: None,
            next_record: 0,
        }
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

#[derive(Debug, Default)]
pub struct Store {
    pub collections: BTreeMap<Namespace, Collection>,
    /// Sequence number of the latest commit.
    pub seq: u64,
}

impl Store {
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

    /// Candidate documents for a filter: a direct lookup when it pins `_id`, else a scan.
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
        self.scan(ns, txn)
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
                let mut events = Vec::with_capacity(changes.len());
                for c in changes {
                    let (created, pending) = self.pending_event(&c, None);
                    events.extend(created);
                    let coll = self.ensure_collection(&c.ns);
                    let entry = coll.entry_mut(c.key.clone());
                    entry.versions.push(Version { seq, doc: c.new });
                    entry.prune(min_snapshot);
                    if entry.is_dead(min_snapshot) {
                        coll.docs.remove(&c.key);
                    }
                    events.push(pending);
                }
                oplog.append(events, None);
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
        if !txn.writes.is_empty() {
            self.seq += 1;
        }
        let seq = self.seq;
        for ((ns, key), doc) in txn.writes {
            let coll = self.ensure_collection(&ns);
            let entry = coll.entry_mut(key.clone());
            entry.versions.push(Version { seq, doc });
            if entry.held_by == Some(txn.id) {
                entry.held_by = None;
            }
            entry.prune(min_snapshot);
            if entry.is_dead(min_snapshot) {
                coll.docs.remove(&key);
            }
        }
        if !txn.events.is_empty() {
            oplog.append(txn.events, Some(info));
        }
    }

    /// Releases a transaction's holds and discards its writes.
    pub fn abort(&mut self, txn: Txn, min_snapshot: u64) {
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
