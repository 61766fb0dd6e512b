//! The sharding catalog of a sharded cluster (`--shards K`): the shards, each database's
//! primary shard, the sharded collections with their shard keys and chunks, and where a
//! document lives.
//!
//! Chunks are fixed when a collection is sharded (there is no balancer and no splitting):
//!
//! - a hashed key (`{f: "hashed"}`) splits the Int64 hash space (`$toHashedIndexKey` of the
//!   value, as MongoDB hashes) into K equal ranges: shard `i` owns the hashes from
//!   `i64::MIN + i * 2^64 / K`; with two shards the negative hashes live on `shard0`;
//! - a ranged key (`{f: 1}`) splits at the values `0, 100, 200, ...`: `shard0` owns
//!   `[MinKey, 0)`, `shard1` `[0, 100)`, ..., the last shard everything from `100 * (K - 2)` to
//!   `MaxKey` (values compare in BSON order, so strings, documents, ObjectIds ... fall in the
//!   last chunk and `null` in the first).
//!
//! Only the first field of a compound shard key decides the chunk; a missing field counts as
//! `null`. Unsharded collections live on their database's primary shard (`shard0` unless
//! `enableSharding` named another).

use std::collections::BTreeMap;

use bson::{Binary, Bson, DateTime, Document, Timestamp, doc, oid::ObjectId};

use crate::error::{CmdResult, CommandError};
use crate::namespace::Namespace;
use crate::values::{cmp_values, get_path};

/// How the first shard-key field maps documents to chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Ranged,
    Hashed,
}

/// One chunk: `[min, max)` of the first shard-key field (of its hash for a hashed key).
#[derive(Debug, Clone)]
pub struct Chunk {
    pub id: ObjectId,
    pub min: Bson,
    pub max: Bson,
    pub shard: usize,
}

/// A sharded collection.
#[derive(Debug, Clone)]
pub struct ShardedCollection {
    pub key: Document,
    pub kind: KeyKind,
    pub uuid: Option<Binary>,
    pub epoch: ObjectId,
    pub created: DateTime,
    pub chunks: Vec<Chunk>,
}

impl ShardedCollection {
    fn first_field(&self) -> &str {
        self.key.keys().next().map(String::as_str).unwrap_or("_id")
    }

    /// The chunk value of a document: its first shard-key field (hashed for a hashed key).
    fn routing_value(&self, doc: &Document) -> Bson {
        let v = get_path(doc, self.first_field())
            .cloned()
            .unwrap_or(Bson::Null);
        match self.kind {
            KeyKind::Ranged => v,
            KeyKind::Hashed => Bson::Int64(crate::expression::hashed_index_key(&v, 0)),
        }
    }

    fn shard_of(&self, doc: &Document) -> usize {
        let v = self.routing_value(doc);
        self.chunks
            .iter()
            .rev()
            .find(|c| {
                matches!(c.min, Bson::MinKey)
                    || cmp_values(&c.min, &v) != std::cmp::Ordering::Greater
            })
            .map_or(0, |c| c.shard)
    }
}

/// The catalog a `mongos` consults. With zero shards (replica-set mode) everything is on
/// shard 0.
#[derive(Debug, Clone)]
pub struct Catalog {
    shards: usize,
    pub cluster_id: ObjectId,
    /// Databases named by `enableSharding` or `shardCollection`, with their primary shard.
    databases: BTreeMap<String, usize>,
    collections: BTreeMap<Namespace, ShardedCollection>,
}

/// A shard's name: `shard0`, `shard1`, ...
pub fn shard_name(i: usize) -> String {
    format!("shard{i}")
}

impl Catalog {
    pub fn new(shards: usize, cluster_id: ObjectId) -> Self {
        Catalog {
            shards,
            cluster_id,
            databases: BTreeMap::new(),
            collections: BTreeMap::new(),
        }
    }

    /// True in sharded-cluster mode.
    pub fn is_sharded(&self) -> bool {
        self.shards > 0
    }

    /// How many histories there are: the shards, or the one of a replica set.
    pub fn history_count(&self) -> usize {
        self.shards.max(1)
    }

    pub fn shard_count(&self) -> usize {
        self.shards
    }

    /// The shard index a name like `shard1` stands for.
    pub fn parse_shard(&self, name: &str) -> Option<usize> {
        let i: usize = name.strip_prefix("shard")?.parse().ok()?;
        (i < self.shards && shard_name(i) == name).then_some(i)
    }

    pub fn primary_of(&self, db: &str) -> usize {
        self.databases.get(db).copied().unwrap_or(0)
    }

    pub fn sharded(&self, ns: &Namespace) -> Option<&ShardedCollection> {
        self.collections.get(ns)
    }

    /// `enableSharding`: records the database with its primary shard (kept if already known).
    pub fn enable_sharding(&mut self, db: &str, primary: Option<usize>) -> CmdResult<usize> {
        match (self.databases.get(db), primary) {
            (Some(&p), Some(asked)) if p != asked => Err(CommandError::new(
                20,
                format!(
                    "database {db} already exists with primary shard {}",
                    shard_name(p)
                ),
            )),
            (Some(&p), _) => Ok(p),
            (None, asked) => {
                let p = asked.unwrap_or(0);
                self.databases.insert(db.to_string(), p);
                Ok(p)
            }
        }
    }

    /// Checks a `shardCollection` key: one or more fields, each `1` or `"hashed"`, at most
    /// one of them hashed and then first.
    pub fn parse_key(key: &Document) -> CmdResult<KeyKind> {
        if key.is_empty() {
            return Err(CommandError::bad_value("Shard key cannot be empty"));
        }
        let mut kind = KeyKind::Ranged;
        for (i, (field, v)) in key.iter().enumerate() {
            if field.is_empty() || field.starts_with('$') {
                return Err(CommandError::bad_value(format!(
                    "Shard key field name '{field}' is not valid"
                )));
            }
            match v {
                Bson::String(s) if s == "hashed" => {
                    if kind == KeyKind::Hashed || i > 0 {
                        return Err(CommandError::bad_value(
                            "This server supports a hashed field only as the first shard key field",
                        ));
                    }
                    kind = KeyKind::Hashed;
                }
                v if crate::values::as_f64(v) == Some(1.0) => {}
                other => {
                    return Err(CommandError::bad_value(format!(
                        "Shard key {{ {field}: {other} }} is not valid: values must be 1 or \"hashed\""
                    )));
                }
            }
        }
        Ok(kind)
    }

    /// `shardCollection`: shards `ns` by `key` into one chunk per shard; true when it was not
    /// sharded before. Sharding it again with the same key is accepted (false); with another
    /// key it is `AlreadyInitialized` (23).
    pub fn shard_collection(
        &mut self,
        ns: &Namespace,
        key: &Document,
        uuid: Option<Binary>,
    ) -> CmdResult<bool> {
        let kind = Self::parse_key(key)?;
        if !self.is_sharded() {
            return Err(CommandError::new(59, "no such command: 'shardCollection'"));
        }
        if let Some(existing) = self.collections.get(ns) {
            if existing.key == *key {
                return Ok(false);
            }
            return Err(CommandError::new(
                23,
                format!("sharding already enabled for collection {ns}"),
            ));
        }
        self.enable_sharding(&ns.db, None)?;
        let bounds = self.bounds(kind);
        let chunks = bounds
            .windows(2)
            .enumerate()
            .map(|(i, w)| Chunk {
                id: ObjectId::new(),
                min: w[0].clone(),
                max: w[1].clone(),
                shard: i,
            })
            .collect();
        self.collections.insert(
            ns.clone(),
            ShardedCollection {
                key: key.clone(),
                kind,
                uuid,
                epoch: ObjectId::new(),
                created: DateTime::now(),
                chunks,
            },
        );
        Ok(true)
    }

    /// The K + 1 chunk bounds, `MinKey` first and `MaxKey` last.
    fn bounds(&self, kind: KeyKind) -> Vec<Bson> {
        let k = self.shards.max(1);
        let mut bounds = vec![Bson::MinKey];
        for j in 1..k {
            bounds.push(match kind {
                KeyKind::Hashed => {
                    let b = i64::MIN as i128 + (j as i128) * (1i128 << 64) / k as i128;
                    Bson::Int64(b as i64)
                }
                KeyKind::Ranged => Bson::Int32(100 * (j as i32 - 1)),
            });
        }
        bounds.push(Bson::MaxKey);
        bounds
    }

    /// The shard owning a document of `ns`.
    pub fn shard_of(&self, ns: &Namespace, doc: &Document) -> usize {
        if !self.is_sharded() {
            return 0;
        }
        match self.collections.get(ns) {
            Some(c) => c.shard_of(doc),
            None => self.primary_of(&ns.db),
        }
    }

    /// The shards holding `ns`: all of them for a sharded collection, else its primary shard.
    pub fn owners(&self, ns: &Namespace) -> Vec<usize> {
        if !self.is_sharded() {
            return vec![0];
        }
        if self.collections.contains_key(ns) {
            (0..self.shards).collect()
        } else {
            vec![self.primary_of(&ns.db)]
        }
    }

    pub fn all_shards(&self) -> Vec<usize> {
        (0..self.history_count()).collect()
    }

    /// A change event's `documentKey` for a document of a sharded collection: the shard key
    /// fields the document has, then `_id` (unless the key holds it). `None` for an
    /// unsharded collection (`{_id}`).
    pub fn document_key(&self, ns: &Namespace, doc: &Document) -> Option<Document> {
        let c = self.collections.get(ns)?;
        let mut key = Document::new();
        for field in c.key.keys() {
            if let Some(v) = get_path(doc, field) {
                key.insert(field.clone(), v.clone());
            }
        }
        if !key.contains_key("_id")
            && let Some(id) = doc.get("_id")
        {
            key.insert("_id", id.clone());
        }
        Some(key)
    }

    /// Records the UUID of a sharded collection created after it was sharded.
    pub fn set_uuid(&mut self, ns: &Namespace, uuid: Option<Binary>) {
        if let Some(c) = self.collections.get_mut(ns) {
            c.uuid = uuid;
        }
    }

    /// A collection dropped: it is no longer sharded.
    pub fn forget(&mut self, ns: &Namespace) {
        self.collections.remove(ns);
    }

    /// A collection renamed: its sharding moves with it.
    pub fn rename(&mut self, from: &Namespace, to: &Namespace) {
        if let Some(c) = self.collections.remove(from) {
            self.collections.insert(to.clone(), c);
        } else {
            self.collections.remove(to);
        }
    }

    /// A database dropped: its collections and its primary shard are forgotten.
    pub fn drop_database(&mut self, db: &str) {
        self.collections.retain(|ns, _| ns.db != db);
        self.databases.remove(db);
    }

    /// The documents of `config.<coll>` a `mongos` shows, or `None` for a collection this
    /// server does not model. `hosts` are the shards' `name/host:port` strings.
    pub fn config_documents(&self, coll: &str, hosts: &[String]) -> Option<Vec<Document>> {
        let docs = match coll {
            "version" => vec![doc! {"_id": 1, "clusterId": self.cluster_id}],
            "shards" => self.shard_documents(hosts),
            "databases" => self
                .databases
                .iter()
                .map(|(db, p)| {
                    doc! {"_id": db.clone(), "primary": shard_name(*p), "version": {"lastMod": 1}}
                })
                .collect(),
            "collections" => self
                .collections
                .iter()
                .map(|(ns, c)| {
                    let mut d = doc! {
                        "_id": ns.to_string(),
                        "lastmodEpoch": c.epoch,
                        "lastmod": c.created,
                        "timestamp": Bson::Timestamp(Timestamp { time: (c.created.timestamp_millis() / 1000) as u32, increment: 1 }),
                    };
                    if let Some(u) = &c.uuid {
                        d.insert("uuid", Bson::Binary(u.clone()));
                    }
                    d.insert("key", c.key.clone());
                    d.insert("unique", false);
                    d.insert("noBalance", false);
                    d
                })
                .collect(),
            "chunks" => self
                .collections
                .iter()
                .flat_map(|(ns, c)| {
                    let field = c.first_field().to_string();
                    c.chunks.iter().enumerate().map(move |(i, ch)| {
                        let mut d = doc! {"_id": ch.id};
                        if let Some(u) = &c.uuid {
                            d.insert("uuid", Bson::Binary(u.clone()));
                        }
                        d.insert("ns", ns.to_string());
                        d.insert("min", doc! {field.clone(): ch.min.clone()});
                        d.insert("max", doc! {field.clone(): ch.max.clone()});
                        d.insert("shard", shard_name(ch.shard));
                        d.insert(
                            "lastmod",
                            Bson::Timestamp(Timestamp {
                                time: 1,
                                increment: i as u32,
                            }),
                        );
                        d
                    })
                })
                .collect(),
            _ => return None,
        };
        Some(docs)
    }

    /// `listShards`' documents: `{_id: "shardN", host: "shardN/host:port", state: 1}`.
    pub fn shard_documents(&self, hosts: &[String]) -> Vec<Document> {
        (0..self.shards)
            .map(|i| {
                doc! {
                    "_id": shard_name(i),
                    "host": hosts.get(i).cloned().unwrap_or_default(),
                    "state": 1,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(k: usize) -> Catalog {
        Catalog::new(k, ObjectId::new())
    }

    #[test]
    fn ranged_keys_split_at_hundreds() {
        let mut c = catalog(3);
        let ns = Namespace::new("d", "c");
        c.shard_collection(&ns, &doc! {"x": 1}, None).unwrap();
        let at = |x: Bson| c.shard_of(&ns, &doc! {"_id": 1, "x": x});
        assert_eq!(at(Bson::Int32(-5)), 0);
        assert_eq!(at(Bson::Null), 0);
        assert_eq!(c.shard_of(&ns, &doc! {"_id": 1}), 0);
        assert_eq!(at(Bson::Int32(0)), 1);
        assert_eq!(at(Bson::Double(99.5)), 1);
        assert_eq!(at(Bson::Int64(100)), 2);
        assert_eq!(at(Bson::String("a".into())), 2);
        assert_eq!(
            c.document_key(&ns, &doc! {"_id": 7, "y": 1, "x": 3}),
            Some(doc! {"x": 3, "_id": 7})
        );
        assert_eq!(
            c.document_key(&Namespace::new("d", "other"), &doc! {"_id": 1}),
            None
        );
    }

    #[test]
    fn hashed_keys_split_the_hash_space_evenly() {
        let mut c = catalog(2);
        let ns = Namespace::new("d", "h");
        c.shard_collection(&ns, &doc! {"_id": "hashed"}, None)
            .unwrap();
        for i in 0..50 {
            let h = crate::expression::hashed_index_key(&Bson::Int32(i), 0);
            let expected = usize::from(h >= 0);
            assert_eq!(c.shard_of(&ns, &doc! {"_id": i}), expected);
        }
        assert_eq!(
            c.document_key(&ns, &doc! {"_id": 1, "a": 2}),
            Some(doc! {"_id": 1})
        );
        // Same key again is fine (and changes nothing), another key is not.
        assert!(
            !c.shard_collection(&ns, &doc! {"_id": "hashed"}, None)
                .unwrap()
        );
        let _ = c
            .shard_collection(&ns, &doc! {"_id": "hashed"}, None)
            .unwrap();
        let err = c.shard_collection(&ns, &doc! {"a": 1}, None).unwrap_err();
        assert_eq!(err.code, 23);
    }

    #[test]
    fn bad_keys_are_refused() {
        for key in [
            doc! {},
            doc! {"a": -1},
            doc! {"a": 1, "b": "hashed"},
            doc! {"a": "x"},
        ] {
            assert!(Catalog::parse_key(&key).is_err(), "{key}");
        }
    }

    #[test]
    fn unsharded_collections_follow_their_primary() {
        let mut c = catalog(2);
        assert_eq!(c.enable_sharding("d", Some(1)).unwrap(), 1);
        let ns = Namespace::new("d", "plain");
        assert_eq!(c.shard_of(&ns, &doc! {"_id": 1}), 1);
        assert_eq!(c.owners(&ns), vec![1]);
        assert_eq!(c.enable_sharding("d", Some(0)).unwrap_err().code, 20);
        assert_eq!(c.parse_shard("shard1"), Some(1));
        assert_eq!(c.parse_shard("shard2"), None);
        assert_eq!(c.parse_shard("shard01"), None);
    }
}
