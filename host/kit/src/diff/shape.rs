//! A record's shape: each field path and the BSON types found there. An array's elements are
//! one path, `<array>[]`, whatever their number; values never count.

use std::collections::{BTreeMap, BTreeSet};

use bson::{Bson, Document};

/// The deepest level of a record read for its shape (BSON nests at most 100 levels).
const MAX_DEPTH: usize = 100;

/// A field path whose types differ between two records: `None` where the record lacks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeChange {
    pub path: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

impl ShapeChange {
    /// `+path: type`, `-path: type` or `~path: old -> new`.
    pub fn describe(&self) -> String {
        match (&self.old, &self.new) {
            (None, Some(new)) => format!("+{}: {new}", self.path),
            (Some(old), None) => format!("-{}: {old}", self.path),
            (Some(old), Some(new)) => format!("~{}: {old} -> {new}", self.path),
            (None, None) => self.path.clone(),
        }
    }
}

/// BSON's name of a value's type.
fn type_name(value: &Bson) -> &'static str {
    match value {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Array(_) => "array",
        Bson::Document(_) => "object",
        Bson::Boolean(_) => "bool",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Int64(_) => "long",
        Bson::Timestamp(_) => "timestamp",
        Bson::Binary(_) => "binData",
        Bson::ObjectId(_) => "objectId",
        Bson::DateTime(_) => "date",
        Bson::Symbol(_) => "symbol",
        Bson::Decimal128(_) => "decimal",
        Bson::Undefined => "undefined",
        Bson::MaxKey => "maxKey",
        Bson::MinKey => "minKey",
        Bson::DbPointer(_) => "dbPointer",
    }
}

/// Each path of `record` with the types found there.
pub fn shape(record: &Document) -> BTreeMap<String, BTreeSet<&'static str>> {
    let mut paths: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    let mut pending: Vec<(String, &Bson, usize)> = record
        .iter()
        .map(|(key, value)| (key.clone(), value, 1))
        .collect();
    while let Some((path, value, depth)) = pending.pop() {
        paths
            .entry(path.clone())
            .or_default()
            .insert(type_name(value));
        if depth >= MAX_DEPTH {
            continue;
        }
        match value {
            Bson::Document(inner) => pending.extend(
                inner
                    .iter()
                    .map(|(key, value)| (format!("{path}.{key}"), value, depth + 1)),
            ),
            Bson::Array(items) => pending.extend(
                items
                    .iter()
                    .map(|value| (format!("{path}[]"), value, depth + 1)),
            ),
            _ => {}
        }
    }
    paths
}

/// Whether `path` lies inside an array that `other` holds too (only with no elements there):
/// how many elements an array has is a value, not a shape.
fn inside_shared_array(path: &str, other: &BTreeMap<String, BTreeSet<&'static str>>) -> bool {
    path.find("[]")
        .is_some_and(|at| other.contains_key(&path[..at]) && !other.contains_key(&path[..at + 2]))
}

/// The paths whose types differ between `old` and `new`, in path order.
pub fn shape_changes(old: &Document, new: &Document) -> Vec<ShapeChange> {
    let (old, new) = (shape(old), shape(new));
    let join = |types: &BTreeSet<&str>| types.iter().copied().collect::<Vec<_>>().join("|");
    let mut changes = Vec::new();
    for (path, types) in &old {
        match new.get(path) {
            Some(other) if other == types => {}
            None if inside_shared_array(path, &new) => {}
            other => changes.push(ShapeChange {
                path: path.clone(),
                old: Some(join(types)),
                new: other.map(join),
            }),
        }
    }
    for (path, types) in &new {
        if !old.contains_key(path) && !inside_shared_array(path, &old) {
            changes.push(ShapeChange {
                path: path.clone(),
                old: None,
                new: Some(join(types)),
            });
        }
    }
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    changes
}
