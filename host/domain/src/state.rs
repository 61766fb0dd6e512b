//! Handoff's own state collections, which a database or deployment stream never hands off.
//!
//! A consumer keeps its state (checkpoints, outbox, quarantine, audit records, backfill signals
//! and saved positions) in collections of its database. A stream wider than one collection
//! would see their writes as events: a consumer's own commits would come back without end, and
//! two wide consumers would hand off each other's records, each run more than the last.
//!
//! Every command that writes state first lists the collections it writes in the registry of
//! their database, the collection [`REGISTRY`] (`{_id: <collection name>, since}`). A wide
//! stream then leaves out, by namespace alone:
//! - every collection with a default state name ([`DEFAULT_NAMES`]), in every database;
//! - the consumer's own collections;
//! - every collection a registry lists: those listed when the stream opens are left out by the
//!   server; for the others the host reads the registry of an event's database before the policy
//!   sees the event (the first time it meets that database, and again after each change to its
//!   registry, whose events pass every filter to the host for that purpose).
//!
//! A registration is written before the first state write it covers, so it comes first in the
//! stream too: an event of a collection registered while the stream runs is recognised. Events
//! are recognised by their namespace only, never by what their document holds: a delete (which
//! carries no document), an update read without `fullDocument`, a pipeline's reshaping change
//! nothing, and an application's document that looks like a handoff record is still handed off.

use std::collections::{BTreeMap, BTreeSet};

use bson::{Bson, Document, doc};

/// The collection, in each database holding handoff state, that lists that database's state
/// collections.
pub const REGISTRY: &str = "kestra_change_registry";

/// The default names of the state collections: checkpoints, outbox, quarantine, audit records,
/// backfill signals, backfill positions and run history. Left out of every wide stream in every
/// database, registered or not (a baseline task writes them without registering them).
pub const DEFAULT_NAMES: [&str; 8] = [
    super::deployment::DEFAULT_CHECKPOINTS,
    super::deployment::DEFAULT_OUTBOX,
    "kestra_change_quarantine",
    "kestra_change_audit",
    "kestra_change_signals",
    "kestra_change_backfill",
    super::history::DEFAULT_RUNS,
    super::delivery::DEFAULT_LEDGER,
];

/// The most names one registry is read for: a database holds far fewer collections.
pub const MAX_REGISTERED: usize = 100_000;

/// The state collections a wide stream knows of so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateCollections {
    database: String,
    own: BTreeSet<String>,
    /// The registered names of each database whose registry was read.
    registered: BTreeMap<String, BTreeSet<String>>,
}

impl StateCollections {
    /// The consumer's own collections, in `database`.
    pub fn new(database: &str, own: &[&str]) -> StateCollections {
        StateCollections {
            database: database.to_string(),
            own: own.iter().map(|name| name.to_string()).collect(),
            registered: BTreeMap::new(),
        }
    }

    /// What the registry of `database` lists, as just read.
    pub fn learn(&mut self, database: &str, names: impl IntoIterator<Item = String>) {
        self.registered
            .insert(database.to_string(), names.into_iter().collect());
    }

    /// Whether an event of `database.collection` is of handoff's state. A database whose
    /// registry was not read yet has it read by `read` first; an event of a registry itself is
    /// state, and makes that registry be read again at the database's next event.
    pub fn is_state<E>(
        &mut self,
        database: &str,
        collection: &str,
        read: impl FnOnce(&str) -> Result<Vec<String>, E>,
    ) -> Result<bool, E> {
        if collection == REGISTRY {
            self.registered.remove(database);
            return Ok(true);
        }
        if DEFAULT_NAMES.contains(&collection)
            || (database == self.database && self.own.contains(collection))
        {
            return Ok(true);
        }
        if !self.registered.contains_key(database) {
            let names = read(database)?;
            self.learn(database, names);
        }
        Ok(self
            .registered
            .get(database)
            .is_some_and(|names| names.contains(collection)))
    }

    /// The clauses of the `$nor` a wide stream opens with: every state collection known now.
    /// The registries themselves are not among them: their events must reach the host.
    pub fn clauses(&self) -> Vec<Document> {
        let names = |set: &BTreeSet<String>| -> Vec<Bson> {
            set.iter().map(|name| Bson::String(name.clone())).collect()
        };
        let defaults: Vec<Bson> = DEFAULT_NAMES
            .iter()
            .map(|name| Bson::String((*name).to_string()))
            .collect();
        let mut clauses = vec![doc! { "ns.coll": { "$in": defaults } }];
        if !self.own.is_empty() {
            clauses.push(doc! { "ns.db": &self.database, "ns.coll": { "$in": names(&self.own) } });
        }
        for (database, set) in &self.registered {
            if !set.is_empty() {
                clauses.push(doc! { "ns.db": database, "ns.coll": { "$in": names(set) } });
            }
        }
        clauses
    }
}

/// The names a registry's documents list: their string `_id`s.
pub fn registered_names(documents: impl IntoIterator<Item = Document>) -> Vec<String> {
    documents
        .into_iter()
        .filter_map(|document| match document.get("_id") {
            Some(Bson::String(name)) => Some(name.clone()),
            _ => None,
        })
        .take(MAX_REGISTERED)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: &str) -> Result<Vec<String>, String> {
        Err("no registry read expected".into())
    }

    #[test]
    fn defaults_own_and_registries_are_state_without_a_read() {
        let mut state = StateCollections::new("shop", &["cp", "out"]);
        for (database, collection) in [
            ("shop", "cp"),
            ("shop", "out"),
            ("elsewhere", "kestra_change_outbox"),
            ("elsewhere", "kestra_change_signals"),
            ("elsewhere", REGISTRY),
        ] {
            assert_eq!(
                state.is_state(database, collection, never),
                Ok(true),
                "{database}.{collection}"
            );
        }
    }

    #[test]
    fn a_registry_is_read_once_per_database_and_again_after_it_changed() {
        let mut state = StateCollections::new("shop", &["cp"]);
        let reads = std::cell::RefCell::new(Vec::new());
        let read = |registry: Vec<&str>| {
            let names: Vec<String> = registry.iter().map(|n| n.to_string()).collect();
            let reads = &reads;
            move |database: &str| -> Result<Vec<String>, String> {
                reads.borrow_mut().push(database.to_string());
                Ok(names)
            }
        };
        assert_eq!(state.is_state("b", "orders", read(vec![])), Ok(false));
        // Known now: no read, whatever the registry holds.
        assert_eq!(state.is_state("b", "custom_out", never), Ok(false));
        // Its registry changed (a consumer registered custom_out): read again at the next event.
        assert_eq!(state.is_state("b", REGISTRY, never), Ok(true));
        assert_eq!(
            state.is_state("b", "custom_out", read(vec!["custom_out"])),
            Ok(true)
        );
        assert_eq!(state.is_state("b", "orders", never), Ok(false));
        // Another database's registry is its own.
        assert_eq!(
            state.is_state("c", "custom_out", read(vec!["other"])),
            Ok(false)
        );
        assert_eq!(*reads.borrow(), ["b", "b", "c"]);
        // A registry that cannot be read is an error, not a guess.
        let mut fresh = StateCollections::new("shop", &[]);
        assert!(
            fresh
                .is_state("d", "x", |_| Err::<Vec<String>, _>("denied"))
                .is_err()
        );
    }

    #[test]
    fn the_server_leaves_out_every_known_state_collection() {
        let mut state = StateCollections::new("shop", &["cp", "out"]);
        state.learn("b", ["custom_out".to_string(), "custom_cp".to_string()]);
        state.learn("empty", []);
        let clauses = state.clauses();
        assert_eq!(clauses.len(), 3, "{clauses:?}");
        assert_eq!(
            clauses[1],
            doc! { "ns.db": "shop", "ns.coll": { "$in": ["cp", "out"] } }
        );
        assert_eq!(
            clauses[2],
            doc! { "ns.db": "b", "ns.coll": { "$in": ["custom_cp", "custom_out"] } }
        );
        let defaults = clauses[0].get_document("ns.coll").unwrap();
        let defaults = defaults.get_array("$in").unwrap();
        assert_eq!(defaults.len(), DEFAULT_NAMES.len());
        assert!(!defaults.contains(&Bson::String(REGISTRY.into())));
    }

    #[test]
    fn only_string_ids_are_names() {
        let names = registered_names([
            doc! { "_id": "outbox_eu" },
            doc! { "_id": 7 },
            doc! { "since": 1 },
        ]);
        assert_eq!(names, ["outbox_eu"]);
    }
}
