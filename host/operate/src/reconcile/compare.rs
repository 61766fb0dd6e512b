//! The comparison itself: the source read in chunks by `_id` (one BSON type class after the
//! other) or key by key (`--since`), each document compared with what the outbox says it is,
//! then the keys the outbox says are present and the source does not hold.

use std::collections::{HashMap, HashSet};

use bson::{Bson, Document, doc};

use super::{Options, server};
use crate::outbox_view::{self, Entry, OutboxView, Said, StreamOrder, key_text};
use crate::progress::Progress;
use handoff_backend::snapshot::Read;
use handoff_domain::error::Result;
use handoff_mongo::Connection;
use handoff_mongo::operator::{self, First};

/// The `_id` type classes, each read on its own (`$gt` compares within a class only).
const CLASSES: &[&[&str]] = &[
    &["minKey"],
    &["null"],
    &["int", "long", "double", "decimal"],
    &["string", "symbol"],
    &["object"],
    &["binData"],
    &["objectId"],
    &["bool"],
    &["date"],
    &["timestamp"],
    &["regex"],
    &["javascript"],
    &["javascriptWithScope"],
    &["maxKey"],
];

/// Which kind of difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Missing,
    Orphan,
    Stale,
}

/// A difference found before the in-flight keys are all known.
pub(super) struct Difference {
    pub(super) kind: Kind,
    pub(super) text: String,
    pub(super) key: Bson,
    /// The position of the key's latest record, if any.
    pub(super) latest: Option<StreamOrder>,
}

/// A difference as [`compare`] finds it.
type Compared = Option<(Kind, String, Bson, Option<StreamOrder>)>;

/// Reads the source in `_id` order, class by class, `--chunk-size` documents at a time, calling
/// `each` with every chunk.
async fn read_source(
    connection: &Connection,
    options: &Options,
    each: impl FnMut(Vec<Document>) -> Result<()>,
) -> Result<()> {
    read_collection(
        connection,
        (&options.database, &options.collection),
        options.chunk_size,
        "reading the watched collection",
        each,
    )
    .await
}

/// Reads `collection` in `_id` order, one `_id` type class after the other, `chunk` documents
/// at a time, calling `each` with every chunk; `what` names the reading in its failure.
pub(crate) async fn read_collection(
    connection: &Connection,
    (database, collection): (&str, &str),
    chunk: u32,
    what: &'static str,
    mut each: impl FnMut(Vec<Document>) -> Result<()>,
) -> Result<()> {
    for class in CLASSES {
        let types: Vec<&str> = class.to_vec();
        let mut last: Option<Bson> = None;
        loop {
            let mut range = doc! { "$type": types.clone() };
            if let Some(last) = &last {
                range.insert("$gt", last.clone());
            }
            let first = First {
                limit: chunk,
                batch: Some(chunk),
            };
            let documents = operator::documents(
                connection,
                database,
                collection,
                doc! { "_id": range },
                Some(first),
                what,
            )
            .await
            .map_err(server)?;
            let full = documents.len() as u64 == u64::from(chunk);
            last = documents.last().and_then(|d| d.get("_id")).cloned();
            if !documents.is_empty() {
                each(documents)?;
            }
            if !full || last.is_none() {
                break;
            }
        }
    }
    Ok(())
}

/// The source documents of `keys` (by `_id`).
pub(super) async fn read_keys(
    connection: &Connection,
    options: &Options,
    keys: &[Bson],
) -> Result<Vec<Document>> {
    documents_of(connection, (&options.database, &options.collection), keys).await
}

async fn documents_of(
    connection: &Connection,
    (database, collection): (&str, &str),
    keys: &[Bson],
) -> Result<Vec<Document>> {
    operator::documents(
        connection,
        database,
        collection,
        doc! { "_id": { "$in": keys.to_vec() } },
        None,
        "reading the watched collection",
    )
    .await
    .map_err(server)
}

/// The documents of `keys` in the watched collection (`namespace`) as they are now (`None`:
/// gone), in the keys' order.
pub(crate) async fn reads_of(
    connection: &Connection,
    namespace: (&str, &str),
    keys: &[Bson],
) -> Result<Vec<Read>> {
    let mut by_key: HashMap<String, Document> = documents_of(connection, namespace, keys)
        .await?
        .into_iter()
        .filter_map(|d| Some((key_text(d.get("_id")?), d)))
        .collect();
    Ok(keys
        .iter()
        .map(|key| Read {
            key: key.clone(),
            document: by_key.remove(&key_text(key)),
        })
        .collect())
}

/// Compares one source document with the view; the entry is taken out of the view.
fn compare(document: &Document, view: &mut OutboxView) -> Compared {
    let key = document.get("_id")?.clone();
    let text = key_text(&key);
    match view.take(&text) {
        None => Some((Kind::Missing, text, key, None)),
        Some(entry) => match entry.said {
            Said::Absent => Some((Kind::Missing, text, key, Some(entry.position))),
            Said::Present(digest) if digest != outbox_view::digest(document) => {
                Some((Kind::Stale, text, key, Some(entry.position)))
            }
            Said::Present(_) => None,
        },
    }
}

/// The differences between the source and `view`, keys of `in_flight` left out, and how many
/// keys were checked: every document of the source (or, with `--since`, of the view's keys),
/// then every key the view says is present that the source does not hold.
pub(super) async fn differences(
    connection: &Connection,
    options: &Options,
    mut view: OutboxView,
    in_flight: &HashSet<String>,
) -> Result<(Vec<Difference>, u64)> {
    let mut differences: Vec<Difference> = Vec::new();
    let mut checked_keys: u64 = 0;
    let mut note = |found: Compared, in_flight: &HashSet<String>| {
        if let Some((kind, text, key, latest)) = found
            && !in_flight.contains(&text)
        {
            differences.push(Difference {
                kind,
                text,
                key,
                latest,
            });
        }
    };
    if options.since.is_none() {
        let total = operator::estimated_count(
            connection,
            &options.database,
            &options.collection,
            "counting the watched collection",
        )
        .await
        .map_err(server)?;
        let progress = Progress::to("reconcile", Some(total), options.progress);
        read_source(connection, options, |documents| {
            progress.add(documents.len() as u64);
            for document in &documents {
                checked_keys += 1;
                note(compare(document, &mut view), in_flight);
            }
            Ok(())
        })
        .await?;
        progress.finish();
    } else {
        let keys: Vec<Bson> = view.entries().map(|(_, e)| e.key.clone()).collect();
        let progress = Progress::to("reconcile", Some(keys.len() as u64), options.progress);
        for chunk in keys.chunks(options.chunk_size.max(1) as usize) {
            for document in read_keys(connection, options, chunk).await? {
                checked_keys += 1;
                note(compare(&document, &mut view), in_flight);
            }
            progress.add(chunk.len() as u64);
        }
        progress.finish();
    }
    // What the outbox says is present and the source does not hold.
    let orphans: Vec<&Entry> = view
        .entries()
        .map(|(_, e)| e)
        .filter(|e| matches!(e.said, Said::Present(_)))
        .collect();
    checked_keys += orphans.len() as u64;
    for entry in orphans {
        note(
            Some((
                Kind::Orphan,
                key_text(&entry.key),
                entry.key.clone(),
                Some(entry.position.clone()),
            )),
            in_flight,
        );
    }
    Ok((differences, checked_keys))
}
