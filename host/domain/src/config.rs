//! What shapes a consumer's change stream beyond the baseline (scope, pipeline, pre- and
//! post-images), checked before anything is written, and bound to the checkpoint so that a run
//! with another shape cannot silently continue a consumer.
//!
//! The checkpoint records the configuration (`config`) and its digest (`configDigest`); a
//! checkpoint without them (created by the baseline task) has the baseline's configuration.

use bson::{Bson, Document, doc};
use sha2::{Digest, Sha256};

use super::state::{REGISTRY, StateCollections};

mod pipeline;
pub use pipeline::{
    ALLOWED_STAGES, MAX_PIPELINE_BYTES, MAX_STAGES, check_keeps_namespace, parse_pipeline,
};

/// What the stream watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One collection (the baseline).
    Collection,
    /// Every collection of one database.
    Database,
    /// Every database of the deployment but `admin`, `config` and `local`.
    Deployment,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Collection => "collection",
            Scope::Database => "database",
            Scope::Deployment => "deployment",
        }
    }

    /// What a checkpoint of this scope records as `source`: `db.coll`, `db`, or
    /// [`DEPLOYMENT_SOURCE`].
    pub fn source(self, database: &str, collection: &str) -> String {
        match self {
            Scope::Collection => format!("{database}.{collection}"),
            Scope::Database => database.to_string(),
            Scope::Deployment => DEPLOYMENT_SOURCE.to_string(),
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        match name {
            "collection" => Some(Scope::Collection),
            "database" => Some(Scope::Database),
            "deployment" => Some(Scope::Deployment),
            _ => None,
        }
    }
}

/// What a consumer watches, as its command line names it (`--scope`, `--database`,
/// `--collection`; the collection means nothing to a wider scope).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    pub scope: Scope,
    pub database: String,
    pub collection: String,
}

impl Watched {
    /// The checkpoint's `source` for it.
    pub fn source(&self) -> String {
        self.scope.source(&self.database, &self.collection)
    }
}

/// The checkpoint's `source` for a deployment-wide stream (no database name can be this).
pub const DEPLOYMENT_SOURCE: &str = "*";

/// `fullDocument`: what an update event carries of the document after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullDocument {
    /// Nothing for updates (the server's default).
    Default,
    /// The document as it is when the event is read (the baseline).
    UpdateLookup,
    /// The post-image stored with the change, `null` when there is none.
    WhenAvailable,
    /// The post-image stored with the change; the stream fails when there is none.
    Required,
}

impl FullDocument {
    pub fn as_str(self) -> &'static str {
        match self {
            FullDocument::Default => "default",
            FullDocument::UpdateLookup => "updateLookup",
            FullDocument::WhenAvailable => "whenAvailable",
            FullDocument::Required => "required",
        }
    }

    pub fn parse(name: &str) -> Option<FullDocument> {
        match name {
            "default" => Some(FullDocument::Default),
            "updateLookup" => Some(FullDocument::UpdateLookup),
            "whenAvailable" => Some(FullDocument::WhenAvailable),
            "required" => Some(FullDocument::Required),
            _ => None,
        }
    }
}

/// `fullDocumentBeforeChange`: the pre-image of updates, replacements and deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeforeChange {
    Off,
    WhenAvailable,
    Required,
}

impl BeforeChange {
    pub fn as_str(self) -> &'static str {
        match self {
            BeforeChange::Off => "off",
            BeforeChange::WhenAvailable => "whenAvailable",
            BeforeChange::Required => "required",
        }
    }

    pub fn parse(name: &str) -> Option<BeforeChange> {
        match name {
            "off" => Some(BeforeChange::Off),
            "whenAvailable" => Some(BeforeChange::WhenAvailable),
            "required" => Some(BeforeChange::Required),
            _ => None,
        }
    }
}

/// One of `count` runs sharing a source: it hands off the events whose document key hashes to
/// `index` (`$toHashedIndexKey`, MongoDB's hashed-index function, evaluated by the server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub index: u32,
    pub count: u32,
}

/// The most partitions a source may be shared by.
pub const MAX_PARTITIONS: u32 = 1024;

impl Partition {
    /// `I/N` with `0 <= I < N <= 1024`; `0/1` is the whole stream (`None`).
    pub fn parse(text: &str) -> Result<Option<Partition>, String> {
        let parsed = text.split_once('/').and_then(|(i, n)| {
            Some((i.trim().parse::<u32>().ok()?, n.trim().parse::<u32>().ok()?))
        });
        match parsed {
            Some((0, 1)) => Ok(None),
            Some((index, count)) if index < count && count <= MAX_PARTITIONS => {
                Ok(Some(Partition { index, count }))
            }
            _ => Err(format!(
                "a partition is I/N with 0 <= I < N <= {MAX_PARTITIONS} (e.g. 0/4), not {:?}",
                super::text::escape_untrusted(text, 40)
            )),
        }
    }

    /// The `$match` that keeps this partition's events (and every invalidation, which each
    /// partition needs to continue): the document key's hashed-index value, taken modulo `count`
    /// into `0..count`, equals `index`. An event without a document key (a collection dropped or
    /// renamed) hashes as null: exactly one partition hands it off.
    pub fn stage(&self) -> Document {
        self.stage_passing(&[doc! { "operationType": "invalidate" }])
    }

    /// [`Partition::stage`], letting through every event one of `passes` matches.
    fn stage_passing(&self, passes: &[Document]) -> Document {
        let count = i64::from(self.count);
        let hash = doc! { "$toHashedIndexKey": { "$ifNull": ["$documentKey._id", null] } };
        let bucket = doc! {
            "$mod": [ { "$add": [ { "$mod": [hash, count] }, count ] }, count ]
        };
        let mut clauses: Vec<Bson> = passes.iter().cloned().map(Bson::Document).collect();
        clauses.push(Bson::Document(
            doc! { "$expr": { "$eq": [bucket, i64::from(self.index)] } },
        ));
        doc! { "$match": { "$or": clauses } }
    }

    /// The partition a hashed-index value falls in.
    pub fn of_hash(hash: i64, count: u32) -> u32 {
        hash.rem_euclid(i64::from(count)) as u32
    }
}

/// A stream's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamConfig {
    pub scope: Scope,
    pub full_document: FullDocument,
    pub before_change: BeforeChange,
    /// The user's stages, after the host's own (see [`StreamConfig::stages`]).
    pub pipeline: Vec<Document>,
    /// This run's share of a source split between several consumers.
    pub partition: Option<Partition>,
    /// Events over 16 MiB arrive as fragments (`$changeStreamSplitLargeEvent`).
    pub split_large_events: bool,
}

impl Default for StreamConfig {
    /// The baseline's stream: one collection, `updateLookup`, no pipeline.
    fn default() -> Self {
        StreamConfig {
            scope: Scope::Collection,
            full_document: FullDocument::UpdateLookup,
            before_change: BeforeChange::Off,
            pipeline: Vec::new(),
            partition: None,
            split_large_events: false,
        }
    }
}

/// Why a stored configuration could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the checkpoint's stream configuration is malformed: {0}")]
pub struct MalformedConfig(pub String);

impl StreamConfig {
    /// What the checkpoint records as `source`: `db.coll`, `db`, or [`DEPLOYMENT_SOURCE`].
    pub fn source(&self, database: &str, collection: &str) -> String {
        self.scope.source(database, collection)
    }

    /// The stages the stream is opened with: for a database or deployment stream, first a
    /// `$match` that leaves out every state collection `state` knows of (the consumer's own
    /// commits would otherwise come back as events, without end, and other consumers' records
    /// would be handed off), then the user's pipeline, each filter letting through
    /// invalidations and, for a wide stream, the events of the state registries (the host
    /// needs them to recognise state collections registered while the stream runs).
    pub fn stages(&self, state: &StateCollections) -> Vec<Document> {
        let wide = self.scope != Scope::Collection;
        let mut stages = Vec::with_capacity(self.pipeline.len() + 3);
        let mut passes = vec![doc! { "operationType": "invalidate" }];
        // Whether an event is one of those, as an expression (for `$redact`).
        let mut passes_expression = doc! { "$eq": ["$operationType", "invalidate"] };
        if wide {
            stages.push(doc! { "$match": { "$nor": state.clauses() } });
            passes.push(doc! { "ns.coll": REGISTRY });
            passes_expression = doc! { "$or": [
                passes_expression,
                { "$eq": ["$$ROOT.ns.coll", REGISTRY] },
            ] };
        }
        if let Some(partition) = &self.partition {
            stages.push(partition.stage_passing(&passes));
        }
        // An invalidation must reach the host whatever the stages: without it the consumer
        // would lose the `startAfter` position that lets the next run continue.
        stages.extend(self.pipeline.iter().map(|stage| {
            if let Some(filter) = stage.get("$match") {
                let mut clauses: Vec<Bson> = passes.iter().cloned().map(Bson::Document).collect();
                clauses.push(filter.clone());
                doc! { "$match": { "$or": clauses } }
            } else if let Some(expression) = stage.get("$redact") {
                doc! { "$redact": { "$cond": [
                    passes_expression.clone(), "$$KEEP", expression.clone()
                ] } }
            } else {
                stage.clone()
            }
        }));
        if self.split_large_events {
            // Only the server's fragments carry `splitEvent`: a field of that name a pipeline
            // brought up from a document is dropped, so that it cannot join events.
            stages.push(doc! { "$unset": "splitEvent" });
            // Last, as MongoDB requires.
            stages.push(doc! { "$changeStreamSplitLargeEvent": {} });
        }
        stages
    }

    /// The configuration as the checkpoint stores it.
    pub fn to_document(&self) -> Document {
        doc! {
            "scope": self.scope.as_str(),
            "fullDocument": self.full_document.as_str(),
            "fullDocumentBeforeChange": self.before_change.as_str(),
            "pipeline": self.pipeline.iter().cloned().map(Bson::Document).collect::<Vec<_>>(),
            "partition": self.partition.map_or(Bson::Null, |p| {
                Bson::Document(doc! { "index": i64::from(p.index), "count": i64::from(p.count) })
            }),
            "splitLargeEvents": self.split_large_events,
        }
    }

    /// `sha256:` and the hex SHA-256 of the stored form's BSON: two configurations have the same
    /// digest exactly when their options are the same (the stages opened also depend on the
    /// database and the consumer's own collections, which the checkpoint pins otherwise).
    pub fn digest(&self) -> String {
        let bytes = self.to_document().to_vec().unwrap_or_default();
        format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
    }

    /// Reads a stored configuration; a field it lacks has the baseline's value (so that a
    /// configuration stored before a field existed keeps its meaning).
    pub fn from_document(stored: &Document) -> Result<StreamConfig, MalformedConfig> {
        // An option this version does not know (written by a newer one) cannot be honoured,
        // nor silently dropped by the next claim.
        if let Some(unknown) = stored
            .keys()
            .find(|key| !STORED_KEYS.contains(&key.as_str()))
        {
            return Err(MalformedConfig(format!(
                "{:?} is not an option this version knows",
                super::text::escape_untrusted(unknown, 40)
            )));
        }
        let defaults = StreamConfig::default();
        let text = |key: &str| match stored.get(key) {
            None => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(MalformedConfig(format!("{key} is not a string"))),
        };
        let bad = |key: &str, value: &str| {
            MalformedConfig(format!(
                "{key} {:?} is not a known value",
                super::text::escape_untrusted(value, 40)
            ))
        };
        let scope = match text("scope")? {
            None => defaults.scope,
            Some(s) => Scope::parse(s).ok_or_else(|| bad("scope", s))?,
        };
        let full_document = match text("fullDocument")? {
            None => defaults.full_document,
            Some(s) => FullDocument::parse(s).ok_or_else(|| bad("fullDocument", s))?,
        };
        let before_change = match text("fullDocumentBeforeChange")? {
            None => defaults.before_change,
            Some(s) => BeforeChange::parse(s).ok_or_else(|| bad("fullDocumentBeforeChange", s))?,
        };
        let pipeline = match stored.get("pipeline") {
            None => Vec::new(),
            Some(Bson::Array(stages)) => stages
                .iter()
                .map(|stage| match stage {
                    Bson::Document(stage) => Ok(stage.clone()),
                    _ => Err(MalformedConfig("a pipeline stage is not a document".into())),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(MalformedConfig("pipeline is not an array".into())),
        };
        let number = |partition: &Document, key: &str| match partition.get(key) {
            Some(Bson::Int64(n)) => u32::try_from(*n).ok(),
            Some(Bson::Int32(n)) => u32::try_from(*n).ok(),
            _ => None,
        };
        let partition = match stored.get("partition") {
            None | Some(Bson::Null) => None,
            Some(Bson::Document(p)) => match (number(p, "index"), number(p, "count")) {
                (Some(index), Some(count)) => Partition::parse(&format!("{index}/{count}"))
                    .map_err(|_| MalformedConfig("partition is out of range".into()))?,
                _ => return Err(MalformedConfig("partition needs index and count".into())),
            },
            Some(_) => return Err(MalformedConfig("partition is not a document".into())),
        };
        let split_large_events = match stored.get("splitLargeEvents") {
            None => false,
            Some(Bson::Boolean(b)) => *b,
            Some(_) => return Err(MalformedConfig("splitLargeEvents is not a boolean".into())),
        };
        Ok(StreamConfig {
            scope,
            full_document,
            before_change,
            pipeline,
            partition,
            split_large_events,
        })
    }

    /// What differs from `stored`, one line per field, for the operator.
    pub fn differences(&self, stored: &StreamConfig) -> Vec<String> {
        let mut lines = Vec::new();
        let mut field = |name: &str, then: &str, now: &str| {
            if then != now {
                lines.push(format!("{name}: checkpoint {then}, this run {now}"));
            }
        };
        field("scope", stored.scope.as_str(), self.scope.as_str());
        field(
            "fullDocument",
            stored.full_document.as_str(),
            self.full_document.as_str(),
        );
        field(
            "fullDocumentBeforeChange",
            stored.before_change.as_str(),
            self.before_change.as_str(),
        );
        let partition = |p: Option<Partition>| {
            p.map_or_else(
                || "none".to_string(),
                |p| format!("{}/{}", p.index, p.count),
            )
        };
        field(
            "partition",
            &partition(stored.partition),
            &partition(self.partition),
        );
        field(
            "splitLargeEvents",
            &stored.split_large_events.to_string(),
            &self.split_large_events.to_string(),
        );
        // As BSON: `Document` equality never holds for a stage holding NaN.
        let bytes = |stages: &[Document]| -> Vec<Vec<u8>> {
            stages
                .iter()
                .map(|stage| stage.to_vec().unwrap_or_default())
                .collect()
        };
        if bytes(&stored.pipeline) != bytes(&self.pipeline) {
            let digest = |stages: &[Document]| {
                let all: Vec<Bson> = stages.iter().cloned().map(Bson::Document).collect();
                let bytes = doc! { "p": all }.to_vec().unwrap_or_default();
                hex::encode(&Sha256::digest(bytes)[..6])
            };
            lines.push(format!(
                "pipeline: checkpoint {} stage(s) ({}), this run {} stage(s) ({})",
                stored.pipeline.len(),
                digest(&stored.pipeline),
                self.pipeline.len(),
                digest(&self.pipeline)
            ));
        }
        lines
    }
}

/// The fields of a stored configuration.
const STORED_KEYS: [&str; 6] = [
    "scope",
    "fullDocument",
    "fullDocumentBeforeChange",
    "pipeline",
    "partition",
    "splitLargeEvents",
];

#[cfg(test)]
mod tests;
