//! Sharded mode (`--shards K`): the commands a `mongos` answers itself (`hello` as
//! `isdbgrid`, `listShards`, `enableSharding`, `shardCollection`, reads of the `config`
//! catalog), what it refuses (`replSetGetConfig`, `replSetGetStatus`, the `local` database),
//! and the few commands each shard's own listener serves as the primary of its replica set
//! (`hello`, `replSetGetStatus`, reads of its `local.oplog.rs`).

use bson::{Bson, DateTime, Document, doc};
use tracing::info;

use super::admin::require_admin;
use super::crud::{self, opt_doc};
use super::{Ctx, local};
use crate::cluster::shard_name;
use crate::error::{CmdResult, CommandError};
use crate::matcher;
use crate::namespace::Namespace;
use crate::oplog::{EventKind, PendingEvent};
use crate::storage::create_description;

/// The reply fields every `hello` carries.
fn common_hello(ctx: &Ctx<'_>, d: &mut Document) {
    d.insert("maxBsonObjectSize", 16_777_216);
    d.insert("maxMessageSizeBytes", 48_000_000);
    d.insert("maxWriteBatchSize", 100_000);
    d.insert("localTime", DateTime::now());
    d.insert("logicalSessionTimeoutMinutes", 30);
    d.insert("connectionId", ctx.conn.id);
    d.insert("minWireVersion", 0);
    d.insert("maxWireVersion", ctx.shared.config.max_wire_version);
    d.insert("readOnly", false);
}

fn primary_flag(legacy: bool) -> &'static str {
    if legacy {
        "ismaster"
    } else {
        "isWritablePrimary"
    }
}

/// A `mongos`'s `hello`: writable, `msg: "isdbgrid"`, no replica-set fields.
fn hello_router(ctx: &Ctx<'_>, legacy: bool) -> Document {
    let mut d = doc! {primary_flag(legacy): true, "msg": "isdbgrid", "helloOk": true};
    common_hello(ctx, &mut d);
    d
}

/// Shard `i`'s `hello`: the primary of the one-member replica set `shardN`.
fn hello_shard(ctx: &Ctx<'_>, i: usize, legacy: bool) -> Document {
    let me = ctx.shared.shard_hosts.get(i).cloned().unwrap_or_default();
    let ts = shard_applied(ctx, i);
    let now = DateTime::now();
    let mut d = doc! {
        primary_flag(legacy): true,
        "helloOk": true,
        "hosts": [me.clone()],
        "setName": shard_name(i),
        "setVersion": 1,
        "secondary": false,
        "primary": me.clone(),
        "me": me,
        "electionId": ctx.shared.election_id,
        "lastWrite": {
            "opTime": {"ts": Bson::Timestamp(ts), "t": 1i64},
            "lastWriteDate": now,
            "majorityOpTime": {"ts": Bson::Timestamp(ts), "t": 1i64},
            "majorityWriteDate": now,
        },
    };
    common_hello(ctx, &mut d);
    d
}

fn shard_applied(ctx: &Ctx<'_>, i: usize) -> bson::Timestamp {
    let st = ctx.shared.lock();
    st.oplog
        .shard(i)
        .map_or_else(|| st.oplog.cluster_time(), |s| s.applied())
}

/// Shard `i`'s `replSetGetStatus`: its optimes are its applied time (its last write or
/// no-op).
fn shard_status(ctx: &Ctx<'_>, i: usize) -> CmdResult<Document> {
    require_admin(ctx)?;
    let me = ctx.shared.shard_hosts.get(i).cloned().unwrap_or_default();
    Ok(super::admin::single_member_status(
        &shard_name(i),
        &me,
        shard_applied(ctx, i),
    ))
}

/// What shard `i`'s listener answers; everything else is refused (writes and other reads go
/// through the `mongos`).
pub fn shard_command(ctx: &Ctx<'_>, i: usize) -> CmdResult<Document> {
    match ctx.name.as_str() {
        "hello" => Ok(hello_shard(ctx, i, false)),
        "isMaster" | "ismaster" => Ok(hello_shard(ctx, i, true)),
        "ping" => Ok(Document::new()),
        "buildInfo" | "buildinfo" => Ok(super::admin::build_info(ctx)),
        "replSetGetStatus" => shard_status(ctx, i),
        "endSessions" | "refreshSessions" => Ok(Document::new()),
        "find" if local::targets_oplog(ctx) => local::find(ctx),
        "count" if local::targets_oplog(ctx) => local::count(ctx),
        "aggregate" if local::targets_oplog(ctx) => local::aggregate(ctx),
        "getMore" if !super::change_stream::is_change_cursor(ctx)? => crud::get_more(ctx),
        "killCursors" => crud::kill_cursors(ctx),
        // The shard's own fail points, apart from the mongos's.
        "configureFailPoint" => super::failpoint::configure(ctx),
        other => Err(CommandError::new(
            20,
            format!(
                "'{other}' is not served by {}'s listener (it serves hello, replSetGetStatus and reads of local.oplog.rs); send it to the mongos",
                shard_name(i)
            ),
        )),
    }
}

/// The commands a `mongos` answers (or refuses) itself; `None` for the rest, which run as on
/// a replica set.
pub fn router_command(ctx: &Ctx<'_>) -> Option<CmdResult<Document>> {
    let name = ctx.name.as_str();
    Some(match name {
        "hello" => Ok(hello_router(ctx, false)),
        "isMaster" | "ismaster" => Ok(hello_router(ctx, true)),
        "replSetGetConfig" | "replSetGetStatus" => {
            Err(CommandError::new(59, format!("no such command: '{name}'")))
        }
        "isdbgrid" => Ok(doc! {"isdbgrid": 1, "hostname": ctx.shared.me.clone()}),
        "listShards" => list_shards(ctx),
        "enableSharding" | "enablesharding" => enable_sharding(ctx),
        "shardCollection" | "shardcollection" => shard_collection(ctx),
        _ if ctx.db == "local" => Err(CommandError::new(
            20,
            "Can't use 'local' database through mongos",
        )),
        "find" if config_view(ctx).is_some() => config_find(ctx),
        "count" if config_view(ctx).is_some() => config_count(ctx),
        "aggregate"
            if config_view(ctx).is_some() && !super::change_stream::is_change_stream(&ctx.cmd) =>
        {
            config_aggregate(ctx)
        }
        _ => return None,
    })
}

/// `host` strings of `listShards`: `shardN/host:port` of each shard's listener.
fn shard_hosts(ctx: &Ctx<'_>) -> Vec<String> {
    ctx.shared
        .shard_hosts
        .iter()
        .enumerate()
        .map(|(i, h)| format!("{}/{h}", shard_name(i)))
        .collect()
}

fn list_shards(ctx: &Ctx<'_>) -> CmdResult<Document> {
    require_admin(ctx)?;
    let shards = ctx
        .shared
        .lock()
        .oplog
        .catalog
        .shard_documents(&shard_hosts(ctx));
    Ok(doc! {"shards": shards})
}

fn enable_sharding(ctx: &Ctx<'_>) -> CmdResult<Document> {
    require_admin(ctx)?;
    let db = match ctx.cmd.get(&ctx.name) {
        Some(Bson::String(db)) => db.clone(),
        _ => {
            return Err(CommandError::type_mismatch(
                "enableSharding needs a database name",
            ));
        }
    };
    super::validate_db_name(&db)?;
    let mut st = ctx.shared.lock();
    let primary = match ctx.cmd.get("primaryShard") {
        None => None,
        Some(Bson::String(name)) => match st.oplog.catalog.parse_shard(name) {
            Some(i) => Some(i),
            None => {
                return Err(CommandError::new(70, format!("Shard {name} not found")));
            }
        },
        Some(_) => return Err(CommandError::type_mismatch("primaryShard must be a string")),
    };
    let primary = st.oplog.catalog.enable_sharding(&db, primary)?;
    info!(database = %db, primary = %shard_name(primary), "sharding enabled");
    Ok(Document::new())
}

fn shard_collection(ctx: &Ctx<'_>) -> CmdResult<Document> {
    require_admin(ctx)?;
    let full = match ctx.cmd.get(&ctx.name) {
        Some(Bson::String(s)) => s.clone(),
        _ => {
            return Err(CommandError::type_mismatch(
                "shardCollection needs a namespace string",
            ));
        }
    };
    let ns = Namespace::parse(&full)
        .ok_or_else(|| CommandError::new(73, format!("Invalid namespace {full}")))?;
    super::validate_db_name(&ns.db)?;
    super::validate_collection_name(&ns.coll)?;
    if matches!(ns.db.as_str(), "local" | "admin" | "config") || local::is_oplog(&ns) {
        return Err(CommandError::new(
            20,
            format!("can't shard {full}: it is in an internal database"),
        ));
    }
    let key = match ctx.cmd.get("key") {
        Some(Bson::Document(k)) => k.clone(),
        _ => {
            return Err(CommandError::type_mismatch(
                "shardCollection needs a key object",
            ));
        }
    };
    if matches!(ctx.cmd.get("unique"), Some(Bson::Boolean(true))) {
        return Err(CommandError::bad_value(
            "this server does not enforce unique shard keys",
        ));
    }
    let mut st = ctx.shared.lock();
    if let Some(coll) = st.store.collection(&ns)
        && coll.kind() != "collection"
    {
        return Err(CommandError::new(
            166,
            format!("Namespace {ns} is a view, not a collection"),
        ));
    }
    let uuid = st.store.collection(&ns).map(|c| c.uuid.clone());
    let newly = st.oplog.catalog.shard_collection(&ns, &key, uuid)?;
    // Sharding a missing collection creates it (on every shard, as it is now sharded).
    let created = st.store.create_collection(&ns, Document::new(), None);
    let uuid = st.store.collection(&ns).map(|c| c.uuid.clone());
    if created {
        st.oplog.catalog.set_uuid(&ns, uuid.clone());
        let event = PendingEvent::new(
            ns.clone(),
            EventKind::Create {
                description: create_description(&Document::new()),
            },
            uuid.clone(),
        );
        st.oplog.append(vec![event], None);
    }
    if newly {
        let description = doc! {
            "shardKey": key.clone(),
            "unique": false,
            "presplitHashedZones": false,
        };
        let event = PendingEvent::new(ns.clone(), EventKind::ShardCollection { description }, uuid);
        st.oplog.append(vec![event], None);
    }
    drop(st);
    if created || newly {
        ctx.shared.history_grew.notify_waiters();
    }
    info!(namespace = %ns, key = %key, "collection sharded");
    Ok(doc! {"collectionsharded": full})
}

/// The `config` collection a command reads, if it is one of the catalog's.
fn config_view(ctx: &Ctx<'_>) -> Option<String> {
    if ctx.db != "config" {
        return None;
    }
    let coll = ctx.collection_name().ok()?;
    matches!(
        coll.as_str(),
        "version" | "shards" | "databases" | "collections" | "chunks"
    )
    .then_some(coll)
}

fn config_docs(ctx: &Ctx<'_>, filter: &Document) -> CmdResult<Vec<Document>> {
    let coll = config_view(ctx).unwrap_or_default();
    let hosts = shard_hosts(ctx);
    let all = ctx
        .shared
        .lock()
        .oplog
        .catalog
        .config_documents(&coll, &hosts)
        .unwrap_or_default();
    let mut kept = Vec::new();
    for d in all {
        if matcher::matches(&d, filter)? {
            kept.push(d);
        }
    }
    Ok(kept)
}

fn config_find(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let find = crud::FindCommand::of(ctx)?;
    matcher::validate(&find.filter)?;
    let docs = config_docs(ctx, &find.filter)?;
    crud::find_over(
        ctx,
        &find.ns,
        docs,
        &find.sort,
        &find.projection,
        &find.options,
        true,
    )
}

fn config_count(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let filter = opt_doc(&ctx.cmd, "query")?;
    matcher::validate(&filter)?;
    let skip = ctx.int_field("skip").unwrap_or(0).max(0) as usize;
    let limit = ctx.int_field("limit").unwrap_or(0).unsigned_abs() as usize;
    let found = config_docs(ctx, &filter)?.len();
    Ok(doc! {"n": crud::count_reply(found, skip, limit) as i32})
}

fn config_aggregate(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let all = config_docs(ctx, &Document::new())?;
    crud::aggregate_over(ctx, &ns, all, None)
}
