//! Collection namespaces (`db.coll`), shared by the store and the change history.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace {
    pub db: String,
    pub coll: String,
}

impl Namespace {
    pub fn new(db: impl Into<String>, coll: impl Into<String>) -> Self {
        Namespace {
            db: db.into(),
            coll: coll.into(),
        }
    }

    /// Parses `db.coll`.
    pub fn parse(full: &str) -> Option<Namespace> {
        let (db, coll) = full.split_once('.')?;
        if db.is_empty() || coll.is_empty() {
            return None;
        }
        Some(Namespace::new(db, coll))
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.db, self.coll)
    }
}
