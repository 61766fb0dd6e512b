//! The bounded change history and resume-token encoding.
//!
//! A token's `_data` is uppercase hex of: `82`, the 8-byte big-endian cluster timestamp
//! (seconds, increment), `01` (format version), the 4-byte big-endian index of the operation
//! inside its transaction, and a kind byte (`00` event, `01` invalidate, `02` high-water mark).
//! A fragment of a split event (`$changeStreamSplitLargeEvent`) appends its 4-byte big-endian
//! fragment index, so its token orders after the event's own position and before the next
//! fragment's. Hex order therefore equals stream order.

use std::collections::VecDeque;
use std::sync::Arc;

use bson::{Binary, Bson, DateTime, Document, Timestamp, doc};

use crate::cluster::Catalog;
use crate::namespace::Namespace;

pub const KIND_EVENT: u8 = 0;
pub const KIND_INVALIDATE: u8 = 1;
pub const KIND_HIGH_WATER: u8 = 2;

/// A position in the change history; ordered like the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenKey {
    pub time: u32,
    pub increment: u32,
    pub op_index: u32,
    pub kind: u8,
    /// The fragment of a split event (0-based), if the token is a fragment's.
    pub fragment: Option<u32>,
}

impl TokenKey {
    pub fn new(ts: Timestamp, op_index: u32, kind: u8) -> Self {
        TokenKey {
            time: ts.time,
            increment: ts.increment,
            op_index,
            kind,
            fragment: None,
        }
    }

    /// The token of fragment `n` of the event at this position.
    pub fn with_fragment(self, n: u32) -> Self {
        TokenKey {
            fragment: Some(n),
            ..self
        }
    }

    /// The event's own position, without a fragment.
    pub fn without_fragment(self) -> Self {
        TokenKey {
            fragment: None,
            ..self
        }
    }

    /// The high-water mark covering everything up to and including `ts`.
    pub fn high_water(ts: Timestamp) -> Self {
        TokenKey::new(ts, u32::MAX, KIND_HIGH_WATER)
    }

    pub fn timestamp(&self) -> Timestamp {
        Timestamp {
            time: self.time,
            increment: self.increment,
        }
    }

    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(15);
        bytes.push(0x82);
        bytes.extend_from_slice(&self.time.to_be_bytes());
        bytes.extend_from_slice(&self.increment.to_be_bytes());
        bytes.push(0x01);
        bytes.extend_from_slice(&self.op_index.to_be_bytes());
        bytes.push(self.kind);
        if let Some(n) = self.fragment {
            bytes.extend_from_slice(&n.to_be_bytes());
        }
        bytes.iter().map(|b| format!("{b:02X}")).collect()
    }

    /// Parses a token's `_data`. Besides this server's own format, any KeyString token with the
    /// `82` + timestamp prefix (as a real server writes) is read as "everything at that time".
    pub fn decode(hex: &str) -> Option<TokenKey> {
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Self::decode_own(hex).or_else(|| Self::decode_foreign(hex))
    }

    fn decode_own(hex: &str) -> Option<TokenKey> {
        if hex.len() != 30 && hex.len() != 38 {
            return None;
        }
        let mut bytes = [0u8; 19];
        let bytes = &mut bytes[..hex.len() / 2];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        if bytes[0] != 0x82 || bytes[9] != 0x01 || bytes[14] > KIND_HIGH_WATER {
            return None;
        }
        let u = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let fragment = (bytes.len() == 19).then(|| u(15));
        if fragment.is_some() && bytes[14] != KIND_EVENT {
            return None;
        }
        Some(TokenKey {
            time: u(1),
            increment: u(5),
            op_index: u(10),
            kind: bytes[14],
            fragment,
        })
    }

    fn decode_foreign(hex: &str) -> Option<TokenKey> {
        if hex.len() < 18 || !hex.len().is_multiple_of(2) {
            return None;
        }
        if !hex.starts_with("82") {
            return None;
        }
        let time = u32::from_str_radix(hex.get(2..10)?, 16).ok()?;
        let increment = u32::from_str_radix(hex.get(10..18)?, 16).ok()?;
        Some(TokenKey::high_water(Timestamp { time, increment }))
    }

    pub fn to_document(&self) -> Document {
        doc! { "_data": self.encode() }
    }

    /// Parses a resume token document `{_data: "..."}`.
    pub fn from_document(d: &Document) -> Option<TokenKey> {
        match d.get("_data") {
            Some(Bson::String(s)) => TokenKey::decode(s),
            _ => None,
        }
    }
}

/// What happened, as recorded in the history.
#[derive(Debug, Clone)]
pub enum EventKind {
    Insert {
        id: Bson,
        doc: Arc<Document>,
    },
    Update {
        id: Bson,
        updated: Document,
        removed: Vec<String>,
        /// Arrays a pipeline-style update shortened: `{field, newSize}`.
        truncated: Vec<Document>,
        /// `updateDescription.disambiguatedPaths`: the paths above (and of the shortened
        /// arrays) with a field name that holds dots or is numeric, as their components (array
        /// indexes as integers).
        disambiguated: Document,
    },
    Replace {
        id: Bson,
        doc: Arc<Document>,
    },
    Delete {
        id: Bson,
    },
    Drop,
    Rename {
        to: Namespace,
        /// The UUID of the collection the rename replaced (`dropTarget`).
        drop_target: Option<Binary>,
    },
    DropDatabase,
    /// A collection created (explicitly or by a first write); `description` is what
    /// `operationDescription` shows: its options and `idIndex`.
    Create {
        description: Document,
    },
    CreateIndexes {
        indexes: Vec<Document>,
    },
    DropIndexes {
        indexes: Vec<Document>,
    },
    /// `collMod`: what it changed, and the collection's options before.
    Modify {
        description: Document,
        options_before: Document,
    },
    /// `shardCollection` (sharded mode): `{shardKey, unique, presplitHashedZones}`.
    ShardCollection {
        description: Document,
    },
}

impl EventKind {
    pub fn operation_type(&self) -> &'static str {
        match self {
            EventKind::Insert { .. } => "insert",
            EventKind::Update { .. } => "update",
            EventKind::Replace { .. } => "replace",
            EventKind::Delete { .. } => "delete",
            EventKind::Drop => "drop",
            EventKind::Rename { .. } => "rename",
            EventKind::DropDatabase => "dropDatabase",
            EventKind::Create { .. } => "create",
            EventKind::CreateIndexes { .. } => "createIndexes",
            EventKind::DropIndexes { .. } => "dropIndexes",
            EventKind::Modify { .. } => "modify",
            EventKind::ShardCollection { .. } => "shardCollection",
        }
    }

    /// Events a change stream reports only with `showExpandedEvents`.
    pub fn is_expanded_only(&self) -> bool {
        matches!(
            self,
            EventKind::Create { .. }
                | EventKind::CreateIndexes { .. }
                | EventKind::DropIndexes { .. }
                | EventKind::Modify { .. }
                | EventKind::ShardCollection { .. }
        )
    }
}

/// The documents kept for an update, replace or delete on a collection with
/// `changeStreamPreAndPostImages` enabled: the document before the write and, for an update,
/// after it. They live (and expire) with their event.
#[derive(Debug, Clone, Default)]
pub struct Images {
    pub pre: Option<Arc<Document>>,
    pub post: Option<Arc<Document>>,
}

/// The session and transaction a write belonged to.
#[derive(Debug, Clone)]
pub struct TxnInfo {
    pub lsid: Document,
    pub txn_number: i64,
}

#[derive(Debug, Clone)]
pub struct OplogEntry {
    pub ts: Timestamp,
    pub op_index: u32,
    pub wall: DateTime,
    pub ns: Namespace,
    pub kind: EventKind,
    pub txn: Option<Arc<TxnInfo>>,
    /// The collection's UUID (`collectionUUID`), when the event concerns one.
    pub uuid: Option<Binary>,
    pub images: Option<Images>,
    /// `documentKey` of an event on a sharded collection (shard key fields and `_id`);
    /// `None` means `{_id}`.
    pub document_key: Option<Document>,
}

impl OplogEntry {
    pub fn key(&self) -> TokenKey {
        TokenKey::new(self.ts, self.op_index, KIND_EVENT)
    }
}

/// A write waiting to be appended (the timestamp is assigned at append).
#[derive(Debug, Clone)]
pub struct PendingEvent {
    pub ns: Namespace,
    pub kind: EventKind,
    pub uuid: Option<Binary>,
    pub images: Option<Images>,
    /// The document the event concerns (after the write, or before a delete): which shard
    /// owns it and its `documentKey` follow from it.
    pub doc: Option<Arc<Document>>,
}

impl PendingEvent {
    pub fn new(ns: Namespace, kind: EventKind, uuid: Option<Binary>) -> Self {
        PendingEvent {
            ns,
            kind,
            uuid,
            images: None,
            doc: None,
        }
    }
}

/// One shard's bounded, ordered change history (a replica set has one).
#[derive(Debug)]
pub struct ShardLog {
    entries: VecDeque<OplogEntry>,
    limit: usize,
    /// Key of the newest entry dropped for space; resuming before it is history loss.
    evicted_upto: Option<TokenKey>,
    /// The time this shard has applied up to: its last write, or its last no-op.
    applied: Timestamp,
    /// `applied` when the periodic no-op writer last looked.
    checked: Timestamp,
    /// When the shard (or replica set) was initiated: the first entry of its oplog.
    started: Timestamp,
}

impl ShardLog {
    fn new(limit: usize, start: Timestamp) -> Self {
        ShardLog {
            entries: VecDeque::new(),
            limit: limit.max(1),
            evicted_upto: None,
            applied: start,
            checked: start,
            started: start,
        }
    }

    /// When the shard (or replica set) was initiated.
    pub fn started(&self) -> Timestamp {
        self.started
    }

    /// The time this shard has applied up to (its last write or no-op).
    pub fn applied(&self) -> Timestamp {
        self.applied
    }

    fn push(&mut self, entry: OplogEntry) {
        self.entries.push_back(entry);
    }

    fn evict(&mut self) {
        while self.entries.len() > self.limit {
            if let Some(e) = self.entries.pop_front() {
                self.evicted_upto = Some(e.key());
            }
        }
    }

    /// True when events after `after` may already have been dropped.
    pub fn lost_after(&self, after: TokenKey) -> bool {
        self.evicted_upto.is_some_and(|ev| after < ev)
    }

    /// True when events at or after `ts` may already have been dropped.
    pub fn lost_from(&self, ts: Timestamp) -> bool {
        self.evicted_upto
            .is_some_and(|ev| (ts.time, ts.increment) <= (ev.time, ev.increment))
    }

    /// Index of the first entry whose key is greater than `after`.
    pub fn index_after(&self, after: TokenKey) -> usize {
        self.entries.partition_point(|e| e.key() <= after)
    }

    /// Index of the first entry whose cluster time is at or after `ts` (`inclusive`) or after
    /// it.
    pub fn index_of_time(&self, ts: Timestamp, inclusive: bool) -> usize {
        let key = (ts.time, ts.increment);
        self.entries.partition_point(|e| {
            let t = (e.ts.time, e.ts.increment);
            if inclusive { t < key } else { t <= key }
        })
    }

    pub fn get(&self, index: usize) -> Option<&OplogEntry> {
        self.entries.get(index)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The cluster times of the oldest and newest retained entries.
    pub fn window(&self) -> Option<(Timestamp, Timestamp)> {
        Some((self.entries.front()?.ts, self.entries.back()?.ts))
    }
}

/// The change history: one [`ShardLog`] per shard (one for a replica set), the cluster clock
/// that times every write, and the sharding catalog that routes each event to the shards
/// owning it.
#[derive(Debug)]
pub struct Oplog {
    shards: Vec<ShardLog>,
    cluster_time: Timestamp,
    pub catalog: Catalog,
}

impl Oplog {
    /// A replica set's history.
    pub fn new(limit: usize) -> Self {
        Self::with_catalog(limit, Catalog::new(0, bson::oid::ObjectId::new()))
    }

    /// One history of `limit` entries per shard of the catalog.
    pub fn with_catalog(limit: usize, catalog: Catalog) -> Self {
        let cluster_time = Timestamp {
            time: now_secs(),
            increment: 0,
        };
        Oplog {
            shards: (0..catalog.history_count())
                .map(|_| ShardLog::new(limit, cluster_time))
                .collect(),
            cluster_time,
            catalog,
        }
    }

    /// The latest cluster time handed out.
    pub fn cluster_time(&self) -> Timestamp {
        self.cluster_time
    }

    /// Advances the cluster clock and returns the new time.
    pub fn tick(&mut self) -> Timestamp {
        let now = now_secs();
        self.cluster_time = if now > self.cluster_time.time {
            Timestamp {
                time: now,
                increment: 1,
            }
        } else {
            Timestamp {
                time: self.cluster_time.time,
                increment: self.cluster_time.increment.saturating_add(1),
            }
        };
        if !self.catalog.is_sharded()
            && let Some(only) = self.shards.first_mut()
        {
            only.applied = self.cluster_time;
        }
        self.cluster_time
    }

    /// The shards an event is recorded on: a document's owner, every shard holding a
    /// collection for its DDL, every shard for `dropDatabase`.
    fn route(&self, ev: &PendingEvent) -> Vec<usize> {
        match (&ev.kind, &ev.doc) {
            (EventKind::DropDatabase, _) => self.catalog.all_shards(),
            // Reported by the database's primary shard, as MongoDB does.
            (EventKind::ShardCollection { .. }, _) => vec![self.catalog.primary_of(&ev.ns.db)],
            (
                EventKind::Insert { .. }
                | EventKind::Update { .. }
                | EventKind::Replace { .. }
                | EventKind::Delete { .. },
                Some(doc),
            ) => vec![self.catalog.shard_of(&ev.ns, doc)],
            _ => self.catalog.owners(&ev.ns),
        }
    }

    /// Appends the events of one write (or one transaction) under one new cluster time, each
    /// on the shards owning it (a transaction's on every participant, at the same time). Each
    /// event keeps its index in the write, so the merged stream shows a transaction in
    /// statement order.
    pub fn append(&mut self, events: Vec<PendingEvent>, txn: Option<TxnInfo>) -> Timestamp {
        let ts = self.tick();
        let wall = DateTime::now();
        let txn = txn.map(Arc::new);
        let mut touched = vec![false; self.shards.len()];
        for (i, ev) in events.into_iter().enumerate() {
            let targets = self.route(&ev);
            let document_key = ev
                .doc
                .as_ref()
                .and_then(|d| self.catalog.document_key(&ev.ns, d));
            match &ev.kind {
                EventKind::Drop => self.catalog.forget(&ev.ns),
                EventKind::Rename { to, .. } => self.catalog.rename(&ev.ns, to),
                EventKind::DropDatabase => self.catalog.drop_database(&ev.ns.db),
                _ => {}
            }
            let entry = OplogEntry {
                ts,
                op_index: i as u32,
                wall,
                ns: ev.ns,
                kind: ev.kind,
                txn: txn.clone(),
                uuid: ev.uuid,
                images: ev.images,
                document_key,
            };
            for t in targets {
                if let (Some(shard), Some(flag)) = (self.shards.get_mut(t), touched.get_mut(t)) {
                    shard.push(entry.clone());
                    *flag = true;
                }
            }
        }
        for (shard, touched) in self.shards.iter_mut().zip(touched) {
            if touched {
                shard.applied = ts;
                shard.evict();
            }
        }
        ts
    }

    /// The periodic no-op writer: every shard that has applied nothing since the last call
    /// writes a no-op, advancing its applied time to a new cluster time (MongoDB's
    /// `periodicNoopIntervalSecs`). Returns true if any shard advanced. No-ops are not
    /// retained as history entries. A replica set has none (its applied time is the cluster
    /// time).
    pub fn write_noops(&mut self) -> bool {
        if !self.catalog.is_sharded() {
            return false;
        }
        let mut advanced = false;
        for i in 0..self.shards.len() {
            if self.shards[i].applied == self.shards[i].checked {
                let ts = self.tick();
                self.shards[i].applied = ts;
                advanced = true;
            }
            self.shards[i].checked = self.shards[i].applied;
        }
        advanced
    }

    /// The newest time a change stream may report up to: the cluster time on a replica set;
    /// on a sharded cluster the oldest of the shards' applied times (an event on one shard
    /// waits until every other shard has applied past it).
    pub fn visible_time(&self) -> Timestamp {
        if !self.catalog.is_sharded() {
            return self.cluster_time;
        }
        self.shards
            .iter()
            .map(|s| s.applied)
            .min_by_key(|t| (t.time, t.increment))
            .unwrap_or(self.cluster_time)
    }

    /// True when events after `after` may already have been dropped from any shard.
    pub fn lost_after(&self, after: TokenKey) -> bool {
        self.shards.iter().any(|s| s.lost_after(after))
    }

    /// True when events at or after `ts` may already have been dropped from any shard.
    pub fn lost_from(&self, ts: Timestamp) -> bool {
        self.shards.iter().any(|s| s.lost_from(ts))
    }

    /// The first event after `after` in the merged history of all shards, if its time is at
    /// or before `upto` (an event recorded on several shards counts once).
    pub fn next_after(&self, after: TokenKey, upto: Timestamp) -> Option<&OplogEntry> {
        let next = self
            .shards
            .iter()
            .filter_map(|s| s.get(s.index_after(after)))
            .min_by_key(|e| e.key())?;
        ((next.ts.time, next.ts.increment) <= (upto.time, upto.increment)).then_some(next)
    }

    /// The event at exactly `key`, on whichever shard holds it.
    pub fn entry(&self, key: TokenKey) -> Option<&OplogEntry> {
        let key = key.without_fragment();
        self.shards.iter().find_map(|s| {
            s.index_after(key)
                .checked_sub(1)
                .and_then(|i| s.get(i))
                .filter(|e| e.key() == key)
        })
    }

    /// Shard `i`'s history (0 on a replica set).
    pub fn shard(&self, i: usize) -> Option<&ShardLog> {
        self.shards.get(i)
    }

    /// The first history: a replica set's only one.
    pub fn first(&self) -> &ShardLog {
        &self.shards[0]
    }

    /// Index of the first entry of the first history whose key is greater than `after`.
    pub fn index_after(&self, after: TokenKey) -> usize {
        self.first().index_after(after)
    }

    /// Entry `index` of the first history.
    pub fn get(&self, index: usize) -> Option<&OplogEntry> {
        self.first().get(index)
    }

    /// Entries retained over all shards (an event on several shards counts on each).
    pub fn len(&self) -> usize {
        self.shards.iter().map(ShardLog::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(ShardLog::is_empty)
    }

    pub fn set_limit(&mut self, limit: usize) {
        for s in &mut self.shards {
            s.limit = limit.max(1);
        }
    }
}

fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trip_and_order() {
        let a = TokenKey::new(
            Timestamp {
                time: 100,
                increment: 2,
            },
            0,
            KIND_EVENT,
        );
        let b = TokenKey::new(
            Timestamp {
                time: 100,
                increment: 2,
            },
            0,
            KIND_INVALIDATE,
        );
        let c = TokenKey::new(
            Timestamp {
                time: 100,
                increment: 3,
            },
            0,
            KIND_EVENT,
        );
        let h = TokenKey::high_water(Timestamp {
            time: 100,
            increment: 2,
        });
        for k in [a, b, c, h] {
            assert_eq!(TokenKey::decode(&k.encode()), Some(k));
            assert!(k.encode().starts_with("82"));
        }
        let mut keys = [c, h, b, a];
        keys.sort();
        let mut hex: Vec<String> = [c, h, b, a].iter().map(|k| k.encode()).collect();
        hex.sort();
        assert_eq!(hex, keys.iter().map(|k| k.encode()).collect::<Vec<_>>());
        assert_eq!(keys, [a, b, h, c]);
        // Fragments order after their event and before whatever follows it.
        let f0 = a.with_fragment(0);
        let f1 = a.with_fragment(1);
        for k in [f0, f1] {
            assert_eq!(TokenKey::decode(&k.encode()), Some(k));
        }
        assert!(a < f0 && f0 < f1 && f1 < b);
        assert!(a.encode() < f0.encode() && f0.encode() < f1.encode() && f1.encode() < b.encode());
        assert_eq!(f1.without_fragment(), a);
    }

    #[test]
    fn foreign_tokens_keep_their_time() {
        let real = "82635019A0000000012B042C0100296E5A1004AB1154ACACD849A48C61756D70D3B21F463C6F7065726174696F6E54797065003C696E736572740046646F63756D656E744B65790046645F69640064635019A078BE67426D7CF4D2000004";
        let k = TokenKey::decode(real).unwrap();
        assert_eq!(
            k.timestamp(),
            Timestamp {
                time: 0x635019A0,
                increment: 1
            }
        );
        assert_eq!(
            TokenKey::decode("8263515EAC000000022B0429296E1404")
                .unwrap()
                .increment,
            2
        );
        assert!(TokenKey::decode("zz").is_none());
        assert!(TokenKey::decode("01635019A000000001").is_none());
    }

    fn insert(ns: &Namespace, id: i32, x: i32) -> PendingEvent {
        let doc = Arc::new(doc! {"_id": id, "x": x});
        let mut ev = PendingEvent::new(
            ns.clone(),
            EventKind::Insert {
                id: Bson::Int32(id),
                doc: doc.clone(),
            },
            None,
        );
        ev.doc = Some(doc);
        ev
    }

    fn later(a: Timestamp, b: Timestamp) -> bool {
        (a.time, a.increment) > (b.time, b.increment)
    }

    #[test]
    fn shards_keep_their_own_history_and_merge_in_token_order() {
        let ns = Namespace::new("d", "c");
        let mut catalog = Catalog::new(2, bson::oid::ObjectId::new());
        catalog.shard_collection(&ns, &doc! {"x": 1}, None).unwrap();
        let mut log = Oplog::with_catalog(2, catalog);
        let start = TokenKey::high_water(log.cluster_time());
        let t1 = log.append(vec![insert(&ns, 1, -1)], None); // shard0
        // shard1 has applied nothing since: the event is not reportable yet.
        assert!(later(t1, log.visible_time()));
        assert!(log.next_after(start, log.visible_time()).is_none());
        let t2 = log.append(vec![insert(&ns, 2, 5)], None); // shard1
        assert_eq!(log.visible_time(), t1);
        let first = log.next_after(start, log.visible_time()).cloned().unwrap();
        assert_eq!(first.ts, t1);
        assert_eq!(first.document_key, Some(doc! {"x": -1, "_id": 1}));
        assert!(log.next_after(first.key(), log.visible_time()).is_none());
        // The no-op writer advances only shards that applied nothing since its last round.
        assert!(!log.write_noops(), "both shards wrote since the last round");
        assert_eq!(log.visible_time(), t1);
        assert!(log.write_noops());
        assert!(later(log.visible_time(), t2));
        let second = log
            .next_after(first.key(), log.visible_time())
            .cloned()
            .unwrap();
        assert_eq!(second.ts, t2);
        // A drop of the sharded collection is on both shards and merges once.
        let t3 = log.append(
            vec![PendingEvent::new(ns.clone(), EventKind::Drop, None)],
            None,
        );
        assert_eq!(log.shard(0).unwrap().len(), 2);
        assert_eq!(log.shard(1).unwrap().len(), 2);
        let drop = log.next_after(second.key(), t3).cloned().unwrap();
        assert!(matches!(drop.kind, EventKind::Drop));
        assert!(log.next_after(drop.key(), t3).is_none());
        assert!(log.catalog.sharded(&ns).is_none());
        // Unsharded now: everything goes to the primary shard, which alone evicts.
        for i in 10..13 {
            log.append(vec![insert(&ns, i, 5)], None);
        }
        assert_eq!(log.shard(1).unwrap().len(), 2);
        assert!(log.shard(0).unwrap().lost_after(first.key()));
        assert!(!log.shard(1).unwrap().lost_after(first.key()));
        assert!(log.lost_after(first.key()));
        assert!(log.lost_from(t1));
    }

    #[test]
    fn eviction_marks_history_lost() {
        let ns = Namespace::new("d", "c");
        let mut log = Oplog::new(2);
        let start = TokenKey::high_water(log.cluster_time());
        for i in 0..3 {
            log.append(
                vec![PendingEvent::new(
                    ns.clone(),
                    EventKind::Delete { id: Bson::Int32(i) },
                    None,
                )],
                None,
            );
        }
        assert_eq!(log.len(), 2);
        assert!(log.lost_after(start));
        let last = log.get(1).map(|e| e.key()).unwrap();
        assert!(!log.lost_after(last));
    }
}
