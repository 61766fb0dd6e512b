//! `deliver reconcile`: a delivery's MongoDB projection compared with what the policy makes of
//! the watched collection as it is now, by key and content — **missing** (the policy writes the
//! key, the projection lacks it), **orphan** (the projection holds a key no source document is
//! written to, or one the policy deletes), **stale** (in both, different; field order does not
//! count, nor the fields the delivery adds) — and, with `--repair`, corrected.
//!
//! What the projection should hold goes the way a change does: each source document, as a
//! `snapshot` event, is decided by the consumer's policy (the records it would hand off; a
//! document it skips or quarantines is **held**, never a difference), and each record by the
//! delivery's effects (the policy's `delivery` export, or the default's): an upsert says what the
//! key holds, a delete that it holds nothing. A record the effects refuse is counted apart
//! (**refused**: the delivery makes it dead). The policy must be the consumer's own (the
//! checkpoint records which one its runs decide with).
//!
//! Keys with records the delivery has not settled yet (pending, in progress or failed entries)
//! are **in flight**: the delivery will write them, so they are counted apart, never as
//! differences. Run the consumer and the delivery first: a change not yet handed off is a
//! difference until it is.
//!
//! A repair reads each differing document again after a fresh stream position, asks the policy
//! and the effects again, and writes their upserts and deletes (an orphan is deleted) under the
//! version of that position's cluster time, guarded as every delivery write is: a delivery that
//! wrote a newer version since is left as it is, and a later write's delivery replaces the
//! repair. The corrections go through the one transaction runner in batches of
//! [`REPAIR_BATCH`], the first with the audit record.

use std::collections::{HashMap, HashSet};

use bson::{Bson, Document, Timestamp, doc};
use serde_json::{Value, json};

use crate::audit::AuditEntry;
use crate::outbox_view::{Digest, digest, key_text};
use crate::reconcile::in_flight::position_now;
use crate::reconcile::{Found, read_collection, reads_of, server};
use handoff_backend::snapshot::{Read, SnapshotPosition};
use handoff_domain::checkpoint;
use handoff_domain::delivery::{Operation, Request, Status};
use handoff_domain::effect::{Decided as Effect, EffectPolicy, SinkKind};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;
use handoff_domain::token::canonical_text;
use handoff_mongo::delivery::{self, Correction, Names, Projection, RECORD_FIELD, VERSION_FIELD};
use handoff_mongo::transaction::Failure;
use handoff_mongo::{Connection, registry};
use handoff_run::snapshot::{Fate, Snapshots};

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
    /// The consumer's checkpoints (in `names.database`).
    pub checkpoints: String,
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
    /// Source documents whose records the effects refuse (by source key).
    pub refused: Found,
    pub in_flight: u64,
    /// Source documents the consumer's policy skips or quarantines as they are now.
    pub held: u64,
    pub compared: u64,
    /// Who decided the effects (`default`, or the policy).
    pub effects: String,
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
            "refused": found(&self.refused),
            "in_flight": self.in_flight,
            "held_by_policy": self.held,
            "effects": self.effects,
            "repaired": self.repaired.map(|(written, superseded)| json!({
                "written": written, "superseded": superseded,
            })),
        })
    }

    pub fn human(&self) -> String {
        let mut text = format!(
            "{} keys compared: {} missing, {} orphan, {} stale, {} in flight, {} held by the \
             policy, {} refused (effects: {})\n",
            self.compared,
            self.missing.count,
            self.orphan.count,
            self.stale.count,
            self.in_flight,
            self.held,
            self.refused.count,
            escape_untrusted(&self.effects, 200),
        );
        for (kind, found) in [
            ("missing", &self.missing),
            ("orphan", &self.orphan),
            ("stale", &self.stale),
            ("refused", &self.refused),
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

/// The digest of what an upsert makes the projection hold (the body under the target key).
fn written_digest(request: &Request) -> Digest {
    let mut document = request.body.clone();
    document.insert("_id", request.target.clone());
    digest(&document)
}

fn note(found: &mut Found, limit: usize, key: &Bson) {
    found.count += 1;
    if found.keys.len() < limit {
        found.keys.push(escape_untrusted(&key_text(key), 200));
    }
}

/// Who decides: the consumer's policy (the records of a document) and the delivery's effects
/// (what each record does to the projection).
pub struct Deciders<'a, 'b> {
    pub snapshots: &'a Snapshots<'b>,
    pub effects: &'a mut dyn EffectPolicy,
}

/// What the policy and the effects make of some documents (each by its index in the reads).
struct Decisions {
    /// Each record's request, with the index of the document it came from.
    requests: Vec<(usize, Request)>,
    /// Documents the policy skips or quarantines.
    held: Vec<usize>,
    /// Documents with a record the effects refuse.
    refused: Vec<usize>,
}

impl Deciders<'_, '_> {
    /// What the policy and the effects make of `reads` at `at`.
    fn decide(
        &mut self,
        delivery: &str,
        reads: &[Read],
        at: &SnapshotPosition,
    ) -> Result<Decisions> {
        let decided = self.snapshots.decide(reads, at)?;
        let held = decided
            .fates
            .iter()
            .enumerate()
            .filter(|(_, fate)| **fate != Fate::HandedOff)
            .map(|(i, _)| i)
            .collect();
        let mut requests = Vec::with_capacity(decided.outbox.len());
        let mut refused = Vec::new();
        for (record, origin) in decided.outbox.iter().zip(&decided.origins) {
            let record = Document::try_from(record.as_ref())
                .map_err(|e| HandoffError::Internal(e.into()))?;
            match self
                .effects
                .effect(delivery, SinkKind::Projection, &record)?
            {
                Effect::Request(request) => requests.push((*origin, *request)),
                Effect::Refused(_) => refused.push(*origin),
            }
        }
        Ok(Decisions {
            requests,
            held,
            refused,
        })
    }
}

/// Compares, then repairs when asked.
pub fn reconcile(
    connection: &Connection,
    options: &Options,
    deciders: &mut Deciders<'_, '_>,
) -> Result<Report> {
    connection.block_on(compare(connection, options, deciders))
}

async fn compare(
    connection: &Connection,
    options: &Options,
    deciders: &mut Deciders<'_, '_>,
) -> Result<Report> {
    let names = &options.names;
    let source_name = format!("{}.{}", names.database, options.collection);
    let (loaded, _) = crate::reconcile::checkpoint(
        connection,
        (&names.database, &options.checkpoints, &names.consumer),
        &source_name,
    )
    .await?;
    checkpoint::check_policy(&loaded, &deciders.snapshots.binding(), "deliver reconcile")?;
    // Keys the delivery still has to write.
    let mut open = HashSet::new();
    for status in [Status::Pending, Status::InProgress, Status::Failed] {
        let entries = delivery::entries_of(connection, names, status, None, MAX_OPEN)
            .await
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
    read_collection(
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
    )
    .await?;
    let mut report = Report {
        effects: deciders.effects.describe(),
        ..Report::default()
    };
    let at = now(connection, &names.database, &options.collection).await?;
    // Source keys whose effects differ from what the projection holds, and keys to remove.
    let mut to_write: Vec<Bson> = Vec::new();
    let mut written_keys: HashSet<String> = HashSet::new();
    let mut to_remove: Vec<Bson> = Vec::new();
    let limit = options.limit;
    read_collection(
        connection,
        (&names.database, &options.collection),
        options.chunk_size,
        "reading the watched collection",
        |documents| {
            let reads: Vec<Read> = documents.into_iter().filter_map(Read::of).collect();
            report.compared += reads.len() as u64;
            let decided = deciders.decide(&names.delivery, &reads, &at)?;
            for index in decided.held {
                report.held += 1;
                projected.remove(&lane(&reads[index].key));
            }
            for index in decided.refused {
                note(&mut report.refused, limit, &reads[index].key);
            }
            for (origin, request) in decided.requests {
                let source = &reads[origin].key;
                let target = lane(&request.target);
                let held = projected.remove(&target);
                if open.contains(&lane(source)) || open.contains(&target) {
                    report.in_flight += 1;
                    continue;
                }
                let differs = match (request.operation, held) {
                    (Operation::Upsert, None) => {
                        note(&mut report.missing, limit, &request.target);
                        true
                    }
                    (Operation::Upsert, Some((_, held))) if held != written_digest(&request) => {
                        note(&mut report.stale, limit, &request.target);
                        true
                    }
                    // The policy deletes what the projection still holds.
                    (Operation::Delete, Some((key, _))) => {
                        note(&mut report.orphan, limit, &key);
                        to_remove.push(key);
                        false
                    }
                    _ => false,
                };
                if differs && written_keys.insert(lane(source)) {
                    to_write.push(source.clone());
                }
            }
            Ok(())
        },
    )
    .await?;
    for (lane, (key, _)) in projected {
        if open.contains(&lane) {
            report.in_flight += 1;
        } else {
            note(&mut report.orphan, limit, &key);
            to_remove.push(key);
        }
    }
    if let Some(reason) = &options.repair {
        let differences = Differences {
            to_write: &to_write,
            to_remove: &to_remove,
        };
        report.repaired =
            Some(repair(connection, options, deciders, reason, &report, differences).await?);
    }
    Ok(report)
}

/// The stream's current position as a snapshot's.
async fn now(
    connection: &Connection,
    database: &str,
    collection: &str,
) -> Result<SnapshotPosition> {
    let (token, at) = position_now(connection, database, collection).await?;
    Ok(SnapshotPosition {
        token,
        cluster_time: at.cluster_time(),
    })
}

/// What a repair corrects: the source keys whose effects differ, and the projection's keys to
/// remove.
struct Differences<'a> {
    to_write: &'a [Bson],
    to_remove: &'a [Bson],
}

/// The corrections of the differences found, in batches, the first with the audit record.
async fn repair(
    connection: &Connection,
    options: &Options,
    deciders: &mut Deciders<'_, '_>,
    reason: &str,
    report: &Report,
    differences: Differences<'_>,
) -> Result<(u64, u64)> {
    let names = &options.names;
    registry::register(connection, &names.database, &[&names.ledger, &names.audit]).await?;
    registry::register(connection, &options.projection.0, &[&options.projection.1]).await?;
    let mut audit = Some(
        AuditEntry {
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
            evidence: doc! { "delivery": &names.delivery, "effects": &report.effects },
        }
        .document(),
    );
    let record = format!(
        "@repair/{}",
        audit
            .as_ref()
            .and_then(|a| a.get_object_id("_id").ok())
            .map(|id| id.to_hex())
            .unwrap_or_default()
    );
    let projection = (options.projection.0.as_str(), options.projection.1.as_str());
    let commit = async |requests: Vec<Request>, audit: Option<Document>| -> Result<(u64, u64)> {
        let keys: Vec<String> = requests.iter().map(|r| lane(&r.target)).collect();
        let corrections: Vec<Correction<'_>> = requests
            .iter()
            .zip(&keys)
            .map(|(request, key)| Correction { key, request })
            .collect();
        let done = delivery::correct(
            connection,
            names,
            projection,
            &corrections,
            &record,
            audit.as_ref(),
        )
        .await
        .map_err(|failure| match failure {
            Failure::Refused(never) => match never {},
            Failure::Failed(error) | Failure::Unknown(error) => server(error),
        })?;
        let written = done.iter().filter(|o| **o == Projection::Applied).count() as u64;
        Ok((written, done.len() as u64 - written))
    };
    let (mut written, mut superseded) = (0, 0);
    for keys in differences.to_write.chunks(REPAIR_BATCH) {
        // The position first, then the documents: a change after it has a newer version.
        let at = now(connection, &names.database, &options.collection).await?;
        // A document gone since it was compared is read as gone: the policy says what then.
        let reads = reads_of(connection, (&names.database, &options.collection), keys).await?;
        let requests: Vec<Request> = deciders
            .decide(&names.delivery, &reads, &at)?
            .requests
            .into_iter()
            .map(|(_, request)| request)
            .filter(|r| matches!(r.operation, Operation::Upsert | Operation::Delete))
            .collect();
        if requests.is_empty() {
            continue;
        }
        let (w, s) = commit(requests, audit.take()).await?;
        (written, superseded) = (written + w, superseded + s);
    }
    for keys in differences.to_remove.chunks(REPAIR_BATCH) {
        let at = now(connection, &names.database, &options.collection).await?;
        let requests = keys
            .iter()
            .map(|key| removal(key, at.cluster_time))
            .collect();
        let (w, s) = commit(requests, audit.take()).await?;
        (written, superseded) = (written + w, superseded + s);
    }
    Ok((written, superseded))
}

/// The removal of an orphan at `version`.
fn removal(key: &Bson, version: Timestamp) -> Request {
    Request {
        target: key.clone(),
        operation: Operation::Delete,
        version: Some(version),
        body: Document::new(),
        headers: Vec::new(),
    }
}
