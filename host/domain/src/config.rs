//! What shapes a consumer's change stream beyond the baseline (scope, pipeline, pre- and
//! post-images), checked before anything is written, and bound to the checkpoint so that a run
//! with another shape cannot silently continue a consumer.
//!
//! The checkpoint records the configuration (`config`) and its digest (`configDigest`); a
//! checkpoint without them (created by the baseline task) has the baseline's configuration.

use bson::{Bson, Document, doc};
use sha2::{Digest, Sha256};

use super::state::{REGISTRY, StateCollections};

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

/// The stages a change-stream pipeline may hold (MongoDB's list, less `$changeStreamSplitLargeEvent`,
/// which the host adds itself).
pub const ALLOWED_STAGES: [&str; 8] = [
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
];

/// The most stages a pipeline may have, and its longest text.
pub const MAX_STAGES: usize = 64;
pub const MAX_PIPELINE_BYTES: usize = 1 << 20;

/// The fields a pipeline must leave as the server wrote them: the resume token, and the
/// operation type the host recognises an invalidation by.
const PROTECTED: [&str; 2] = ["_id", "operationType"];

/// The fields a database or deployment stream's pipeline must also leave: the namespace, by
/// which the host leaves out handoff's own collections.
const PROTECTED_WIDE: [&str; 3] = ["_id", "operationType", "ns"];

/// Reads a pipeline from its Extended JSON text (an array of stages) and refuses what MongoDB
/// does not allow in a change stream or what would change the fields the host relies on.
pub fn parse_pipeline(text: &str) -> Result<Vec<Document>, String> {
    if text.len() > MAX_PIPELINE_BYTES {
        return Err(format!(
            "the pipeline is over {} KiB",
            MAX_PIPELINE_BYTES >> 10
        ));
    }
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the pipeline is not JSON: {e}"))?;
    let Bson::Array(stages) = Bson::try_from(json)
        .map_err(|e| format!("the pipeline is not valid Extended JSON: {e}"))?
    else {
        return Err("the pipeline must be a JSON array of stages".into());
    };
    if stages.len() > MAX_STAGES {
        return Err(format!("the pipeline has more than {MAX_STAGES} stages"));
    }
    stages
        .into_iter()
        .enumerate()
        .map(|(index, stage)| {
            let Bson::Document(stage) = stage else {
                return Err(format!("stage {index} is not a document"));
            };
            check_stage(&stage, &PROTECTED).map_err(|why| format!("stage {index}: {why}"))?;
            // A key MongoDB cannot store (one holding NUL) would make the stage unsendable.
            stage
                .to_vec()
                .map_err(|_| format!("stage {index} cannot be encoded as BSON"))?;
            Ok(stage)
        })
        .collect()
}

/// Refuses a pipeline that would change or remove an event's namespace (`ns`): a database or
/// deployment stream needs it in every event to leave out handoff's own collections.
pub fn check_keeps_namespace(pipeline: &[Document]) -> Result<(), String> {
    for (index, stage) in pipeline.iter().enumerate() {
        check_stage(stage, &PROTECTED_WIDE).map_err(|why| format!("stage {index}: {why}"))?;
    }
    Ok(())
}

fn check_stage(stage: &Document, protected: &[&str]) -> Result<(), String> {
    let mut entries = stage.iter();
    let (Some((name, spec)), None) = (entries.next(), entries.next()) else {
        return Err("a stage must have exactly one field, its name".into());
    };
    let shown = super::text::escape_untrusted(name, 40);
    if !ALLOWED_STAGES.contains(&name.as_str()) {
        return Err(format!(
            "{shown} is not allowed in a change stream (allowed: {})",
            ALLOWED_STAGES.join(", ")
        ));
    }
    match name.as_str() {
        "$match" | "$redact" => Ok(()),
        "$project" => check_projection(spec, protected),
        "$addFields" | "$set" => {
            let Bson::Document(fields) = spec else {
                return Err(format!("{name} takes a document"));
            };
            match fields.keys().find(|key| touches_protected(key, protected)) {
                Some(key) => Err(format!("{name} would change {}", field_name(key))),
                None => Ok(()),
            }
        }
        "$unset" => {
            let paths: Vec<&Bson> = match spec {
                Bson::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            for path in paths {
                let Bson::String(path) = path else {
                    return Err("$unset takes a field path or an array of them".into());
                };
                if touches_protected(path, protected) {
                    return Err(format!("$unset would remove {}", field_name(path)));
                }
            }
            Ok(())
        }
        "$replaceRoot" => {
            let root = match spec {
                Bson::Document(spec) => spec.get("newRoot"),
                _ => None,
            };
            match root {
                Some(root) => check_new_root(root, protected),
                None => Err("$replaceRoot takes {newRoot: <expression>}".into()),
            }
        }
        _ => check_new_root(spec, protected),
    }
}

/// Whether `path` is, or is inside, a protected field.
fn touches_protected(path: &str, protected: &[&str]) -> bool {
    protected.iter().any(|field| {
        path == *field
            || path
                .strip_prefix(field)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

fn field_name(path: &str) -> &'static str {
    if path == "operationType" || path.starts_with("operationType.") {
        "operationType (how the host recognises an invalidation)"
    } else if path == "ns" || path.starts_with("ns.") {
        "ns (the event's namespace, by which a database or deployment stream leaves out \
         handoff's own collections)"
    } else {
        "_id (the event's resume token)"
    }
}

/// A `$project` keeps the protected fields as they are: an inclusion projection must include
/// each of them but `_id` (and must not exclude `_id`); an exclusion one must not name them.
fn check_projection(spec: &Bson, protected: &[&str]) -> Result<(), String> {
    let Bson::Document(fields) = spec else {
        return Err("$project takes a document".into());
    };
    let included = |value: &Bson| match value {
        Bson::Boolean(b) => Some(*b),
        Bson::Int32(n) => Some(*n != 0),
        Bson::Int64(n) => Some(*n != 0),
        Bson::Double(n) => Some(*n != 0.0),
        _ => None,
    };
    for (key, value) in fields {
        if touches_protected(key, protected) && (key.contains('.') || included(value) != Some(true))
        {
            return Err(format!("$project would change {}", field_name(key)));
        }
    }
    // Only an exclusion of other fields keeps every field it does not name; anything else (an
    // included or computed field, or `_id: 1` alone) keeps only the fields it lists.
    let mut others = fields
        .iter()
        .filter(|(key, _)| !touches_protected(key, protected))
        .peekable();
    let exclusion =
        others.peek().is_some() && others.all(|(_, value)| included(value) == Some(false));
    if !exclusion
        && let Some(missing) = protected
            .iter()
            .find(|field| **field != "_id" && !fields.contains_key(**field))
    {
        return Err(format!(
            "$project would remove {}; include {missing}: 1",
            field_name(missing)
        ));
    }
    Ok(())
}

/// A new root must be a document (or a `$mergeObjects` ending in one) that sets each protected
/// field from the event's own.
fn check_new_root(root: &Bson, protected: &[&str]) -> Result<(), String> {
    let keeps = |fields: &Document| {
        protected.iter().all(|field| {
            matches!(fields.get(*field), Some(Bson::String(path)) if *path == format!("${field}"))
        })
    };
    let last = match root {
        Bson::Document(fields) => match fields.get("$mergeObjects") {
            Some(Bson::Array(parts)) if fields.len() == 1 => {
                parts.last().and_then(Bson::as_document)
            }
            _ => Some(fields),
        },
        _ => None,
    };
    if last.is_some_and(keeps) {
        Ok(())
    } else {
        let kept: Vec<String> = protected
            .iter()
            .map(|field| format!("\"{field}\": \"${field}\""))
            .collect();
        Err(format!(
            "a new root must keep the event's {}, e.g. \
             {{\"$replaceWith\": {{\"$mergeObjects\": [\"$fullDocument\", {{{}}}]}}}}",
            match protected.split_last() {
                Some((last, [])) => last.to_string(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            },
            kept.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        parse_pipeline(text).expect_err(text)
    }

    #[test]
    fn the_stages_a_change_stream_allows_pass() {
        let pipeline = parse_pipeline(
            r#"[
                {"$match": {"operationType": {"$in": ["insert", "update"]}}},
                {"$project": {"fullDocument.secret": 0}},
                {"$project": {"operationType": 1, "fullDocument.total": 1, "ns": 1}},
                {"$addFields": {"tenant": "$fullDocument.tenant"}},
                {"$set": {"seen": {"$literal": true}}},
                {"$unset": ["updateDescription", "fullDocument.big"]},
                {"$unset": "tenant"},
                {"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$_id", "operationType": "$operationType"}]}},
                {"$replaceRoot": {"newRoot": {"_id": "$_id", "operationType": "$operationType", "doc": "$fullDocument"}}},
                {"$redact": "$$KEEP"},
                {"$match": {"fullDocument.when": {"$gt": {"$date": "2026-01-01T00:00:00Z"}}}}
            ]"#,
        )
        .unwrap();
        assert_eq!(pipeline.len(), 11);
        assert!(matches!(
            pipeline[10]
                .get_document("$match")
                .unwrap()
                .get_document("fullDocument.when")
                .unwrap()
                .get("$gt"),
            Some(Bson::DateTime(_))
        ));
    }

    #[test]
    fn other_stages_and_shapes_are_refused() {
        for (text, says) in [
            (r#"[{"$group": {"_id": null}}]"#, "$group is not allowed"),
            (r#"[{"$lookup": {}}]"#, "not allowed"),
            (r#"[{"$changeStreamSplitLargeEvent": {}}]"#, "not allowed"),
            (
                r#"[{"$match": {}, "$project": {"a": 1}}]"#,
                "exactly one field",
            ),
            (r#"[{}]"#, "exactly one field"),
            (
                r#"[{"$replaceRoot": {"root": {"_id": "$_id"}}}]"#,
                "newRoot",
            ),
            (r#"[{"$addFields": 1}]"#, "takes a document"),
            (r#"[{"$unset": 1}]"#, "field path"),
            (r#"[{"$match": {"a\u0000b": 1}}]"#, "cannot be encoded"),
            (r#"[1]"#, "not a document"),
            (r#"{"$match": {}}"#, "JSON array"),
            (r#"[{"$match": "#, "not JSON"),
            (
                r#"[{"$match": {"a": {"$date": "not a date"}}}]"#,
                "Extended JSON",
            ),
        ] {
            let error = refused(text);
            assert!(error.contains(says), "{text}: {error}");
        }
        let many = format!("[{}]", vec![r#"{"$match": {}}"#; MAX_STAGES + 1].join(","));
        assert!(refused(&many).contains("more than"));
        assert!(refused(&" ".repeat(MAX_PIPELINE_BYTES + 1)).contains("KiB"));
    }

    #[test]
    fn a_pipeline_that_changes_the_token_or_the_operation_type_is_refused() {
        for text in [
            r#"[{"$project": {"_id": 0}}]"#,
            r#"[{"$project": {"_id": "$documentKey"}}]"#,
            r#"[{"$project": {"_id._data": 1, "operationType": 1}}]"#,
            r#"[{"$project": {"_id": {"_data": 1}}}]"#,
            r#"[{"$project": {"operationType": 0}}]"#,
            r#"[{"$project": {"fullDocument": 1}}]"#,
            r#"[{"$project": {"doc": "$fullDocument"}}]"#,
            r#"[{"$project": {"_id": 1}}]"#,
            r#"[{"$project": {}}]"#,
            r#"[{"$addFields": {"_id": 1}}]"#,
            r#"[{"$set": {"_id._data": "x"}}]"#,
            r#"[{"$set": {"operationType": "insert"}}]"#,
            r#"[{"$unset": "_id"}]"#,
            r#"[{"$unset": ["a", "operationType"]}]"#,
            r#"[{"$unset": "_id._typeBits"}]"#,
            r#"[{"$replaceRoot": {"newRoot": "$fullDocument"}}]"#,
            r#"[{"$replaceWith": "$fullDocument"}]"#,
            r#"[{"$replaceWith": {"_id": "$documentKey", "operationType": "$operationType"}}]"#,
            r#"[{"$replaceWith": {"$mergeObjects": [{"_id": "$_id", "operationType": "$operationType"}, "$fullDocument"]}}]"#,
        ] {
            let error = refused(text);
            assert!(
                error.contains("_id") || error.contains("operationType"),
                "{text}: {error}"
            );
        }
        // Fields that merely start with a protected name are not protected.
        assert!(parse_pipeline(r#"[{"$set": {"_identity": 1, "operationTypes": 2}}]"#).is_ok());
    }

    #[test]
    fn the_stored_form_round_trips_and_fills_missing_fields_with_the_baseline() {
        let config = StreamConfig {
            scope: Scope::Database,
            full_document: FullDocument::Required,
            before_change: BeforeChange::WhenAvailable,
            pipeline: parse_pipeline(r#"[{"$match": {"operationType": "insert"}}]"#).unwrap(),
            ..StreamConfig::default()
        };
        let stored = config.to_document();
        assert_eq!(StreamConfig::from_document(&stored).unwrap(), config);
        assert_eq!(
            StreamConfig::from_document(&doc! {}).unwrap(),
            StreamConfig::default()
        );
        assert!(StreamConfig::from_document(&doc! { "scope": "galaxy" }).is_err());
        assert!(StreamConfig::from_document(&doc! { "pipeline": [1] }).is_err());
        assert!(StreamConfig::from_document(&doc! { "fullDocument": 1 }).is_err());
    }

    #[test]
    fn digests_differ_exactly_when_the_stream_differs() {
        let base = StreamConfig::default();
        assert_eq!(base.digest(), StreamConfig::default().digest());
        assert!(base.digest().starts_with("sha256:") && base.digest().len() == 7 + 64);
        let mut images = base.clone();
        images.before_change = BeforeChange::Required;
        assert_ne!(base.digest(), images.digest());
        let mut filtered = base.clone();
        filtered.pipeline = vec![doc! { "$match": { "a": 1 } }];
        assert_ne!(base.digest(), filtered.digest());
        let lines = filtered.differences(&images);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("fullDocumentBeforeChange: checkpoint required, this run off")
        );
        assert!(lines[1].starts_with("pipeline: checkpoint 0 stage(s)"));
        assert!(base.differences(&StreamConfig::default()).is_empty());
        // A stage holding NaN is the same stage as itself.
        let nan = StreamConfig {
            pipeline: parse_pipeline(r#"[{"$match": {"a": {"$numberDouble": "NaN"}}}]"#).unwrap(),
            ..StreamConfig::default()
        };
        let stored = StreamConfig::from_document(&nan.to_document()).unwrap();
        assert!(nan.differences(&stored).is_empty());
    }

    #[test]
    fn partitions_parse_and_cover_every_hash_once() {
        assert_eq!(Partition::parse("0/1").unwrap(), None);
        assert_eq!(
            Partition::parse(" 2 / 4 ").unwrap(),
            Some(Partition { index: 2, count: 4 })
        );
        for bad in ["4/4", "1/0", "-1/4", "a/b", "3", "0/1025", ""] {
            assert!(Partition::parse(bad).is_err(), "{bad}");
        }
        for hash in [i64::MIN, -7, -1, 0, 1, 763_543_691_661_428_748, i64::MAX] {
            let bucket = Partition::of_hash(hash, 3);
            assert!(bucket < 3);
            // The server's expression: ((hash mod n) + n) mod n, with mod truncated as $mod is.
            assert_eq!(i64::from(bucket), ((hash % 3) + 3) % 3, "{hash}");
        }
        let stage = Partition { index: 1, count: 3 }.stage();
        let clauses = stage
            .get_document("$match")
            .unwrap()
            .get_array("$or")
            .unwrap();
        assert_eq!(
            clauses[0],
            Bson::Document(doc! { "operationType": "invalidate" })
        );
    }

    #[test]
    fn partition_and_split_are_part_of_the_configuration() {
        let base = StreamConfig::default();
        let mut shaped = base.clone();
        shaped.partition = Some(Partition { index: 1, count: 4 });
        shaped.split_large_events = true;
        assert_ne!(base.digest(), shaped.digest());
        assert_eq!(
            StreamConfig::from_document(&shaped.to_document()).unwrap(),
            shaped
        );
        let lines = shaped.differences(&base);
        assert_eq!(
            lines,
            [
                "partition: checkpoint none, this run 1/4",
                "splitLargeEvents: checkpoint false, this run true"
            ]
        );
        let stages = shaped.stages(&StateCollections::new("db", &["cp"]));
        assert_eq!(stages.len(), 3);
        assert_eq!(
            stages[1..],
            [
                doc! { "$unset": "splitEvent" },
                doc! { "$changeStreamSplitLargeEvent": {} }
            ]
        );
        for bad in [
            doc! { "fromTheFuture": true },
            doc! { "partition": { "index": 4, "count": 4 } },
            doc! { "partition": { "index": 0 } },
            doc! { "partition": 3 },
            doc! { "splitLargeEvents": "yes" },
        ] {
            assert!(StreamConfig::from_document(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn wide_streams_leave_out_the_state_collections_and_let_registry_events_through() {
        let own = StateCollections::new("shop", &["cp", "out"]);
        let mut config = StreamConfig {
            pipeline: vec![doc! { "$match": { "operationType": "insert" } }],
            ..StreamConfig::default()
        };
        let keeps_invalidations = doc! { "$match": { "$or": [ { "operationType": "invalidate" }, { "operationType": "insert" } ] } };
        assert_eq!(
            config.stages(&own),
            std::slice::from_ref(&keeps_invalidations)
        );
        assert_eq!(config.source("shop", "orders"), "shop.orders");
        config.scope = Scope::Database;
        config.partition = Some(Partition { index: 1, count: 2 });
        let stages = config.stages(&own);
        assert_eq!(stages.len(), 3);
        assert_eq!(stages[0], doc! { "$match": { "$nor": own.clauses() } });
        // Every filter lets the registries' events through to the host.
        let passes = [
            Bson::Document(doc! { "operationType": "invalidate" }),
            Bson::Document(doc! { "ns.coll": REGISTRY }),
        ];
        let partition = stages[1].get_document("$match").unwrap();
        assert_eq!(partition.get_array("$or").unwrap()[..2], passes);
        assert_eq!(
            stages[2],
            doc! { "$match": { "$or": [
                { "operationType": "invalidate" }, { "ns.coll": REGISTRY }, { "operationType": "insert" }
            ] } }
        );
        // A $redact keeps invalidations and registry events whatever its expression says.
        config.partition = None;
        config.pipeline = vec![doc! { "$redact": "$$PRUNE" }];
        assert_eq!(
            config.stages(&own)[1],
            doc! { "$redact": { "$cond": [
                { "$or": [
                    { "$eq": ["$operationType", "invalidate"] },
                    { "$eq": ["$$ROOT.ns.coll", REGISTRY] },
                ] },
                "$$KEEP",
                "$$PRUNE"
            ] } }
        );
        assert_eq!(config.source("shop", "orders"), "shop");
        config.scope = Scope::Deployment;
        assert_eq!(config.source("shop", "orders"), DEPLOYMENT_SOURCE);
    }

    #[test]
    fn a_wide_streams_pipeline_keeps_the_namespace() {
        for text in [
            r#"[{"$project": {"ns": 0}}]"#,
            r#"[{"$project": {"operationType": 1, "fullDocument": 1}}]"#,
            r#"[{"$project": {"ns.coll": 1, "operationType": 1}}]"#,
            r#"[{"$unset": "ns.db"}]"#,
            r#"[{"$set": {"ns": {"db": "x", "coll": "y"}}}]"#,
            r#"[{"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$_id", "operationType": "$operationType"}]}}]"#,
        ] {
            let pipeline = parse_pipeline(text).expect(text);
            let error = check_keeps_namespace(&pipeline).expect_err(text);
            assert!(error.contains("ns"), "{text}: {error}");
        }
        for text in [
            r#"[{"$project": {"operationType": 1, "ns": 1, "fullDocument.total": 1}}]"#,
            r#"[{"$project": {"fullDocument.secret": 0}}]"#,
            r#"[{"$match": {"ns.coll": {"$ne": "logs"}}}]"#,
            r#"[{"$replaceWith": {"$mergeObjects": ["$fullDocument", {"_id": "$_id", "operationType": "$operationType", "ns": "$ns"}]}}]"#,
        ] {
            let pipeline = parse_pipeline(text).expect(text);
            assert_eq!(check_keeps_namespace(&pipeline), Ok(()), "{text}");
        }
    }
}
