//! insert / update / delete / findAndModify / find / count / distinct / aggregate / cursors.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, Document, Timestamp, doc, oid::ObjectId};

use super::{Ctx, txn};
use crate::cursor::{Cursor, FindCursor};
use crate::error::{CmdResult, CommandError, MAX_BSON_OBJECT_SIZE};
use crate::matcher;
use crate::namespace::Namespace;
use crate::oplog::EventKind;
use crate::state::Parts;
use crate::storage::{Change, Txn, WriteError};
use crate::update::{self, UpdateSpec};
use crate::values::{DocKey, cmp_values, doc_key};

const DEFAULT_BATCH: usize = 101;

/// Runs one write statement, waiting while a non-transactional write is blocked by an open
/// transaction. A failed statement inside a transaction aborts the transaction.
async fn write_statement<T>(
    ctx: &Ctx<'_>,
    mut f: impl FnMut(&mut Parts<'_>) -> Result<T, WriteError>,
) -> CmdResult<T> {
    let started = Instant::now();
    let lifetime = ctx.shared.config.transaction_lifetime;
    loop {
        let mut woken = pin!(ctx.shared.txn_ended.notified());
        woken.as_mut().enable();
        {
            let mut st = ctx.shared.lock();
            let mut parts = st.parts(ctx.txn_key());
            if ctx.in_txn() && parts.txn.is_none() {
                let n = ctx.session.as_ref().and_then(|s| s.txn_number).unwrap_or(0);
                return Err(CommandError::no_such_transaction(n));
            }
            match f(&mut parts) {
                Ok(v) => {
                    let wrote = !ctx.in_txn();
                    drop(st);
                    if wrote {
                        ctx.shared.history_grew.notify_waiters();
                    }
                    return Ok(v);
                }
                Err(WriteError::Command(e)) => {
                    drop(st);
                    if ctx.in_txn() {
                        txn::abort_after_error(ctx);
                    }
                    return Err(e);
                }
                Err(WriteError::Blocked) => {
                    if started.elapsed() > lifetime && st.reap_expired(lifetime) > 0 {
                        continue;
                    }
                }
            }
        }
        if started.elapsed() > lifetime + Duration::from_secs(5) {
            return Err(CommandError::new(
                24,
                "Unable to acquire lock: a transaction holds the document",
            ));
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), woken).await;
    }
}

/// Errors reported per statement in `writeErrors` rather than failing the command.
pub(super) fn is_write_error(e: &CommandError) -> bool {
    !matches!(e.code, 112 | 251 | 225 | 24 | 20 | 263 | 50768)
}

fn write_error_doc(index: usize, e: &CommandError) -> Bson {
    Bson::Document(
        doc! {"index": index as i32, "code": e.code, "codeName": e.code_name.clone(), "errmsg": e.message.clone()},
    )
}

fn duplicate_key(ns: &Namespace, id: &Bson) -> CommandError {
    let shown = match id {
        Bson::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    };
    CommandError::new(
        11000,
        format!(
            "E11000 duplicate key error collection: {ns} index: _id_ dup key: {{ _id: {shown} }}"
        ),
    )
}

fn doc_array(ctx: &Ctx<'_>, key: &str) -> CmdResult<Vec<Document>> {
    match ctx.cmd.get(key) {
        Some(Bson::Array(a)) => a
            .iter()
            .map(|b| match b {
                Bson::Document(d) => Ok(d.clone()),
                _ => Err(CommandError::type_mismatch(format!(
                    "{key} entries must be objects"
                ))),
            })
            .collect(),
        _ => Err(CommandError::failed_to_parse(format!(
            "BSON field '{}.{key}' is missing but a required field",
            ctx.name
        ))),
    }
}

pub(super) fn opt_doc(d: &Document, key: &str) -> CmdResult<Document> {
    match d.get(key) {
        None | Some(Bson::Null) => Ok(Document::new()),
        Some(Bson::Document(x)) => Ok(x.clone()),
        Some(_) => Err(CommandError::type_mismatch(format!(
            "'{key}' must be an object"
        ))),
    }
}

fn with_id_first(mut d: Document) -> (Bson, Document) {
    match d.remove("_id") {
        Some(id) => {
            let mut out = doc! {"_id": id.clone()};
            out.extend(d);
            (id, out)
        }
        None => {
            let id = Bson::ObjectId(ObjectId::new());
            let mut out = doc! {"_id": id.clone()};
            out.extend(d);
            (id, out)
        }
    }
}

fn insert_change(
    p: &Parts<'_>,
    ns: &Namespace,
    id: Bson,
    doc: Document,
) -> Result<Change, WriteError> {
    if matches!(id, Bson::Array(_)) {
        return Err(CommandError::new(2, "can't use an array for _id").into());
    }
    let key = doc_key(&id);
    if p.store.get(ns, &key, p.txn.as_deref()).is_some() {
        return Err(duplicate_key(ns, &id).into());
    }
    let doc = Arc::new(doc);
    Ok(Change {
        ns: ns.clone(),
        key,
        new: Some(doc.clone()),
        event: EventKind::Insert { id, doc },
    })
}

fn apply(p: &mut Parts<'_>, changes: Vec<Change>) -> Result<(), WriteError> {
    let min = p.min_snapshot;
    p.store.apply(p.oplog, p.txn.as_deref_mut(), changes, min)
}

pub async fn insert(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let docs = doc_array(ctx, "documents")?;
    let ordered = ctx.bool_field("ordered", true);
    let mut n = 0i32;
    let mut errors = Vec::new();
    for (i, d) in docs.into_iter().enumerate() {
        match insert_statement(ctx, &ns, d).await {
            Ok(()) => n += 1,
            Err(e) if is_write_error(&e) => {
                errors.push(write_error_doc(i, &e));
                if ordered {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    let mut reply = doc! {"n": n};
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    Ok(reply)
}

/// One document inserted (an `_id` added first when it has none).
pub(super) async fn insert_statement(ctx: &Ctx<'_>, ns: &Namespace, d: Document) -> CmdResult<()> {
    let (id, d) = with_id_first(d);
    let size = d.to_vec().map_or(usize::MAX, |b| b.len());
    if size > MAX_BSON_OBJECT_SIZE {
        // Refused before it is stored, like any failed statement of a transaction.
        if ctx.in_txn() {
            txn::abort_after_error(ctx);
        }
        return Err(CommandError::new(
            10334,
            format!(
                "object to insert too large. size in bytes: {size}, max size: {MAX_BSON_OBJECT_SIZE}"
            ),
        ));
    }
    write_statement(ctx, |p| {
        let change = insert_change(p, ns, id.clone(), d.clone())?;
        apply(p, vec![change])
    })
    .await
}

/// Matching documents in the reader's view, sorted if asked.
fn matching(
    p: &Parts<'_>,
    ns: &Namespace,
    filter: &Document,
    sort: Option<&Document>,
) -> CmdResult<Vec<(DocKey, Arc<Document>)>> {
    let mut out = Vec::new();
    for (k, d) in p.store.candidates(ns, filter, p.txn.as_deref()) {
        if matcher::matches(&d, filter)? {
            out.push((k, d));
        }
    }
    if let Some(s) = sort {
        sort_docs(&mut out, s, |x| &x.1);
    }
    Ok(out)
}

pub(super) fn sort_docs<T>(items: &mut [T], sort: &Document, doc_of: impl Fn(&T) -> &Document) {
    if sort.is_empty() {
        return;
    }
    // Natural order is the order the documents come in.
    if let Some(dir) = sort.get("$natural")
        && sort.len() == 1
    {
        if crate::values::as_f64(dir).is_some_and(|n| n < 0.0) {
            items.reverse();
        }
        return;
    }
    items.sort_by(|a, b| {
        for (path, dir) in sort {
            let desc = crate::values::as_f64(dir).is_some_and(|n| n < 0.0);
            let va = crate::values::get_path(doc_of(a), path)
                .cloned()
                .unwrap_or(Bson::Null);
            let vb = crate::values::get_path(doc_of(b), path)
                .cloned()
                .unwrap_or(Bson::Null);
            let o = cmp_values(&va, &vb);
            let o = if desc { o.reverse() } else { o };
            if o.is_ne() {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    });
}

pub(super) struct UpdateOutcome {
    pub(super) matched: i64,
    pub(super) modified: i64,
    pub(super) upserted: Option<Bson>,
    /// For findAndModify: the document before and after.
    before: Option<Arc<Document>>,
    after: Option<Arc<Document>>,
}

#[allow(clippy::too_many_arguments)]
fn update_one_statement(
    p: &mut Parts<'_>,
    ns: &Namespace,
    filter: &Document,
    spec: &UpdateSpec,
    upsert: bool,
    multi: bool,
    sort: Option<&Document>,
) -> Result<UpdateOutcome, WriteError> {
    let found = matching(p, ns, filter, sort)?;
    if found.is_empty() {
        if !upsert {
            return Ok(UpdateOutcome {
                matched: 0,
                modified: 0,
                upserted: None,
                before: None,
                after: None,
            });
        }
        let new_doc = update::build_upsert(filter, spec)?;
        let id = new_doc.get("_id").cloned().unwrap_or(Bson::Null);
        let change = insert_change(p, ns, id.clone(), new_doc)?;
        let after = change.new.clone();
        apply(p, vec![change])?;
        return Ok(UpdateOutcome {
            matched: 0,
            modified: 0,
            upserted: Some(id),
            before: None,
            after,
        });
    }
    let targets: Vec<(DocKey, Arc<Document>)> = if multi {
        found
    } else {
        found.into_iter().take(1).collect()
    };
    let matched = targets.len() as i64;
    let mut changes = Vec::new();
    let (mut before, mut after) = (None, None);
    for (key, old) in targets {
        let mut new = (*old).clone();
        update::apply_update(&mut new, spec, false)?;
        let id = new.get("_id").cloned().unwrap_or(Bson::Null);
        let new = Arc::new(new);
        before = Some(old.clone());
        after = Some(new.clone());
        if *new == *old {
            continue;
        }
        let event = match spec {
            UpdateSpec::Replacement(_) => EventKind::Replace {
                id,
                doc: new.clone(),
            },
            UpdateSpec::Operators(_) | UpdateSpec::Pipeline(_) => {
                let d = update::describe_update(&old, &new, spec);
                EventKind::Update {
                    id,
                    updated: d.updated,
                    removed: d.removed,
                    truncated: d.truncated,
                    disambiguated: d.disambiguated,
                }
            }
        };
        changes.push(Change {
            ns: ns.clone(),
            key,
            new: Some(new),
            event,
        });
    }
    let modified = changes.len() as i64;
    apply(p, changes)?;
    Ok(UpdateOutcome {
        matched,
        modified,
        upserted: None,
        before,
        after,
    })
}

pub async fn update(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let statements = doc_array(ctx, "updates")?;
    let ordered = ctx.bool_field("ordered", true);
    let (mut n, mut n_modified) = (0i64, 0i64);
    let mut upserted = Vec::new();
    let mut errors = Vec::new();
    for (i, s) in statements.iter().enumerate() {
        let r = update_statement(ctx, &ns, s, "q", "u").await;
        match r {
            Ok(o) => {
                n += o.matched;
                n_modified += o.modified;
                if let Some(id) = o.upserted {
                    n += 1;
                    upserted.push(Bson::Document(doc! {"index": i as i32, "_id": id}));
                }
            }
            Err(e) if is_write_error(&e) => {
                errors.push(write_error_doc(i, &e));
                if ordered {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    let mut reply = doc! {"n": n as i32, "nModified": n_modified as i32};
    if !upserted.is_empty() {
        reply.insert("upserted", upserted);
    }
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    Ok(reply)
}

/// One update statement: its filter under `filter_key` and its update under `update_key`
/// (`q`/`u` in `update`, `filter`/`updateMods` in `bulkWrite`), `multi` and `upsert` flags.
pub(super) async fn update_statement(
    ctx: &Ctx<'_>,
    ns: &Namespace,
    s: &Document,
    filter_key: &str,
    update_key: &str,
) -> CmdResult<UpdateOutcome> {
    let filter = opt_doc(s, filter_key)?;
    let spec = update::parse_update(s.get(update_key).unwrap_or(&Bson::Null))?;
    let multi = matches!(s.get("multi"), Some(Bson::Boolean(true)));
    let upsert = matches!(s.get("upsert"), Some(Bson::Boolean(true)));
    if multi && matches!(spec, UpdateSpec::Replacement(_)) {
        return Err(CommandError::failed_to_parse(
            "multi update is not supported for replacement-style update",
        ));
    }
    matcher::validate(&filter)?;
    write_statement(ctx, |p| {
        update_one_statement(p, ns, &filter, &spec, upsert, multi, None)
    })
    .await
}

/// One delete statement: the documents matching `filter`, at most one when `just_one`.
pub(super) async fn delete_statement(
    ctx: &Ctx<'_>,
    ns: &Namespace,
    filter: &Document,
    just_one: bool,
) -> CmdResult<i64> {
    matcher::validate(filter)?;
    write_statement(ctx, |p| {
        let found = matching(p, ns, filter, None)?;
        let take = if just_one { 1 } else { found.len() };
        let changes: Vec<Change> = found
            .into_iter()
            .take(take)
            .map(|(key, d)| Change {
                ns: ns.clone(),
                key,
                new: None,
                event: EventKind::Delete {
                    id: d.get("_id").cloned().unwrap_or(Bson::Null),
                },
            })
            .collect();
        let count = changes.len() as i64;
        apply(p, changes)?;
        Ok(count)
    })
    .await
}

pub async fn delete(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let statements = doc_array(ctx, "deletes")?;
    let ordered = ctx.bool_field("ordered", true);
    let mut n = 0i64;
    let mut errors = Vec::new();
    for (i, s) in statements.iter().enumerate() {
        let r = async {
            let filter = opt_doc(s, "q")?;
            let limit = s
                .get("limit")
                .and_then(crate::values::as_f64)
                .unwrap_or(0.0);
            delete_statement(ctx, &ns, &filter, limit >= 1.0).await
        }
        .await;
        match r {
            Ok(c) => n += c,
            Err(e) if is_write_error(&e) => {
                errors.push(write_error_doc(i, &e));
                if ordered {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    let mut reply = doc! {"n": n as i32};
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    Ok(reply)
}

pub async fn find_and_modify(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let filter = opt_doc(&ctx.cmd, "query")?;
    matcher::validate(&filter)?;
    let sort = opt_doc(&ctx.cmd, "sort")?;
    let projection = opt_doc(&ctx.cmd, "fields")?;
    let remove = ctx.bool_field("remove", false);
    let return_new = ctx.bool_field("new", false);
    let upsert = ctx.bool_field("upsert", false);
    if remove {
        let removed = write_statement(ctx, |p| {
            let found = matching(p, &ns, &filter, Some(&sort))?;
            let Some((key, d)) = found.into_iter().next() else {
                return Ok(None);
            };
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            apply(
                p,
                vec![Change {
                    ns: ns.clone(),
                    key,
                    new: None,
                    event: EventKind::Delete { id },
                }],
            )?;
            Ok(Some(d))
        })
        .await?;
        let n = i32::from(removed.is_some());
        let value = match removed {
            Some(d) => Bson::Document(project(&d, &projection)?),
            None => Bson::Null,
        };
        return Ok(doc! {"lastErrorObject": {"n": n}, "value": value});
    }
    let Some(u) = ctx.cmd.get("update") else {
        return Err(CommandError::failed_to_parse(
            "Either an update or remove=true must be specified",
        ));
    };
    let spec = update::parse_update(u)?;
    let o = write_statement(ctx, |p| {
        update_one_statement(p, &ns, &filter, &spec, upsert, false, Some(&sort))
    })
    .await?;
    let mut leo = doc! {"n": 1, "updatedExisting": o.matched > 0};
    if let Some(id) = &o.upserted {
        leo.insert("upserted", id.clone());
    } else if o.matched == 0 {
        leo.insert("n", 0);
    }
    let chosen = if return_new || o.upserted.is_some() && return_new {
        o.after
    } else {
        o.before
    };
    let value = match (o.upserted.is_some(), return_new) {
        (true, false) => Bson::Null,
        _ => match chosen {
            Some(d) => Bson::Document(project(&d, &projection)?),
            None => Bson::Null,
        },
    };
    Ok(doc! {"lastErrorObject": leo, "value": value})
}

/// Applies a projection specification.
pub fn project(doc: &Document, projection: &Document) -> CmdResult<Document> {
    crate::projection::project(doc, projection)
}

/// The documents a read sees, and the cluster time of the snapshot it read at (readConcern
/// level `snapshot` outside a transaction).
struct Read {
    docs: Vec<Arc<Document>>,
    at: Option<Timestamp>,
}

fn show_ts(ts: Timestamp) -> String {
    format!("Timestamp({}, {})", ts.time, ts.increment)
}

/// The snapshot a read outside a transaction asks for with `readConcern: {level: "snapshot",
/// atClusterTime?}`: its cluster time (the current one when not given) and the commit sequence
/// number of the state at that time. `None` for any other read concern.
fn snapshot_point(ctx: &Ctx<'_>, st: &crate::state::State) -> CmdResult<Option<(Timestamp, u64)>> {
    if ctx.in_txn() {
        return Ok(None);
    }
    let rc = match ctx.cmd.get("readConcern") {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::Document(rc)) => rc,
        Some(_) => return Err(CommandError::type_mismatch("readConcern must be an object")),
    };
    let snapshot = matches!(rc.get("level"), Some(Bson::String(l)) if l == "snapshot");
    let at = match rc.get("atClusterTime") {
        None => None,
        Some(Bson::Timestamp(t)) => Some(*t),
        Some(_) => {
            return Err(CommandError::type_mismatch(
                "readConcern.atClusterTime must be a timestamp",
            ));
        }
    };
    if !snapshot {
        if at.is_some() {
            return Err(CommandError::new(
                72,
                "readConcern.atClusterTime is only valid with readConcern level 'snapshot'",
            ));
        }
        return Ok(None);
    }
    if !ctx.shared.is_replica_set() {
        return Err(CommandError::new(
            20,
            "Cannot specify snapshot readConcern without replication enabled",
        ));
    }
    let current = st.oplog.cluster_time();
    let at = at.unwrap_or(current);
    if at.time == 0 && at.increment == 0 {
        return Err(CommandError::new(
            72,
            "readConcern atClusterTime value must not be a null timestamp",
        ));
    }
    if (at.time, at.increment) > (current.time, current.increment) {
        return Err(CommandError::new(
            72,
            format!(
                "readConcern atClusterTime value must not be greater than the current clusterTime. Requested clusterTime: {}; current clusterTime: {}",
                show_ts(at),
                show_ts(current)
            ),
        ));
    }
    match st.store.seq_at(at) {
        Some(seq) => Ok(Some((at, seq))),
        None => Err(CommandError::new(
            239,
            format!(
                "Read timestamp {} is older than the oldest available timestamp {}.",
                show_ts(at),
                show_ts(st.store.history.oldest())
            ),
        )),
    }
}

fn read_docs(ctx: &Ctx<'_>, ns: &Namespace, filter: &Document) -> CmdResult<Read> {
    let mut st = ctx.shared.lock();
    let snapshot = snapshot_point(ctx, &st)?;
    let p = st.parts(ctx.txn_key());
    if ctx.in_txn() && p.txn.is_none() {
        let n = ctx.session.as_ref().and_then(|s| s.txn_number).unwrap_or(0);
        return Err(CommandError::no_such_transaction(n));
    }
    let reader = snapshot.map(|(_, seq)| Txn::reader(seq));
    let view = p.txn.as_deref().or(reader.as_ref());
    let mut docs = Vec::new();
    for (_, d) in p.store.candidates(ns, filter, view) {
        if matcher::matches(&d, filter)? {
            docs.push(d);
        }
    }
    Ok(Read {
        docs,
        at: snapshot.map(|(at, _)| at),
    })
}

fn register_cursor(
    ctx: &Ctx<'_>,
    ns: String,
    rest: VecDeque<Document>,
    at_cluster_time: Option<Timestamp>,
) -> i64 {
    if rest.is_empty() {
        return 0;
    }
    let mut st = ctx.shared.lock();
    let id = st.new_cursor_id();
    st.cursors.insert(
        id,
        Cursor::Find(FindCursor {
            ns,
            docs: rest,
            at_cluster_time,
        }),
    );
    id
}

/// A cursor reply document: `{firstBatch|nextBatch, id, ns, atClusterTime?}`.
fn cursor_doc(
    batch_key: &str,
    batch: Vec<Bson>,
    id: i64,
    ns: String,
    at: Option<Timestamp>,
) -> Document {
    let mut c = doc! {batch_key: batch, "id": id, "ns": ns};
    if let Some(at) = at {
        c.insert("atClusterTime", at);
    }
    doc! {"cursor": c}
}

fn batch_size(v: Option<&Bson>) -> CmdResult<Option<usize>> {
    match v.and_then(crate::values::as_f64) {
        None => Ok(None),
        Some(n) if n < 0.0 => Err(CommandError::bad_value("batchSize must be non-negative")),
        Some(n) => Ok(Some(n as usize)),
    }
}

/// A find's `skip`, `limit`, `singleBatch` and `batchSize`.
pub(super) struct FindOptions {
    pub(super) skip: usize,
    /// 0: no limit.
    pub(super) limit: usize,
    pub(super) single: bool,
    pub(super) batch: usize,
}

impl FindOptions {
    pub(super) fn of(ctx: &Ctx<'_>) -> CmdResult<FindOptions> {
        let skip = ctx.int_field("skip").unwrap_or(0).max(0) as usize;
        let limit = ctx.int_field("limit").unwrap_or(0);
        let single = ctx.bool_field("singleBatch", false) || limit < 0 || limit.abs() == 1;
        Ok(FindOptions {
            skip,
            limit: limit.unsigned_abs() as usize,
            single,
            batch: batch_size(ctx.cmd.get("batchSize"))?.unwrap_or(DEFAULT_BATCH),
        })
    }
}

/// A `find` command's namespace, filter, sort, projection and options, as sent.
pub(super) struct FindCommand {
    pub(super) ns: Namespace,
    pub(super) filter: Document,
    pub(super) sort: Document,
    pub(super) projection: Document,
    pub(super) options: FindOptions,
}

impl FindCommand {
    pub(super) fn of(ctx: &Ctx<'_>) -> CmdResult<FindCommand> {
        Ok(FindCommand {
            ns: ctx.ns()?,
            filter: opt_doc(&ctx.cmd, "filter")?,
            sort: opt_doc(&ctx.cmd, "sort")?,
            projection: opt_doc(&ctx.cmd, "projection")?,
            options: FindOptions::of(ctx)?,
        })
    }
}

/// A `find` over documents already read (the oplog's or the cluster catalog's): sorted by
/// `sort`, `skip` and `limit` applied when `windowed` (else the caller applied them), each
/// projected, then replied as a `find` replies.
pub(super) fn find_over(
    ctx: &Ctx<'_>,
    ns: &Namespace,
    mut docs: Vec<Document>,
    sort: &Document,
    projection: &Document,
    options: &FindOptions,
    windowed: bool,
) -> CmdResult<Document> {
    if windowed {
        sort_docs(&mut docs, sort, |d| d);
        let window = docs.into_iter().skip(options.skip);
        docs = if options.limit > 0 {
            window.take(options.limit).collect()
        } else {
            window.collect()
        };
    }
    let docs = docs
        .iter()
        .map(|d| project(d, projection))
        .collect::<CmdResult<Vec<_>>>()?;
    Ok(find_reply(ctx, ns, docs.into(), options, None))
}

/// A find's reply: the first batch of `all` and a cursor for the rest.
pub(super) fn find_reply(
    ctx: &Ctx<'_>,
    ns: &Namespace,
    mut all: VecDeque<Document>,
    options: &FindOptions,
    at: Option<Timestamp>,
) -> Document {
    let first = take_batch(
        &mut all,
        if options.single {
            usize::MAX
        } else {
            options.batch
        },
    );
    let id = if options.single {
        0
    } else {
        register_cursor(ctx, ns.to_string(), all, at)
    };
    cursor_doc("firstBatch", first, id, ns.to_string(), at)
}

pub fn find(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let FindCommand {
        ns,
        filter,
        sort,
        projection,
        options,
    } = FindCommand::of(ctx)?;
    let Read { mut docs, at } = read_docs(ctx, &ns, &filter)?;
    sort_docs(&mut docs, &sort, |d| d);
    let iter = docs.into_iter().skip(options.skip);
    let all: VecDeque<Document> = if options.limit > 0 {
        iter.take(options.limit)
            .map(|d| project(&d, &projection))
            .collect::<CmdResult<_>>()?
    } else {
        iter.map(|d| project(&d, &projection))
            .collect::<CmdResult<_>>()?
    };
    Ok(find_reply(ctx, &ns, all, &options, at))
}

pub fn count(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let filter = opt_doc(&ctx.cmd, "query")?;
    let skip = ctx.int_field("skip").unwrap_or(0).max(0) as usize;
    let limit = ctx.int_field("limit").unwrap_or(0).unsigned_abs() as usize;
    let found = read_docs(ctx, &ns, &filter)?.docs.len();
    let n = count_reply(found, skip, limit);
    Ok(doc! {"n": n as i32})
}

/// A count of `found` matches after `skip`, at most `limit` (0: no limit).
pub(super) fn count_reply(found: usize, skip: usize, limit: usize) -> usize {
    let n = found.saturating_sub(skip);
    if limit > 0 { n.min(limit) } else { n }
}

pub fn distinct(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let key = ctx
        .cmd
        .get_str("key")
        .map_err(|_| CommandError::failed_to_parse("'key' must be a string"))?;
    let filter = opt_doc(&ctx.cmd, "query")?;
    let mut values: Vec<Bson> = Vec::new();
    let read = read_docs(ctx, &ns, &filter)?;
    for d in read.docs {
        for v in matcher::resolve(&d, key).into_iter().flatten() {
            let items: Vec<Bson> = match v {
                Bson::Array(a) => a.clone(),
                other => vec![other.clone()],
            };
            for i in items {
                if !values.iter().any(|x| crate::values::values_equal(x, &i)) {
                    values.push(i);
                }
            }
        }
    }
    values.sort_by(cmp_values);
    let mut reply = doc! {"values": values};
    if let Some(at) = read.at {
        reply.insert("atClusterTime", at);
    }
    Ok(reply)
}

/// A small aggregation subset: $match, $sort, $skip, $limit, $project, $count, and $group by
/// a constant with $sum.
pub fn aggregate(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let read = read_docs(ctx, &ns, &Document::new())?;
    let docs = read.docs.into_iter().map(|d| (*d).clone()).collect();
    aggregate_over(ctx, &ns, docs, read.at)
}

/// Runs an `aggregate` command's pipeline over `docs` (read at `at`, for a snapshot read).
pub(super) fn aggregate_over(
    ctx: &Ctx<'_>,
    ns: &Namespace,
    mut docs: Vec<Document>,
    at: Option<Timestamp>,
) -> CmdResult<Document> {
    let pipeline: Vec<Document> = doc_array(ctx, "pipeline")?;
    for stage in &pipeline {
        let Some((name, arg)) = stage.iter().next() else {
            return Err(CommandError::new(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        };
        match (name.as_str(), arg) {
            ("$match", Bson::Document(f)) => {
                let mut kept = Vec::new();
                for d in docs {
                    if matcher::matches(&d, f)? {
                        kept.push(d);
                    }
                }
                docs = kept;
            }
            ("$sort", Bson::Document(s)) => sort_docs(&mut docs, s, |d| d),
            ("$skip", v) => {
                let n = crate::values::as_f64(v).unwrap_or(0.0).max(0.0) as usize;
                docs = docs.into_iter().skip(n).collect();
            }
            ("$limit", v) => {
                let n = crate::values::as_f64(v).unwrap_or(0.0).max(0.0) as usize;
                docs.truncate(n);
            }
            ("$project", Bson::Document(p)) => {
                docs = docs
                    .iter()
                    .map(|d| project(d, p))
                    .collect::<CmdResult<_>>()?
            }
            ("$count", Bson::String(field)) => {
                let n = docs.len() as i32;
                docs = if n == 0 {
                    Vec::new()
                } else {
                    vec![doc! {field.clone(): n}]
                };
            }
            ("$group", Bson::Document(g)) => docs = group(&docs, g)?,
            _ => {
                return Err(CommandError::new(
                    40324,
                    format!("Unrecognized pipeline stage name: '{name}'"),
                ));
            }
        }
    }
    let batch = match ctx.cmd.get("cursor") {
        Some(Bson::Document(c)) => batch_size(c.get("batchSize"))?.unwrap_or(DEFAULT_BATCH),
        _ => DEFAULT_BATCH,
    };
    let mut all: VecDeque<Document> = docs.into();
    let first = take_batch(&mut all, batch);
    let id = register_cursor(ctx, ns.to_string(), all, at);
    Ok(cursor_doc("firstBatch", first, id, ns.to_string(), at))
}

fn group(docs: &[Document], spec: &Document) -> CmdResult<Vec<Document>> {
    let Some(id) = spec.get("_id") else {
        return Err(CommandError::new(
            15955,
            "a group specification must include an _id",
        ));
    };
    if matches!(id, Bson::String(s) if s.starts_with('$')) {
        return Err(CommandError::new(
            40324,
            "$group supports only a constant _id",
        ));
    }
    if docs.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = doc! {"_id": id.clone()};
    for (field, acc) in spec.iter().filter(|(k, _)| *k != "_id") {
        let Bson::Document(acc) = acc else {
            return Err(CommandError::new(
                40234,
                format!("The field '{field}' must be an accumulator object"),
            ));
        };
        match acc.get("$sum") {
            Some(Bson::String(path)) if path.starts_with('$') => {
                let total: f64 = docs
                    .iter()
                    .filter_map(|d| {
                        crate::values::get_path(d, &path[1..]).and_then(crate::values::as_f64)
                    })
                    .sum();
                out.insert(field.clone(), total);
            }
            Some(v) => {
                let each = crate::values::as_f64(v).unwrap_or(0.0);
                let total = each * docs.len() as f64;
                if total.fract() == 0.0 && total.abs() < i32::MAX as f64 {
                    out.insert(field.clone(), total as i32);
                } else {
                    out.insert(field.clone(), total);
                }
            }
            None => {
                return Err(CommandError::new(
                    40324,
                    "only $sum accumulators are supported",
                ));
            }
        }
    }
    Ok(vec![out])
}

pub fn get_more(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let id = cursor_id(&ctx.cmd)?;
    let batch = batch_size(ctx.cmd.get("batchSize"))?
        .filter(|b| *b > 0)
        .unwrap_or(usize::MAX);
    let mut st = ctx.shared.lock();
    let Some(Cursor::Find(c)) = st.cursors.get_mut(&id) else {
        return Err(CommandError::new(43, format!("cursor id {id} not found")));
    };
    let next = take_batch(&mut c.docs, batch);
    let ns = c.ns.clone();
    let at = c.at_cluster_time;
    let done = c.docs.is_empty();
    if done {
        st.cursors.remove(&id);
    } else {
        st.touch_cursor(id);
    }
    Ok(cursor_doc(
        "nextBatch",
        next,
        if done { 0 } else { id },
        ns,
        at,
    ))
}

/// The next batch of a cursor: at most `count` documents and, as MongoDB's replies, at most
/// 16 MiB of them (one document at least).
fn take_batch(docs: &mut VecDeque<Document>, count: usize) -> Vec<Bson> {
    let mut batch = Vec::new();
    let mut bytes = 0;
    while batch.len() < count {
        let Some(next) = docs.front() else { break };
        let size = next.to_vec().map_or(0, |b| b.len());
        if !batch.is_empty() && bytes + size > MAX_BSON_OBJECT_SIZE {
            break;
        }
        bytes += size;
        if let Some(doc) = docs.pop_front() {
            batch.push(Bson::Document(doc));
        }
    }
    batch
}

pub fn cursor_id(cmd: &Document) -> CmdResult<i64> {
    match cmd.get("getMore") {
        Some(Bson::Int64(n)) => Ok(*n),
        Some(Bson::Int32(n)) => Ok(*n as i64),
        _ => Err(CommandError::type_mismatch(
            "getMore cursor id must be a 64-bit integer",
        )),
    }
}

pub fn kill_cursors(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ids: Vec<i64> = match ctx.cmd.get("cursors") {
        Some(Bson::Array(a)) => a
            .iter()
            .filter_map(|b| match b {
                Bson::Int64(n) => Some(*n),
                Bson::Int32(n) => Some(*n as i64),
                _ => None,
            })
            .collect(),
        _ => return Err(CommandError::type_mismatch("cursors must be an array")),
    };
    let mut st = ctx.shared.lock();
    let (mut killed, mut missing) = (Vec::new(), Vec::new());
    for id in ids {
        if st.cursors.remove(&id).is_some() {
            killed.push(Bson::Int64(id));
        } else {
            missing.push(Bson::Int64(id));
        }
    }
    Ok(
        doc! {"cursorsKilled": killed, "cursorsNotFound": missing, "cursorsAlive": [], "cursorsUnknown": []},
    )
}
