//! Secondary indexes as lookups. For each index a collection declares, the latest committed
//! values of the index's fields per document, so that a filter pinning the index's leading fields
//! by equality (or `$in` of plain values) reads only the documents that can match instead of
//! scanning the collection, as a server's index would let it.
//!
//! A lookup answers a superset of what matches; the matcher still decides. Documents whose
//! indexed values are not plain scalars (an array on the path, a decimal) are candidates of
//! every lookup, and the store adds what the reader may see differently from the latest
//! committed state (its transaction's own writes, documents changed after its snapshot).

use std::collections::{BTreeMap, BTreeSet};

use bson::{Bson, Document};

use crate::values::{DocKey, doc_key};

/// The most value combinations one filter is looked up by; a filter listing more is scanned
/// by fewer of the index's fields.
const MAX_COMBINATIONS: usize = 256;

/// One index's documents by the values of its fields.
#[derive(Debug)]
pub struct Lookup {
    pub name: String,
    fields: Vec<String>,
    by_values: BTreeMap<Vec<DocKey>, BTreeSet<DocKey>>,
    /// Documents with a value no equality lookup can place: candidates of every lookup.
    unplaced: BTreeSet<DocKey>,
}

impl Lookup {
    /// The lookup of an index specification (`{name, key: {field: 1 | -1, …}}`), empty; `None`
    /// for a key pattern of another kind (text, hashed, geospatial, wildcard).
    pub fn of_spec(spec: &Document) -> Option<Lookup> {
        let name = spec.get_str("name").ok()?.to_string();
        let key = spec.get_document("key").ok()?;
        let mut fields = Vec::with_capacity(key.len());
        for (field, direction) in key {
            let plain = match direction {
                Bson::Int32(d) => d.abs() == 1,
                Bson::Int64(d) => d.abs() == 1,
                Bson::Double(d) => d.abs() == 1.0,
                _ => false,
            };
            if !plain || field.is_empty() || field.contains("$") {
                return None;
            }
            fields.push(field.clone());
        }
        if fields.is_empty() {
            return None;
        }
        Some(Lookup {
            name,
            fields,
            by_values: BTreeMap::new(),
            unplaced: BTreeSet::new(),
        })
    }

    /// The document's values of the index's fields, or `None` where one cannot be placed.
    fn values_of(&self, doc: &Document) -> Option<Vec<DocKey>> {
        self.fields
            .iter()
            .map(|field| stored_value(doc, field))
            .collect()
    }

    pub fn insert(&mut self, key: &DocKey, doc: &Document) {
        match self.values_of(doc) {
            Some(values) => {
                self.by_values
                    .entry(values)
                    .or_default()
                    .insert(key.clone());
            }
            None => {
                self.unplaced.insert(key.clone());
            }
        }
    }

    pub fn remove(&mut self, key: &DocKey, doc: &Document) {
        match self.values_of(doc) {
            Some(values) => {
                if let Some(keys) = self.by_values.get_mut(&values) {
                    keys.remove(key);
                    if keys.is_empty() {
                        self.by_values.remove(&values);
                    }
                }
            }
            None => {
                self.unplaced.remove(key);
            }
        }
    }

    /// The value combinations of the leading fields `filter` pins (at most
    /// [`MAX_COMBINATIONS`]), or `None` when it pins not even the first.
    fn plan(&self, filter: &Document) -> Option<Vec<Vec<DocKey>>> {
        let mut prefixes: Vec<Vec<DocKey>> = vec![Vec::new()];
        for field in &self.fields {
            let Some(values) = filter.get(field).and_then(pinned_values) else {
                break;
            };
            if prefixes.len().saturating_mul(values.len()) > MAX_COMBINATIONS {
                break;
            }
            prefixes = prefixes
                .iter()
                .flat_map(|prefix| {
                    values.iter().map(move |v| {
                        let mut next = prefix.clone();
                        next.push(v.clone());
                        next
                    })
                })
                .collect();
        }
        prefixes
            .first()
            .is_some_and(|p| !p.is_empty())
            .then_some(prefixes)
    }

    /// The documents stored under any of `prefixes`, and those no lookup can place.
    fn keys_under(&self, prefixes: &[Vec<DocKey>]) -> BTreeSet<DocKey> {
        let mut keys = self.unplaced.clone();
        for prefix in prefixes {
            for (values, found) in self.by_values.range(prefix.clone()..) {
                if !values.starts_with(prefix) {
                    break;
                }
                keys.extend(found.iter().cloned());
            }
        }
        keys
    }
}

/// The documents that can match `filter` by the lookup pinning most of its leading fields, or
/// `None` when no lookup helps (the collection is then scanned).
pub fn candidates(lookups: &[Lookup], filter: &Document) -> Option<BTreeSet<DocKey>> {
    let (lookup, prefixes) = lookups
        .iter()
        .filter_map(|l| Some((l, l.plan(filter)?)))
        .max_by(|(_, a), (_, b)| {
            a[0].len()
                .cmp(&b[0].len())
                .then_with(|| b.len().cmp(&a.len()))
        })?;
    Some(lookup.keys_under(&prefixes))
}

/// The key of a value a filter may name and a stored value equal to it is keyed by: strings,
/// numbers (every numeric type alike), object IDs, booleans, dates. Others (`null`, which also
/// matches a missing field, arrays, documents, patterns, decimals) are not looked up.
fn plain_key(value: &Bson) -> Option<DocKey> {
    match value {
        Bson::Double(d) if d.is_nan() => None,
        Bson::String(_)
        | Bson::Symbol(_)
        | Bson::Double(_)
        | Bson::Int32(_)
        | Bson::Int64(_)
        | Bson::ObjectId(_)
        | Bson::Boolean(_)
        | Bson::DateTime(_) => Some(doc_key(value)),
        _ => None,
    }
}

/// The values a filter's condition on one field requires it to equal one of: a plain value, or
/// `{$eq: v}` or `{$in: [v, …]}` alone, of plain values only.
fn pinned_values(condition: &Bson) -> Option<Vec<DocKey>> {
    match condition {
        Bson::Document(d) => {
            if d.len() != 1 {
                return None;
            }
            match d.iter().next()? {
                (op, v) if op == "$eq" => Some(vec![plain_key(v)?]),
                (op, Bson::Array(values)) if op == "$in" => values.iter().map(plain_key).collect(),
                _ => None,
            }
        }
        other => Some(vec![plain_key(other)?]),
    }
}

/// A stored document's value of `path` as a lookup keys it: missing is `null`; an array on the
/// path (which matches by element) or a value that may equal another type's (a decimal) cannot
/// be placed.
fn stored_value(doc: &Document, path: &str) -> Option<DocKey> {
    let mut current = doc;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        let Some(value) = current.get(part) else {
            return Some(doc_key(&Bson::Null));
        };
        match value {
            Bson::Array(_) | Bson::Decimal128(_) => return None,
            Bson::Document(inner) if parts.peek().is_some() => current = inner,
            _ if parts.peek().is_some() => return Some(doc_key(&Bson::Null)),
            Bson::Double(d) if d.is_nan() => return None,
            other => return Some(doc_key(other)),
        }
    }
    Some(doc_key(&Bson::Null))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn lookup(fields: Document) -> Lookup {
        Lookup::of_spec(&doc! {"name": "i", "key": fields}).unwrap()
    }

    #[test]
    fn only_plain_key_patterns_are_looked_up() {
        assert!(Lookup::of_spec(&doc! {"name": "t", "key": {"a": "text"}}).is_none());
        assert!(Lookup::of_spec(&doc! {"name": "h", "key": {"a": "hashed"}}).is_none());
        assert!(Lookup::of_spec(&doc! {"name": "w", "key": {"$**": 1}}).is_none());
        assert!(Lookup::of_spec(&doc! {"name": "d", "key": {"a": 1, "b": -1_i64}}).is_some());
    }

    #[test]
    fn a_filter_uses_the_leading_fields_it_pins() {
        let index = lookup(doc! {"a": 1, "b": 1, "c": 1});
        let plan = |filter: Document| index.plan(&filter).map(|p| (p.len(), p[0].len()));
        assert_eq!(plan(doc! {"a": 1, "b": "x", "c": true}), Some((1, 3)));
        assert_eq!(
            plan(doc! {"a": {"$in": [1, 2]}, "b": {"$eq": "x"}}),
            Some((2, 2))
        );
        // A gap ends the prefix; a range, a pattern or null pins nothing.
        assert_eq!(plan(doc! {"a": 1, "c": 1}), Some((1, 1)));
        assert_eq!(plan(doc! {"b": 1}), None);
        assert_eq!(plan(doc! {"a": {"$gt": 1}}), None);
        assert_eq!(plan(doc! {"a": null}), None);
        assert_eq!(plan(doc! {"a": {"$in": [1, null]}}), None);
        assert_eq!(plan(doc! {"a": {"$eq": 1, "$ne": 2}}), None);
        assert_eq!(plan(doc! {"a": {"x": 1}}), None);
        // Too many combinations: fewer fields.
        let many: Vec<i32> = (0..20).collect();
        assert_eq!(
            plan(doc! {"a": {"$in": many.clone()}, "b": {"$in": many}}),
            Some((20, 1))
        );
    }

    #[test]
    fn unplaceable_documents_are_candidates_of_every_lookup() {
        let mut index = lookup(doc! {"s": 1, "n.v": 1});
        let docs = [
            doc! {"_id": 1, "s": "open", "n": {"v": 1}},
            doc! {"_id": 2, "s": "done", "n": {"v": 1}},
            doc! {"_id": 3, "s": ["open", "done"], "n": {"v": 1}},
            doc! {"_id": 4, "s": "open", "n": [{"v": 1}]},
            doc! {"_id": 5, "s": "open"},
            doc! {"_id": 6, "s": "open", "n": {"v": 1.0}},
        ];
        for d in &docs {
            index.insert(&doc_key(d.get("_id").unwrap()), d);
        }
        let ids = |index: &Lookup, filter: Document| -> Vec<i32> {
            let keys = candidates(std::slice::from_ref(index), &filter).unwrap();
            let mut ids: Vec<i32> = docs
                .iter()
                .filter(|d| keys.contains(&doc_key(d.get("_id").unwrap())))
                .map(|d| d.get_i32("_id").unwrap())
                .collect();
            ids.sort();
            ids
        };
        assert_eq!(
            ids(&index, doc! {"s": "open", "n.v": 1_i64}),
            vec![1, 3, 4, 6]
        );
        assert_eq!(ids(&index, doc! {"s": "open"}), vec![1, 3, 4, 5, 6]);
        assert_eq!(
            ids(&index, doc! {"s": {"$in": ["done", "gone"]}}),
            vec![2, 3, 4]
        );
        index.remove(&doc_key(&Bson::Int32(3)), &docs[2]);
        index.remove(&doc_key(&Bson::Int32(1)), &docs[0]);
        assert_eq!(ids(&index, doc! {"s": "open", "n.v": 1}), vec![4, 6]);
    }
}
