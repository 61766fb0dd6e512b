//! `bulkWrite` (MongoDB 8.0, wire version 25): inserts, updates and deletes across namespaces in
//! one command, with per-operation results returned in a cursor.

use bson::{Bson, Document, doc};

use super::Ctx;
use super::crud::{delete_statement, insert_statement, is_write_error, opt_doc, update_statement};
use crate::error::{CmdResult, CommandError};
use crate::namespace::Namespace;

/// The first wire version that has `bulkWrite`.
pub const BULK_WRITE_WIRE_VERSION: i32 = 25;

/// Totals over the operations that succeeded.
#[derive(Default)]
struct Totals {
    inserted: i32,
    matched: i32,
    modified: i32,
    upserted: i32,
    deleted: i32,
}

pub async fn bulk_write(ctx: &Ctx<'_>) -> CmdResult<Document> {
    if ctx.shared.config.max_wire_version < BULK_WRITE_WIRE_VERSION {
        return Err(CommandError::new(59, "no such command: 'bulkWrite'"));
    }
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "bulkWrite may only be run against the admin database.",
        ));
    }
    if ctx.shared.feature_compatibility() < (8, 0) {
        return Err(CommandError::new(
            115,
            "BulkWrite may not be run without featureFlagBulkWriteCommand enabled",
        ));
    }
    let namespaces = namespaces(&ctx.cmd)?;
    let ops = documents(&ctx.cmd, "ops")?;
    if ops.is_empty() {
        return Err(CommandError::new(
            2,
            "Write batch sizes must be between 1 and 100000. Got 0 operations.",
        ));
    }
    let ordered = ctx.bool_field("ordered", true);
    let errors_only = ctx.bool_field("errorsOnly", false);
    let mut totals = Totals::default();
    let mut results = Vec::new();
    let mut errors = 0i32;
    for (idx, op) in ops.iter().enumerate() {
        let outcome = operation(ctx, &namespaces, op, &mut totals).await;
        let mut entry = match outcome {
            Ok(entry) => entry,
            Err(e) if is_write_error(&e) => {
                errors += 1;
                doc! {"ok": 0.0, "code": e.code, "codeName": e.code_name.clone(), "errmsg": e.message.clone(), "n": 0}
            }
            Err(e) => return Err(e),
        };
        let failed = entry.get_f64("ok").is_ok_and(|ok| ok == 0.0);
        if failed || !errors_only {
            entry.insert("idx", idx as i32);
            results.push(Bson::Document(entry));
        }
        if failed && ordered {
            break;
        }
    }
    Ok(doc! {
        "cursor": {"id": 0i64, "firstBatch": results, "ns": "admin.$cmd.bulkWrite"},
        "nErrors": errors,
        "nInserted": totals.inserted,
        "nMatched": totals.matched,
        "nModified": totals.modified,
        "nUpserted": totals.upserted,
        "nDeleted": totals.deleted,
    })
}

/// One operation: `{insert: i, document}`, `{update: i, filter, updateMods, multi?, upsert?}` or
/// `{delete: i, filter, multi?}`, where `i` indexes `nsInfo`. Its result entry without `idx`.
async fn operation(
    ctx: &Ctx<'_>,
    namespaces: &[Namespace],
    op: &Document,
    totals: &mut Totals,
) -> CmdResult<Document> {
    let Some((kind, index)) = op.iter().next() else {
        return Err(CommandError::failed_to_parse("empty bulkWrite operation"));
    };
    let ns = crate::values::as_f64(index)
        .filter(|i| i.fract() == 0.0 && *i >= 0.0)
        .and_then(|i| namespaces.get(i as usize))
        .ok_or_else(|| {
            CommandError::new(
                2,
                format!("BulkWrite {kind} op has an invalid nsInfo index"),
            )
        })?;
    match kind.as_str() {
        "insert" => {
            let document = match op.get("document") {
                Some(Bson::Document(d)) => d.clone(),
                _ => {
                    return Err(CommandError::failed_to_parse(
                        "BSON field 'bulkWrite.ops.document' is missing but a required field",
                    ));
                }
            };
            insert_statement(ctx, ns, document).await?;
            totals.inserted += 1;
            Ok(doc! {"ok": 1.0, "n": 1})
        }
        "update" => {
            let outcome = update_statement(ctx, ns, op, "filter", "updateMods").await?;
            totals.matched += outcome.matched as i32;
            totals.modified += outcome.modified as i32;
            let mut entry =
                doc! {"ok": 1.0, "n": outcome.matched as i32, "nModified": outcome.modified as i32};
            if let Some(id) = outcome.upserted {
                totals.upserted += 1;
                entry.insert("n", 1);
                entry.insert("upserted", doc! {"_id": id});
            }
            Ok(entry)
        }
        "delete" => {
            let filter = opt_doc(op, "filter")?;
            let multi = matches!(op.get("multi"), Some(Bson::Boolean(true)));
            let n = delete_statement(ctx, ns, &filter, !multi).await?;
            totals.deleted += n as i32;
            Ok(doc! {"ok": 1.0, "n": n as i32})
        }
        other => Err(CommandError::failed_to_parse(format!(
            "Unrecognized bulkWrite operation: {other}"
        ))),
    }
}

/// `nsInfo`: the namespaces the operations name by index.
fn namespaces(cmd: &Document) -> CmdResult<Vec<Namespace>> {
    documents(cmd, "nsInfo")?
        .iter()
        .map(|info| {
            let full = info.get_str("ns").map_err(|_| {
                CommandError::failed_to_parse(
                    "BSON field 'bulkWrite.nsInfo.ns' is missing but a required field",
                )
            })?;
            let ns = Namespace::parse(full).ok_or_else(|| {
                CommandError::new(73, format!("Invalid namespace specified '{full}'"))
            })?;
            super::validate_db_name(&ns.db)?;
            super::validate_collection_name(&ns.coll)?;
            Ok(ns)
        })
        .collect()
}

fn documents<'d>(cmd: &'d Document, key: &str) -> CmdResult<Vec<&'d Document>> {
    match cmd.get(key) {
        Some(Bson::Array(items)) => items
            .iter()
            .map(|item| match item {
                Bson::Document(d) => Ok(d),
                _ => Err(CommandError::type_mismatch(format!(
                    "bulkWrite.{key} entries must be objects"
                ))),
            })
            .collect(),
        _ => Err(CommandError::failed_to_parse(format!(
            "BSON field 'bulkWrite.{key}' is missing but a required field"
        ))),
    }
}
