//! BSON value ordering and equality as MongoDB defines them, and document keys.

use std::cmp::Ordering;

use bson::{Bson, Document};

/// MongoDB's canonical type order used for comparisons and sorting.
pub fn type_rank(b: &Bson) -> u8 {
    match b {
        Bson::MinKey => 1,
        Bson::Null | Bson::Undefined => 2,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 3,
        Bson::String(_) | Bson::Symbol(_) => 4,
        Bson::Document(_) => 5,
        Bson::Array(_) => 6,
        Bson::Binary(_) => 7,
        Bson::ObjectId(_) => 8,
        Bson::Boolean(_) => 9,
        Bson::DateTime(_) => 10,
        Bson::Timestamp(_) => 11,
        Bson::RegularExpression(_) => 12,
        Bson::DbPointer(_) => 13,
        Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) => 14,
        Bson::MaxKey => 15,
    }
}

/// Numeric value of a number, if it is one (decimals are not interpreted).
pub fn as_f64(b: &Bson) -> Option<f64> {
    match b {
        Bson::Int32(i) => Some(*i as f64),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(d) => Some(*d),
        _ => None,
    }
}

fn cmp_numbers(a: &Bson, b: &Bson) -> Ordering {
    let int = |x: &Bson| match x {
        Bson::Int32(i) => Some(*i as i64),
        Bson::Int64(i) => Some(*i),
        _ => None,
    };
    if let (Some(x), Some(y)) = (int(a), int(b)) {
        return x.cmp(&y);
    }
    match (as_f64(a), as_f64(b)) {
        (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or_else(|| {
            // NaN sorts before every other number.
            x.is_nan().cmp(&y.is_nan()).reverse()
        }),
        _ => format!("{a}").cmp(&format!("{b}")),
    }
}

/// Total order over BSON values (MongoDB comparison semantics, simplified for exotic types).
pub fn cmp_values(a: &Bson, b: &Bson) -> Ordering {
    let (ra, rb) = (type_rank(a), type_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => x.cmp(y),
        (Bson::Document(x), Bson::Document(y)) => cmp_documents(x, y),
        (Bson::Array(x), Bson::Array(y)) => {
            for (p, q) in x.iter().zip(y.iter()) {
                let c = cmp_values(p, q);
                if c != Ordering::Equal {
                    return c;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then(u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then(x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => {
            (x.pattern.as_str(), x.options.as_str()).cmp(&(y.pattern.as_str(), y.options.as_str()))
        }
        _ if ra == 3 => cmp_numbers(a, b),
        _ => Ordering::Equal,
    }
}

/// Field-by-field comparison: names and values in order.
pub fn cmp_documents(x: &Document, y: &Document) -> Ordering {
    for ((kx, vx), (ky, vy)) in x.iter().zip(y.iter()) {
        let c = type_rank(vx)
            .cmp(&type_rank(vy))
            .then_with(|| kx.cmp(ky))
            .then_with(|| cmp_values(vx, vy));
        if c != Ordering::Equal {
            return c;
        }
    }
    x.len().cmp(&y.len())
}

pub fn values_equal(a: &Bson, b: &Bson) -> bool {
    cmp_values(a, b) == Ordering::Equal
}

/// Canonical key of an `_id` value: equal ids (1, 1.0, Int64(1)) give equal keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DocKey(Vec<u8>);

fn normalize(v: &Bson) -> Bson {
    match v {
        Bson::Int32(_) | Bson::Int64(_) => Bson::Double(as_f64(v).unwrap_or(0.0)),
        Bson::Double(d) if *d == 0.0 => Bson::Double(0.0),
        Bson::Document(d) => {
            Bson::Document(d.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
        }
        Bson::Array(a) => Bson::Array(a.iter().map(normalize).collect()),
        Bson::Symbol(s) => Bson::String(s.clone()),
        other => other.clone(),
    }
}

pub fn doc_key(id: &Bson) -> DocKey {
    let mut d = Document::new();
    d.insert("", normalize(id));
    DocKey(d.to_vec().unwrap_or_default())
}

/// Plain dotted-path lookup through embedded documents and array indexes.
pub fn get_path<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let first = parts.next()?;
    let mut cur = doc.get(first)?;
    for p in parts {
        cur = match cur {
            Bson::Document(d) => d.get(p)?,
            Bson::Array(a) => a.get(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn numeric_ids_share_a_key() {
        assert_eq!(doc_key(&Bson::Int32(1)), doc_key(&Bson::Double(1.0)));
        assert_eq!(doc_key(&Bson::Int64(1)), doc_key(&Bson::Int32(1)));
        assert_ne!(doc_key(&Bson::Int32(1)), doc_key(&Bson::String("1".into())));
    }

    #[test]
    fn ordering_across_types() {
        assert_eq!(cmp_values(&Bson::Null, &Bson::Int32(0)), Ordering::Less);
        assert_eq!(
            cmp_values(&Bson::Int32(2), &Bson::Double(1.5)),
            Ordering::Greater
        );
        assert!(values_equal(
            &Bson::Document(doc! {"a": 1}),
            &Bson::Document(doc! {"a": 1.0})
        ));
        assert!(!values_equal(
            &Bson::Document(doc! {"a": 1, "b": 2}),
            &Bson::Document(doc! {"b": 2, "a": 1})
        ));
    }
}
