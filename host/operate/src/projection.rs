//! `deliver reconcile`: a delivery's MongoDB projection compared with the watched collection by
//! key, content and version — **missing** (in the source, not in the projection), **orphan**
//! (in the projection, not in the source), **stale** (in both, different; field order does not
//! count, nor the fields the delivery adds) — and, with `--repair`, corrected.
//!
//! Keys with records the delivery has not settled yet (pending, in progress or failed entries)
//! are **in flight**: the delivery will write them, so they are counted apart, never as
//! differences. Run the consumer and the delivery first: a change not yet handed off is a
//! difference until it is.
//!
//! A repair writes what the source holds now (or removes an orphan) under the version of the
//! deployment's cluster time read before the source is, guarded as every delivery write is: a
//! delivery that wrote a newer version since is left as it is, and a later write's delivery
//! replaces the repair. The corrections go through the one transaction runner in batches of
//! [`REPAIR_BATCH`], the first with the audit record.

use std::collections::{HashMap, HashSet};

use bson::{Bson, Document, doc};
use serde_json::{Value, json};

use crate::audit::AuditEntry;
use crate::outbox_view::{Digest, digest, key_text};
use crate::reconcile::{Found, read_collection, server};
use handoff_domain::delivery::{Operation, Request, Status};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;
use handoff_domain::token::canonical_text;
use handoff_mongo::delivery::{self, Correction, Names, Projection, RECORD_FIELD, VERSION_FIELD};
use handoff_mongo::transaction::Failure;
use handoff_mongo::{Connection, operator, window};

/// Corrections per transaction.
pub const REPAIR_BATCH: usize = 100;
/// The most open entries whose keys are taken as in flight (more: run the delivery first).
const MAX_OPEN: i64 = 100_000;

/// What to compare.
#[derive(Clone, Debug)]
pub struct Options {
    pub names: Names,
    /// The watched collection (in `names.database`).
    pub collection: String,
    pub projection: (String, String),
    pub chunk_size: u32,
    /// Keys listed per kind.
    pub limit: usize,
    /// `--repair` with its reason.
    pub repair: Option<String>,
    pub command: String,
}

/// The comparison, and the repair when asked.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub missing: Found,
    pub orphan: Found,
    pub stale: Found,
    pub in_flight: u64,
    pub compared: u64,
    /// Corrections written (and those a newer delivery write made unnecessary).
    pub repaired: Option<(u64, u64)>,
}

impl Report {
    pub fn differences(&self) -> u64 {
        self.missing.count + self.orphan.count + self.stale.count
    }

    pub fn to_json(&self) -> Value {
        let found = |f: &Found| json!({ "count": f.count, "keys": f.keys });
        json!({
            "compared": self.compared,
            "missing": found(&self.missing),
            "orphan": found(&self.orphan),
            "stale": found(&self.stale),
            "in_flight": self.in_flight,
            "repaired": self.repaired.map(|(written, superseded)| json!({
                "written": written, "superseded": superseded,
            })),
        })
    }

    pub fn human(&self) -> String {
        let mut text = format!(
            "{} keys compared: {} missing, {} orphan, {} stale, {} in flight\n",
            self.compared, self.missing.count, self.orphan.count, self.stale.count, self.in_flight
        );
        for (kind, found) in [
            ("missing", &self.missing),
            ("orphan", &self.orphan),
            ("stale", &self.stale),
        ] {
            for key in &found.keys {
                text.push_str(&format!("  {kind:<8} {key}\n"));
            }
        }
        if let Some((written, superseded)) = self.repaired {
            text.push_str(&format!(
                "repaired: {written} corrections written, {superseded} left to newer delivery writes\n"
            ));
        }
        text
    }
}

/// The lane text of a key, as admission computes it.
fn lane(key: &Bson) -> String {
    canonical_text(&doc! { "k": key.clone() })
}

/// A projection document's digest, without the fields the delivery adds.
fn projected_digest(mut document: Document) -> Digest {
    document.remove(VERSION_FIELD);
    document.remove(RECORD_FIELD);
    digest(&document)
}

fn note(found: &mut Found, limit: usize, key: &Bson) {
    found.count += 1;
    if found.keys.len() < limit {
        found.keys.push(escape_untrusted(&key_text(key), 200));
    }
}

/// Compares, then repairs when asked.
pub fn reconcile(connection: &Connection, options: &Options) -> Result<Report> {
    let names = &options.names;
    let version = match &options.repair {
        Some(_) => Some(
            connection
                .block_on(window::cluster_time(connection))
                .ok_or_else(|| {
                    HandoffError::Unavailable(
                        "the deployment's cluster time could not be read for the repair's version"
                            .into(),
                    )
                })?,
        ),
        None => None,
    };
    // Keys the delivery still has to write.
    let mut open = HashSet::new();
    for status in [Status::Pending, Status::InProgress, Status::Failed] {
        let entries = connection
            .block_on(delivery::entries_of(
                connection, names, status, None, MAX_OPEN,
            ))
            .map_err(server)?;
        if entries.len() as i64 >= MAX_OPEN {
            return Err(HandoffError::Conflict(format!(
                "more than {MAX_OPEN} records of the delivery are not settled yet: run the \
                 delivery first"
            )));
        }
        open.extend(
            entries
                .iter()
                .filter_map(|e| e.get_str("lane").ok().map(str::to_string)),
        );
    }
    let (db, coll) = (&options.projection.0, &options.projection.1);
    let mut projected: HashMap<String, (Bson, Digest)> = HashMap::new();
    connection.block_on(read_collection(
        connection,
        (db, coll),
        options.chunk_size,
        "reading the projection",
        |documents| {
            for document in documents {
                if let Some(key) = document.get("_id").cloned() {
                    projected.insert(lane(&key), (key, projected_digest(document)));
                }
            }
            Ok(())
        },
    ))?;
    let mut report = Report::default();
    let mut to_write: Vec<Bson> = Vec::new();
    let limit = options.limit;
    connection.block_on(read_collection(
        connection,
        (&names.database, &options.collection),
        options.chunk_size,
        "reading the watched collection",
        |documents| {
            for document in documents {
                let Some(key) = document.get("_id").cloned() else {
                    continue;
                };
                report.compared += 1;
                let lane = lane(&key);
                let held = projected.remove(&lane);
                if open.contains(&lane) {
                    report.in_flight += 1;
                    continue;
                }
                match held {
                    None => {
                        note(&mut report.missing, limit, &key);
                        to_write.push(key);
                    }
                    Some((_, held)) if held != digest(&document) => {
                        note(&mut report.stale, limit, &key);
                        to_write.push(key);
                    }
                    Some(_) => {}
                }
            }
            Ok(())
        },
    ))?;
    let mut to_remove = Vec::new();
    for (lane, (key, _)) in projected {
        if open.contains(&lane) {
            report.in_flight += 1;
        } else {
            note(&mut report.orphan, limit, &key);
            to_remove.push(key);
        }
    }
    if let (Some(reason), Some(version)) = (&options.repair, version) {
        report.repaired = Some(repair(
            connection, options, reason, version, &report, &to_write, &to_remove,
        )?);
    }
    Ok(report)
}

/// The corrections of the differences found, in batches, the first with the audit record.
fn repair(
    connection: &Connection,
    options: &Options,
    reason: &str,
    version: bson::Timestamp,
    report: &Report,
    to_write: &[Bson],
    to_remove: &[Bson],
) -> Result<(u64, u64)> {
    let names = &options.names;
    let audit = AuditEntry {
        consumer: names.consumer.clone(),
        source: format!("{}.{}", names.database, options.collection),
        command: options.command.clone(),
        from: Bson::Document(doc! {
            "missing": report.missing.count as i64, "orphan": report.orphan.count as i64,
            "stale": report.stale.count as i64,
        }),
        to: Bson::Document(
            doc! { "projection": format!("{}.{}", options.projection.0, options.projection.1) },
        ),
        reason: reason.to_string(),
        evidence: doc! { "delivery": &names.delivery, "version": version },
    }
    .document();
    let record = format!(
        "@repair/{}",
        audit
            .get_object_id("_id")
            .map(|id| id.to_hex())
            .unwrap_or_default()
    );
    let mut requests: Vec<(String, Request)> = Vec::new();
    for keys in to_write.chunks(REPAIR_BATCH) {
        let documents = connection
            .block_on(operator::documents(
                connection,
                &names.database,
                &options.collection,
                doc! { "_id": { "$in": keys.to_vec() } },
                None,
                "reading the watched collection",
            ))
            .map_err(server)?;
        let mut by_lane: HashMap<String, Document> = documents
            .into_iter()
            .filter_map(|d| Some((lane(d.get("_id")?), d)))
            .collect();
        for key in keys {
            let lane = lane(key);
            // A document gone since it was compared is removed.
            let request = match by_lane.remove(&lane) {
                Some(document) => request(key, Operation::Upsert, document, version),
                None => request(key, Operation::Delete, Document::new(), version),
            };
            requests.push((lane, request));
        }
    }
    for key in to_remove {
        requests.push((
            lane(key),
            request(key, Operation::Delete, Document::new(), version),
        ));
    }
    let (mut written, mut superseded) = (0, 0);
    let mut audit = Some(audit);
    let projection = (options.projection.0.as_str(), options.projection.1.as_str());
    for batch in requests.chunks(REPAIR_BATCH) {
        let corrections: Vec<Correction<'_>> = batch
            .iter()
            .map(|(key, request)| Correction { key, request })
            .collect();
        let done = connection
            .block_on(delivery::correct(
                connection,
                names,
                projection,
                &corrections,
                &record,
                audit.as_ref(),
            ))
            .map_err(|failure| match failure {
                Failure::Refused(never) => match never {},
                Failure::Failed(error) | Failure::Unknown(error) => server(error),
            })?;
        audit = None;
        for outcome in done {
            match outcome {
                Projection::Applied => written += 1,
                _ => superseded += 1,
            }
        }
    }
    Ok((written, superseded))
}

fn request(key: &Bson, operation: Operation, body: Document, version: bson::Timestamp) -> Request {
    Request {
        target: key.clone(),
        operation,
        version: Some(version),
        body,
        headers: Vec::new(),
    }
}
