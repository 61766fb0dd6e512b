//! The `local` database's `oplog.rs`, rendered read-only from the retained change history.
//!
//! Each retained history entry is one oplog entry shaped as MongoDB writes them:
//! `{op, ns, ui?, o, o2?, ts, t: Int64(1), v: Int64(2), wall}` with `op` `i` (insert, `o` the
//! document), `u` (update: `o` `{$v: 2, diff: {u?, d?}}`; replacement: `o` the new document;
//! `o2` `{_id}`), `d` (delete, `o` `{_id}`) or `c` (commands on `db.$cmd`: `create`, `drop`,
//! `renameCollection`, `dropDatabase`, `commitIndexBuild`, `dropIndexes`, `collMod`). A
//! transaction's writes are one `c` entry on `admin.$cmd` with `o: {applyOps: [...]}`, `lsid`
//! and `txnNumber`. An empty history shows no-op entries (`op: "n"`) as a real oplog is never
//! empty: the initiation, at the time the replica set (or shard) started, and the last periodic
//! no-op of a shard's no-op writer. The history is bounded by count
//! (`history_limit`): the oldest retained entry's `ts` is the start of the window.
//!
//! `find` reads it in natural order (`sort: {$natural: 1}`, the default) or reverse
//! (`{$natural: -1}`; `{ts: ±1}` is the same order), with `filter`, `projection`, `skip`,
//! `limit`; a bound on `ts` in the filter seeks instead of scanning. Writes are refused.

use bson::{Bson, DateTime, Document, Timestamp, doc};

use super::crud::{self, opt_doc};
use super::{Ctx, Listener};
use crate::error::{CmdResult, CommandError};
use crate::matcher;
use crate::namespace::Namespace;
use crate::oplog::{EventKind, OplogEntry, ShardLog};
use crate::state::State;

/// Is this `local.oplog.rs`?
pub fn is_oplog(ns: &Namespace) -> bool {
    ns.db == "local" && ns.coll == "oplog.rs"
}

/// Refuses a write to `local.oplog.rs`, as MongoDB refuses user writes to it.
pub fn refuse_write(ns: &Namespace) -> CmdResult<()> {
    if is_oplog(ns) {
        return Err(CommandError::new(73, format!("cannot write to '{ns}'")));
    }
    Ok(())
}

/// Reading order: natural (`Some(true)`), reverse natural (`Some(false)`) or another sort
/// (`None`).
fn natural_order(sort: &Document, hint: Option<&Bson>) -> Option<bool> {
    let direction = |d: &Document, keys: &[&str]| -> Option<bool> {
        let mut it = d.iter();
        let (k, v) = it.next()?;
        if it.next().is_some() || !keys.contains(&k.as_str()) {
            return None;
        }
        crate::values::as_f64(v).map(|n| n >= 0.0)
    };
    if sort.is_empty() {
        return match hint {
            Some(Bson::Document(h)) => Some(direction(h, &["$natural"]).unwrap_or(true)),
            _ => Some(true),
        };
    }
    direction(sort, &["$natural", "ts"])
}

/// The index range `[lo, hi)` the filter's bounds on `ts` leave (a superset of the matches).
fn ts_range(oplog: &ShardLog, filter: &Document) -> (usize, usize) {
    let (mut lo, mut hi) = (0, oplog.len());
    match filter.get("ts") {
        Some(Bson::Timestamp(t)) => {
            lo = oplog.index_of_time(*t, true);
            hi = oplog.index_of_time(*t, false);
        }
        Some(Bson::Document(ops)) => {
            for (op, v) in ops {
                let Bson::Timestamp(t) = v else { continue };
                match op.as_str() {
                    "$gt" => lo = lo.max(oplog.index_of_time(*t, false)),
                    "$gte" => lo = lo.max(oplog.index_of_time(*t, true)),
                    "$lt" => hi = hi.min(oplog.index_of_time(*t, true)),
                    "$lte" => hi = hi.min(oplog.index_of_time(*t, false)),
                    "$eq" => {
                        lo = lo.max(oplog.index_of_time(*t, true));
                        hi = hi.min(oplog.index_of_time(*t, false));
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    (lo, hi.max(lo))
}

/// The oplog entries matching `filter` in natural order (`forward`) or reverse, after
/// skipping `skip`, at most `limit` of them (0: all).
pub fn entries(
    oplog: &ShardLog,
    filter: &Document,
    forward: bool,
    skip: usize,
    limit: usize,
) -> CmdResult<Vec<Document>> {
    let want = if limit == 0 {
        usize::MAX
    } else {
        skip.saturating_add(limit)
    };
    let mut out = Vec::new();
    if oplog.is_empty() {
        // A real oplog is never empty: it begins with the set's initiation, and the periodic
        // no-op writer adds entries while nothing else is written.
        let mut noops = vec![noop(oplog.started(), "initiating set")];
        if oplog.applied() != oplog.started() {
            noops.push(noop(oplog.applied(), "periodic noop"));
        }
        if !forward {
            noops.reverse();
        }
        for n in noops {
            if matcher::matches(&n, filter)? {
                out.push(n);
            }
        }
        return Ok(out
            .into_iter()
            .skip(skip)
            .take(want - skip.min(want))
            .collect());
    }
    let (lo, hi) = ts_range(oplog, filter);
    let mut groups = Groups {
        oplog,
        lo,
        hi,
        forward,
    };
    while out.len() < want {
        let Some((i, j)) = groups.next_group() else {
            break;
        };
        let d = render_group(oplog, i, j);
        if matcher::matches(&d, filter)? {
            out.push(d);
        }
    }
    Ok(out.into_iter().skip(skip).collect())
}

/// Walks `[lo, hi)` one oplog entry at a time: one history entry, or a transaction's entries
/// (same cluster time) together.
struct Groups<'a> {
    oplog: &'a ShardLog,
    lo: usize,
    hi: usize,
    forward: bool,
}

impl Groups<'_> {
    fn same_txn(&self, a: usize, b: usize) -> bool {
        match (self.oplog.get(a), self.oplog.get(b)) {
            (Some(x), Some(y)) => x.txn.is_some() && y.txn.is_some() && x.ts == y.ts,
            _ => false,
        }
    }

    fn next_group(&mut self) -> Option<(usize, usize)> {
        if self.lo >= self.hi {
            return None;
        }
        if self.forward {
            let start = self.lo;
            let mut end = start + 1;
            while end < self.hi && self.same_txn(start, end) {
                end += 1;
            }
            self.lo = end;
            Some((start, end))
        } else {
            let end = self.hi;
            let mut start = end - 1;
            while start > self.lo && self.same_txn(start - 1, end - 1) {
                start -= 1;
            }
            self.hi = start;
            Some((start, end))
        }
    }
}

/// A no-op entry of an otherwise empty oplog, at `ts`.
fn noop(ts: Timestamp, msg: &str) -> Document {
    doc! {
        "op": "n",
        "ns": "",
        "o": {"msg": msg},
        "ts": ts,
        "t": 1i64,
        "v": 2i64,
        "wall": DateTime::from_millis(i64::from(ts.time) * 1000),
    }
}

/// One oplog entry for the history entries `[i, j)`: the entry itself, or a transaction's
/// `applyOps`.
fn render_group(oplog: &ShardLog, i: usize, j: usize) -> Document {
    let Some(first) = oplog.get(i) else {
        return Document::new();
    };
    let mut d = match &first.txn {
        Some(info) => {
            let ops: Vec<Bson> = (i..j)
                .filter_map(|k| oplog.get(k))
                .map(|e| Bson::Document(operation(e)))
                .collect();
            let mut d = doc! {
                "lsid": info.lsid.clone(),
                "txnNumber": info.txn_number,
                "op": "c",
                "ns": "admin.$cmd",
                "o": {"applyOps": ops},
            };
            d.insert(
                "prevOpTime",
                doc! {"ts": Timestamp { time: 0, increment: 0 }, "t": -1i64},
            );
            d
        }
        None => operation(first),
    };
    d.insert("ts", first.ts);
    d.insert("t", 1i64);
    d.insert("v", 2i64);
    d.insert("wall", first.wall);
    d
}

/// `{op, ns, ui?, o, o2?}` of one history entry.
fn operation(e: &OplogEntry) -> Document {
    let coll_ns = e.ns.to_string();
    let cmd_ns = format!("{}.$cmd", e.ns.db);
    let coll = e.ns.coll.clone();
    let (op, ns, o, o2) = match &e.kind {
        EventKind::Insert { doc, .. } => ("i", coll_ns, (**doc).clone(), None),
        EventKind::Update {
            id,
            updated,
            removed,
            ..
        } => {
            let mut diff = Document::new();
            if !updated.is_empty() {
                diff.insert("u", updated.clone());
            }
            if !removed.is_empty() {
                let d: Document = removed.iter().map(|p| (p.clone(), false.into())).collect();
                diff.insert("d", d);
            }
            (
                "u",
                coll_ns,
                doc! {"$v": 2, "diff": diff},
                Some(doc! {"_id": id.clone()}),
            )
        }
        EventKind::Replace { id, doc } => (
            "u",
            coll_ns,
            (**doc).clone(),
            Some(doc! {"_id": id.clone()}),
        ),
        EventKind::Delete { id } => ("d", coll_ns, doc! {"_id": id.clone()}, None),
        EventKind::Drop => ("c", cmd_ns, doc! {"drop": coll}, None),
        EventKind::Rename { to, drop_target } => {
            let mut o = doc! {"renameCollection": coll_ns, "to": to.to_string(), "stayTemp": false};
            if let Some(uuid) = drop_target {
                o.insert("dropTarget", uuid.clone());
            }
            ("c", cmd_ns, o, None)
        }
        EventKind::DropDatabase => ("c", cmd_ns, doc! {"dropDatabase": 1}, None),
        EventKind::Create { description } => {
            let mut o = doc! {"create": coll};
            o.extend(description.clone());
            ("c", cmd_ns, o, None)
        }
        EventKind::CreateIndexes { indexes } => (
            "c",
            cmd_ns,
            doc! {"commitIndexBuild": coll, "indexes": indexes.clone()},
            None,
        ),
        EventKind::DropIndexes { indexes } => {
            let names: Vec<Bson> = indexes
                .iter()
                .filter_map(|i| i.get("name").cloned())
                .collect();
            let index = match names.as_slice() {
                [one] => one.clone(),
                _ => Bson::Array(names),
            };
            (
                "c",
                cmd_ns,
                doc! {"dropIndexes": coll, "index": index},
                None,
            )
        }
        EventKind::Modify { description, .. } => {
            let mut o = doc! {"collMod": coll};
            o.extend(description.clone());
            ("c", cmd_ns, o, None)
        }
        // A no-op entry, as the primary shard of a sharded cluster writes it.
        EventKind::ShardCollection { description } => {
            let mut o2 = doc! {"shardCollection": coll_ns.clone()};
            o2.extend(description.clone());
            (
                "n",
                coll_ns.clone(),
                doc! {"msg": {"shardCollection": coll_ns}},
                Some(o2),
            )
        }
    };
    let mut d = doc! {"op": op, "ns": ns};
    if let Some(ui) = &e.uuid {
        d.insert("ui", ui.clone());
    }
    d.insert("o", o);
    if let Some(o2) = o2 {
        d.insert("o2", o2);
    }
    d
}

/// Is the command's collection `local.oplog.rs`?
pub fn targets_oplog(ctx: &Ctx<'_>) -> bool {
    ctx.ns().is_ok_and(|ns| is_oplog(&ns))
}

/// The history a connection reads as `local.oplog.rs`: its shard's on a shard listener, the
/// replica set's otherwise.
fn history<'a>(ctx: &Ctx<'_>, st: &'a State) -> &'a ShardLog {
    match ctx.conn.listener {
        Listener::Shard(i) => st.oplog.shard(i).unwrap_or_else(|| st.oplog.first()),
        Listener::Main => st.oplog.first(),
    }
}

/// `find` on `local.oplog.rs`.
pub fn find(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let crud::FindCommand {
        ns,
        filter,
        sort,
        projection,
        options,
    } = crud::FindCommand::of(ctx)?;
    matcher::validate(&filter)?;
    let order = natural_order(&sort, ctx.cmd.get("hint"));
    let st = ctx.shared.lock();
    let docs = match order {
        Some(forward) => entries(
            history(ctx, &st),
            &filter,
            forward,
            options.skip,
            options.limit,
        )?,
        None => entries(history(ctx, &st), &filter, true, 0, 0)?,
    };
    drop(st);
    crud::find_over(
        ctx,
        &ns,
        docs,
        &sort,
        &projection,
        &options,
        order.is_none(),
    )
}

/// `count` on `local.oplog.rs`.
pub fn count(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let filter = opt_doc(&ctx.cmd, "query")?;
    matcher::validate(&filter)?;
    let skip = ctx.int_field("skip").unwrap_or(0).max(0) as usize;
    let limit = ctx.int_field("limit").unwrap_or(0).unsigned_abs() as usize;
    let found = entries(history(ctx, &ctx.shared.lock()), &filter, true, 0, 0)?.len();
    Ok(doc! {"n": crud::count_reply(found, skip, limit) as i32})
}

/// `aggregate` on `local.oplog.rs`: the pipeline over every entry in natural order.
pub fn aggregate(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let all = entries(
        history(ctx, &ctx.shared.lock()),
        &Document::new(),
        true,
        0,
        0,
    )?;
    crud::aggregate_over(ctx, &ns, all, None)
}

/// Commands that write to the collection their first field names.
const COLLECTION_WRITES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "create",
    "drop",
    "createIndexes",
    "dropIndexes",
    "deleteIndexes",
    "collMod",
];

/// Refuses a command that would write to `local.oplog.rs`.
pub fn refuse_oplog_writes(ctx: &Ctx<'_>) -> CmdResult<()> {
    let name = ctx.name.as_str();
    if COLLECTION_WRITES.contains(&name) {
        if let Some(Bson::String(coll)) = ctx.cmd.get(name) {
            refuse_write(&Namespace::new(ctx.db.clone(), coll.clone()))?;
        }
        return Ok(());
    }
    let named: Vec<&str> = match name {
        "renameCollection" => ["renameCollection", "to"]
            .iter()
            .filter_map(|k| ctx.cmd.get_str(k).ok())
            .collect(),
        "bulkWrite" => match ctx.cmd.get("nsInfo") {
            Some(Bson::Array(infos)) => infos
                .iter()
                .filter_map(|i| match i {
                    Bson::Document(d) => d.get_str("ns").ok(),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    for full in named {
        if let Some(ns) = Namespace::parse(full) {
            refuse_write(&ns)?;
        }
    }
    Ok(())
}
