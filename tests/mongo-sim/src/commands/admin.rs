//! Handshake and administrative commands.

use std::sync::atomic::Ordering;

use bson::{Bson, DateTime, Document, Timestamp, doc};
use tracing::info;

use super::{Ctx, validate_collection_name};
use crate::error::{CmdResult, CommandError};
use crate::matcher;
use crate::namespace::Namespace;
use crate::oplog::{EventKind, PendingEvent};
use crate::state::State;
use crate::storage::create_description;

pub fn hello(ctx: &Ctx<'_>, legacy: bool) -> CmdResult<Document> {
    let shared = ctx.shared;
    let cfg = &shared.config;
    let mut d = Document::new();
    d.insert(
        if legacy {
            "ismaster"
        } else {
            "isWritablePrimary"
        },
        true,
    );
    d.insert("helloOk", true);
    if !cfg.standalone {
        let ts = shared.lock().oplog.cluster_time();
        let now = DateTime::now();
        d.insert("hosts", vec![Bson::String(shared.me.clone())]);
        d.insert("setName", cfg.set_name.clone());
        d.insert("setVersion", 1);
        d.insert("secondary", false);
        d.insert("primary", shared.me.clone());
        d.insert("me", shared.me.clone());
        d.insert("electionId", shared.election_id);
        d.insert(
            "lastWrite",
            doc! {
                "opTime": {"ts": Bson::Timestamp(ts), "t": 1i64},
                "lastWriteDate": now,
                "majorityOpTime": {"ts": Bson::Timestamp(ts), "t": 1i64},
                "majorityWriteDate": now,
            },
        );
    }
    d.insert("maxBsonObjectSize", 16_777_216);
    d.insert("maxMessageSizeBytes", 48_000_000);
    d.insert("maxWriteBatchSize", 100_000);
    d.insert("localTime", DateTime::now());
    d.insert("logicalSessionTimeoutMinutes", 30);
    d.insert("connectionId", ctx.conn.id);
    d.insert("minWireVersion", 0);
    d.insert("maxWireVersion", cfg.max_wire_version);
    d.insert("readOnly", false);
    Ok(d)
}

/// The release a wire version stands for: (major, minor).
pub fn release(config: &crate::Config) -> (i32, i32) {
    match config.max_wire_version {
        25.. => (8, 0),
        21..=24 => (7, 0),
        _ => (6, 0),
    }
}

pub fn build_info(ctx: &Ctx<'_>) -> Document {
    let (major, minor) = release(&ctx.shared.config);
    doc! {
        "version": format!("{major}.{minor}.0"),
        "gitVersion": "0000000000000000000000000000000000000000",
        "versionArray": [major, minor, 0, 0],
        "bits": 64,
        "debug": false,
        "maxBsonObjectSize": 16_777_216,
        "storageEngines": ["devnull", "wiredTiger"],
        "javascriptEngine": "none",
        "modules": [],
    }
}

/// Refuses a command sent to another database than `admin`, as MongoDB does (13).
pub(super) fn require_admin(ctx: &Ctx<'_>) -> CmdResult<()> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            format!("{} may only be run against the admin database.", ctx.name),
        ));
    }
    Ok(())
}

fn require_replica_set(ctx: &Ctx<'_>) -> CmdResult<()> {
    if ctx.shared.config.standalone {
        return Err(CommandError::new(76, "not running with --replSet"));
    }
    Ok(())
}

pub fn repl_set_get_config(ctx: &Ctx<'_>) -> CmdResult<Document> {
    require_admin(ctx)?;
    require_replica_set(ctx)?;
    let s = ctx.shared;
    Ok(doc! {
        "config": {
            "_id": s.config.set_name.clone(),
            "version": 1,
            "term": 1,
            "members": [{
                "_id": 0,
                "host": s.me.clone(),
                "arbiterOnly": false,
                "buildIndexes": true,
                "hidden": false,
                "priority": 1.0,
                "tags": {},
                "secondaryDelaySecs": 0i64,
                "votes": 1,
            }],
            "protocolVersion": 1i64,
            "writeConcernMajorityJournalDefault": true,
            "settings": {
                "chainingAllowed": true,
                "heartbeatIntervalMillis": 2000,
                "heartbeatTimeoutSecs": 10,
                "electionTimeoutMillis": 10000,
                "catchUpTimeoutMillis": -1,
                "catchUpTakeoverDelayMillis": 30000,
                "getLastErrorModes": {},
                "getLastErrorDefaults": {"w": 1, "wtimeout": 0},
                "replicaSetId": s.replica_set_id,
            },
        }
    })
}

pub fn repl_set_get_status(ctx: &Ctx<'_>) -> CmdResult<Document> {
    require_admin(ctx)?;
    require_replica_set(ctx)?;
    let s = ctx.shared;
    let ts = s.lock().oplog.cluster_time();
    Ok(single_member_status(&s.config.set_name, &s.me, ts))
}

/// `replSetGetStatus` of a one-member replica set named `set` whose member `me` has applied,
/// made durable and majority-committed everything up to `ts` (a replica set, or a shard).
pub fn single_member_status(set: &str, me: &str, ts: Timestamp) -> Document {
    let optime = doc! {"ts": Bson::Timestamp(ts), "t": 1i64};
    let wall = DateTime::from_millis(i64::from(ts.time) * 1000);
    doc! {
        "set": set,
        "date": DateTime::now(),
        "myState": 1,
        "term": 1i64,
        "heartbeatIntervalMillis": 2000i64,
        "majorityVoteCount": 1,
        "writeMajorityCount": 1,
        "votingMembersCount": 1,
        "writableVotingMembersCount": 1,
        "optimes": {
            "lastCommittedOpTime": optime.clone(),
            "lastCommittedWallTime": wall,
            "readConcernMajorityOpTime": optime.clone(),
            "appliedOpTime": optime.clone(),
            "durableOpTime": optime.clone(),
            "lastAppliedWallTime": wall,
            "lastDurableWallTime": wall,
        },
        "members": [{
            "_id": 0, "name": me, "health": 1.0, "state": 1, "stateStr": "PRIMARY",
            "optime": optime.clone(), "optimeDate": wall,
            "optimeDurable": optime, "optimeDurableDate": wall,
            "lastAppliedWallTime": wall, "lastDurableWallTime": wall,
            "self": true,
        }],
    }
}

pub fn server_status(ctx: &Ctx<'_>) -> Document {
    let (major, minor) = release(&ctx.shared.config);
    let st = ctx.shared.lock();
    doc! {
        "host": ctx.shared.me.clone(),
        "version": format!("{major}.{minor}.0"),
        "process": if ctx.shared.is_sharded() { "mongos" } else { "mongod" },
        "localTime": DateTime::now(),
        "connections": {"totalCreated": ctx.shared.next_connection_id.load(Ordering::Relaxed) - 1},
        "opcounters": {"command": ctx.shared.commands_served.load(Ordering::Relaxed) as i64},
        "transactions": {"currentOpen": st.active.len() as i64},
        "changeHistory": {"retained": st.oplog.len() as i64},
        "snapshotHistory": {
            "commits": st.store.history.retained().0 as i64,
            "pendingPrune": st.store.history.retained().1 as i64,
            "oldestTimestamp": Bson::Timestamp(st.store.history.oldest()),
        },
    }
}

pub fn list_databases(ctx: &Ctx<'_>) -> CmdResult<Document> {
    require_admin(ctx)?;
    let st = ctx.shared.lock();
    let name_only = ctx.bool_field("nameOnly", false);
    let dbs: Vec<Bson> = st
        .store
        .database_names()
        .into_iter()
        .map(|n| {
            if name_only {
                Bson::Document(doc! {"name": n})
            } else {
                Bson::Document(doc! {"name": n, "sizeOnDisk": 4096i64, "empty": false})
            }
        })
        .collect();
    let total = dbs.len() as i64 * 4096;
    Ok(doc! {"databases": dbs, "totalSize": total, "totalSizeMb": 0i64})
}

fn cursor_reply(ns: String, batch: Vec<Bson>) -> Document {
    doc! {"cursor": {"id": 0i64, "ns": ns, "firstBatch": batch}}
}

pub fn list_collections(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let filter = match ctx.cmd.get("filter") {
        Some(Bson::Document(d)) => d.clone(),
        None | Some(Bson::Null) => Document::new(),
        Some(_) => return Err(CommandError::type_mismatch("filter must be an object")),
    };
    let name_only = ctx.bool_field("nameOnly", false);
    let st = ctx.shared.lock();
    let txn = st.txn_id(ctx.txn_key());
    let mut batch = Vec::new();
    let visible = |c: &crate::storage::Collection| c.created_by.is_none() || c.created_by == txn;
    for (ns, coll) in st
        .store
        .collections
        .iter()
        .filter(|(n, c)| n.db == ctx.db && visible(c))
    {
        let kind = coll.kind();
        let full = if name_only {
            doc! {"name": ns.coll.clone(), "type": kind}
        } else {
            doc! {
                "name": ns.coll.clone(),
                "type": kind,
                "options": coll.options.clone(),
                "info": {"readOnly": kind == "view", "uuid": Bson::Binary(coll.uuid.clone())},
                "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"},
            }
        };
        if matcher::matches(&full, &filter)? {
            batch.push(Bson::Document(full));
        }
    }
    Ok(cursor_reply(
        format!("{}.$cmd.listCollections", ctx.db),
        batch,
    ))
}

pub fn create(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let mut options = ctx.cmd.clone();
    for k in [
        "create",
        "$db",
        "lsid",
        "$clusterTime",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "writeConcern",
        "$readPreference",
        "comment",
    ] {
        options.remove(k);
    }
    let images = match options.get("changeStreamPreAndPostImages") {
        Some(v) => Some(images_option("create", v)?),
        None => None,
    };
    if images.is_some() {
        if options.contains_key("viewOn") {
            return Err(CommandError::new(
                72,
                "option not supported on a view: changeStreamPreAndPostImages",
            ));
        }
        if options.contains_key("timeseries") {
            return Err(CommandError::new(
                72,
                "option not supported on a time-series collection: changeStreamPreAndPostImages",
            ));
        }
    }
    // Listed (and described in the `create` event) only when enabled, as MongoDB does.
    if images == Some(false) {
        options.remove("changeStreamPreAndPostImages");
    }
    match (options.get("timeseries"), options.get("viewOn")) {
        (Some(Bson::Document(ts)), None) if ts.get_str("timeField").is_ok() => {}
        (Some(_), None) => {
            return Err(CommandError::bad_value(
                "timeseries needs a 'timeField' string",
            ));
        }
        (None, Some(Bson::String(_))) | (None, None) => {}
        (None, Some(_)) => return Err(CommandError::type_mismatch("viewOn must be a string")),
        (Some(_), Some(_)) => {
            return Err(CommandError::bad_value(
                "a view cannot have timeseries options",
            ));
        }
    }
    // A view's `create` event describes its definition (MongoDB derives it from the view's
    // entry in `system.views`); a time-series collection records none here.
    let description = match options.get("viewOn") {
        Some(view_on) => Some(doc! {
            "viewOn": view_on.clone(),
            "pipeline": options.get("pipeline").cloned().unwrap_or_else(|| Bson::Array(Vec::new())),
        }),
        None if options.contains_key("timeseries") => None,
        None => Some(create_description(&options)),
    };
    let mut st = ctx.shared.lock();
    let txn = st.txn_id(ctx.txn_key());
    let created = st.store.create_collection(&ns, options, txn);
    if !created {
        return Err(CommandError::new(
            48,
            format!("Collection {ns} already exists."),
        ));
    }
    if let Some(description) = description {
        let uuid = st
            .store
            .collection(&ns)
            .filter(|c| c.kind() == "collection")
            .map(|c| c.uuid.clone());
        let event = PendingEvent::new(ns.clone(), EventKind::Create { description }, uuid);
        let now = record_ddl(&mut st, ctx.txn_key(), vec![event]);
        std::mem::drop(st);
        if now {
            ctx.shared.history_grew.notify_waiters();
        }
    }
    info!(namespace = %ns, "collection created");
    Ok(Document::new())
}

/// Records the events of a DDL command: inside a transaction with its writes (they come with
/// its commit, and none if it aborts), otherwise each at once. True when recorded at once.
fn record_ddl(st: &mut State, txn_key: Option<&[u8]>, events: Vec<PendingEvent>) -> bool {
    if events.is_empty() {
        return false;
    }
    let parts = st.parts(txn_key);
    if let Some(txn) = parts.txn {
        txn.events.extend(events);
        return false;
    }
    for e in events {
        parts.oplog.append(vec![e], None);
    }
    true
}

/// Parses `changeStreamPreAndPostImages: {enabled: <bool>}` of `create` / `collMod`.
fn images_option(command: &str, v: &Bson) -> CmdResult<bool> {
    let field = format!("{command}.changeStreamPreAndPostImages");
    let Bson::Document(d) = v else {
        return Err(CommandError::type_mismatch(format!(
            "BSON field '{field}' is the wrong type '{}', expected type 'object'",
            crate::expression::type_name(Some(v))
        )));
    };
    let mut enabled = None;
    for (k, v) in d {
        match (k.as_str(), v) {
            ("enabled", Bson::Boolean(b)) => enabled = Some(*b),
            ("enabled", other) => {
                return Err(CommandError::type_mismatch(format!(
                    "BSON field '{field}.enabled' is the wrong type '{}', expected type 'bool'",
                    crate::expression::type_name(Some(other))
                )));
            }
            (other, _) => {
                return Err(CommandError::new(
                    40415,
                    format!("BSON field '{field}.{other}' is an unknown field."),
                ));
            }
        }
    }
    enabled.ok_or_else(|| {
        CommandError::new(
            40414,
            format!("BSON field '{field}.enabled' is missing but a required field"),
        )
    })
}

/// `collMod`: `changeStreamPreAndPostImages`, `validator`, `validationLevel` and
/// `validationAction` (the validator is stored, not enforced). Records a `modify` event.
pub fn coll_mod(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let mut changes = Document::new();
    for (k, v) in ctx.cmd.iter().skip(1) {
        match k.as_str() {
            "changeStreamPreAndPostImages" => {
                let enabled = images_option("collMod", v)?;
                changes.insert(k.clone(), doc! {"enabled": enabled});
            }
            "validator" => match v {
                Bson::Document(_) => {
                    changes.insert(k.clone(), v.clone());
                }
                other => {
                    return Err(CommandError::type_mismatch(format!(
                        "BSON field 'collMod.validator' is the wrong type '{}', expected type 'object'",
                        crate::expression::type_name(Some(other))
                    )));
                }
            },
            "validationLevel" | "validationAction" => {
                let allowed: &[&str] = if k == "validationLevel" {
                    &["off", "strict", "moderate"]
                } else {
                    &["error", "warn", "errorAndLog"]
                };
                match v {
                    Bson::String(s) if allowed.contains(&s.as_str()) => {
                        changes.insert(k.clone(), v.clone());
                    }
                    Bson::String(s) => {
                        return Err(CommandError::bad_value(format!(
                            "Enumeration value '{s}' for field 'collMod.{k}' is not a valid value."
                        )));
                    }
                    other => {
                        return Err(CommandError::type_mismatch(format!(
                            "BSON field 'collMod.{k}' is the wrong type '{}', expected type 'string'",
                            crate::expression::type_name(Some(other))
                        )));
                    }
                }
            }
            "index" => {
                return Err(CommandError::new(
                    115,
                    "collMod 'index' is not supported by this test server",
                ));
            }
            _ if k.starts_with('$')
                || matches!(
                    k.as_str(),
                    "lsid" | "txnNumber" | "writeConcern" | "comment" | "maxTimeMS"
                ) => {}
            other => {
                return Err(CommandError::new(
                    40415,
                    format!("BSON field 'collMod.{other}' is an unknown field."),
                ));
            }
        }
    }
    let mut st = ctx.shared.lock();
    // A collection an open transaction created is not there for anyone else yet.
    let Some(coll) = st
        .store
        .collections
        .get_mut(&ns)
        .filter(|c| c.created_by.is_none())
    else {
        return Err(CommandError::namespace_not_found(format!(
            "ns does not exist: {ns}"
        )));
    };
    if changes.contains_key("changeStreamPreAndPostImages") && coll.kind() != "collection" {
        return Err(CommandError::new(
            72,
            format!(
                "option not supported on a {}: changeStreamPreAndPostImages",
                if coll.kind() == "view" {
                    "view"
                } else {
                    "time-series collection"
                }
            ),
        ));
    }
    let mut options_before = doc! {"uuid": Bson::Binary(coll.uuid.clone())};
    options_before.extend(coll.options.clone());
    for (k, v) in &changes {
        let enabled =
            matches!(v, Bson::Document(d) if matches!(d.get("enabled"), Some(Bson::Boolean(true))));
        if k == "changeStreamPreAndPostImages" && !enabled {
            coll.options.remove(k);
        } else {
            coll.options.insert(k.clone(), v.clone());
        }
    }
    let uuid = Some(coll.uuid.clone());
    if coll.kind() == "collection" {
        st.oplog.append(
            vec![PendingEvent::new(
                ns.clone(),
                EventKind::Modify {
                    description: changes,
                    options_before,
                },
                uuid,
            )],
            None,
        );
    }
    std::mem::drop(st);
    ctx.shared.history_grew.notify_waiters();
    info!(namespace = %ns, "collection modified");
    Ok(Document::new())
}

/// Removes a collection and records a `drop` event. False if it did not exist.
fn drop_collection(ctx: &Ctx<'_>, ns: &Namespace) -> bool {
    let mut st = ctx.shared.lock();
    // One an open transaction created is not there for anyone else yet.
    if st.store.visible(ns, None).is_none() {
        return false;
    }
    let Some(coll) = st.store.collections.remove(ns) else {
        return false;
    };
    st.forget_find_cursors(ns);
    st.oplog.append(
        vec![PendingEvent::new(
            ns.clone(),
            EventKind::Drop,
            Some(coll.uuid),
        )],
        None,
    );
    true
}

pub fn drop(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    if !drop_collection(ctx, &ns) {
        return Err(CommandError::namespace_not_found("ns not found"));
    }
    ctx.shared.history_grew.notify_waiters();
    info!(namespace = %ns, "collection dropped");
    Ok(doc! {"nIndexesWas": 1, "ns": ns.to_string()})
}

pub fn rename_collection(ctx: &Ctx<'_>) -> CmdResult<Document> {
    require_admin(ctx)?;
    let parse = |key: &str| -> CmdResult<Namespace> {
        let s = ctx
            .cmd
            .get_str(key)
            .map_err(|_| CommandError::type_mismatch(format!("'{key}' must be a string")))?;
        let ns = Namespace::parse(s)
            .ok_or_else(|| CommandError::new(73, format!("Invalid namespace specified '{s}'")))?;
        validate_collection_name(&ns.coll)?;
        Ok(ns)
    };
    let from = parse("renameCollection")?;
    let to = parse("to")?;
    let drop_target = ctx.bool_field("dropTarget", false);
    if from == to {
        return Err(CommandError::new(20, "Can't rename a collection to itself"));
    }
    let mut st = ctx.shared.lock();
    if st.store.visible(&from, None).is_none() {
        return Err(CommandError::namespace_not_found(
            "Source collection does not exist",
        ));
    }
    let mut events = Vec::new();
    let mut dropped = None;
    if st.store.collections.contains_key(&to) {
        if !drop_target {
            return Err(CommandError::new(48, "target namespace exists"));
        }
        let uuid = st.store.collections.remove(&to).map(|c| c.uuid);
        st.forget_find_cursors(&to);
        dropped = uuid.clone();
        events.push(PendingEvent::new(to.clone(), EventKind::Drop, uuid));
    }
    let mut uuid = None;
    if let Some(coll) = st.store.collections.remove(&from) {
        uuid = Some(coll.uuid.clone());
        st.store.collections.insert(to.clone(), coll);
    }
    st.forget_find_cursors(&from);
    for e in events {
        st.oplog.append(vec![e], None);
    }
    st.oplog.append(
        vec![PendingEvent::new(
            from.clone(),
            EventKind::Rename {
                to: to.clone(),
                drop_target: dropped,
            },
            uuid,
        )],
        None,
    );
    std::mem::drop(st);
    ctx.shared.history_grew.notify_waiters();
    info!(from = %from, to = %to, "collection renamed");
    Ok(Document::new())
}

pub fn drop_database(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let names = ctx.shared.lock().store.collection_names(&ctx.db);
    if names.is_empty() {
        return Ok(Document::new());
    }
    for n in &names {
        drop_collection(ctx, &Namespace::new(ctx.db.clone(), n.clone()));
    }
    ctx.shared.lock().oplog.append(
        vec![PendingEvent::new(
            Namespace::new(ctx.db.clone(), ""),
            EventKind::DropDatabase,
            None,
        )],
        None,
    );
    ctx.shared.history_grew.notify_waiters();
    info!(database = %ctx.db, collections = names.len(), "database dropped");
    Ok(doc! {"dropped": ctx.db.clone()})
}

pub fn list_indexes(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let st = ctx.shared.lock();
    let Some(coll) = st.store.visible(&ns, st.txn_id(ctx.txn_key())) else {
        return Err(CommandError::namespace_not_found(format!(
            "ns does not exist: {ns}"
        )));
    };
    let mut batch = vec![Bson::Document(
        doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"},
    )];
    batch.extend(coll.indexes.iter().cloned().map(Bson::Document));
    Ok(cursor_reply(ns.to_string(), batch))
}

pub fn create_indexes(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let specs: Vec<Document> = match ctx.cmd.get("indexes") {
        Some(Bson::Array(a)) => a
            .iter()
            .map(|b| match b {
                Bson::Document(d) if d.get_document("key").is_ok() && d.get_str("name").is_ok() => {
                    Ok(d.clone())
                }
                _ => Err(CommandError::failed_to_parse(
                    "each index needs a 'key' document and a 'name'",
                )),
            })
            .collect::<CmdResult<_>>()?,
        _ => return Err(CommandError::type_mismatch("indexes must be an array")),
    };
    let mut st = ctx.shared.lock();
    let txn = st.txn_id(ctx.txn_key());
    if let Some(existing) = st.store.collections.get(&ns) {
        match (existing.created_by, txn) {
            // Inside a transaction, only a collection it created itself takes new indexes.
            (None, Some(_)) => {
                return Err(CommandError::new(
                    263,
                    format!(
                        "Cannot create new indexes on existing collection {ns} in a multi-document transaction."
                    ),
                ));
            }
            (Some(owner), _) if Some(owner) != txn => return Err(CommandError::write_conflict()),
            _ => {}
        }
    }
    let created = st.store.create_collection(&ns, Document::new(), txn);
    let coll = st.store.ensure_collection(&ns);
    let uuid = coll.uuid.clone();
    // Deleted documents kept for reads at an earlier cluster time do not count.
    let empty = !coll
        .docs
        .values()
        .any(|e| e.latest().is_some() || e.held_by.is_some());
    let before = 1 + coll.indexes.len() as i32;
    let mut built = Vec::new();
    for spec in specs {
        let name = spec.get_str("name").unwrap_or_default().to_string();
        if name == "_id_"
            || coll
                .indexes
                .iter()
                .any(|i| i.get_str("name").is_ok_and(|n| n == name))
        {
            continue;
        }
        let mut stored = doc! {"v": 2};
        stored.extend(spec);
        coll.indexes.push(stored.clone());
        built.push(stored);
    }
    coll.sync_lookups();
    let after = 1 + coll.indexes.len() as i32;
    let mut events = Vec::new();
    if created {
        events.push(PendingEvent::new(
            ns.clone(),
            EventKind::Create {
                description: create_description(&Document::new()),
            },
            Some(uuid.clone()),
        ));
    }
    // An empty collection records each index on its own; otherwise one index build commits
    // them together.
    let groups: Vec<Vec<Document>> = if empty {
        built.into_iter().map(|i| vec![i]).collect()
    } else if built.is_empty() {
        Vec::new()
    } else {
        vec![built]
    };
    for indexes in groups {
        events.push(PendingEvent::new(
            ns.clone(),
            EventKind::CreateIndexes { indexes },
            Some(uuid.clone()),
        ));
    }
    let recorded = record_ddl(&mut st, ctx.txn_key(), events);
    std::mem::drop(st);
    if recorded {
        ctx.shared.history_grew.notify_waiters();
    }
    Ok(doc! {
        "numIndexesBefore": before,
        "numIndexesAfter": after,
        "createdCollectionAutomatically": created,
    })
}

pub fn drop_indexes(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let ns = ctx.ns()?;
    let mut st = ctx.shared.lock();
    let Some(coll) = st
        .store
        .collections
        .get_mut(&ns)
        .filter(|c| c.created_by.is_none())
    else {
        return Err(CommandError::namespace_not_found(format!(
            "ns not found {ns}"
        )));
    };
    let was = 1 + coll.indexes.len() as i32;
    let dropping: Vec<bool> = match ctx.cmd.get("index") {
        Some(Bson::String(s)) if s == "*" => coll.indexes.iter().map(|_| true).collect(),
        Some(Bson::String(name)) => {
            let hit: Vec<bool> = coll
                .indexes
                .iter()
                .map(|i| i.get_str("name").ok() == Some(name.as_str()))
                .collect();
            if !hit.contains(&true) {
                return Err(CommandError::new(
                    27,
                    format!("index not found with name [{name}]"),
                ));
            }
            hit
        }
        Some(Bson::Document(key)) => coll
            .indexes
            .iter()
            .map(|i| i.get_document("key").ok() == Some(key))
            .collect(),
        Some(Bson::Array(names)) => coll
            .indexes
            .iter()
            .map(|i| names.iter().any(|n| n.as_str() == i.get_str("name").ok()))
            .collect(),
        _ => {
            return Err(CommandError::failed_to_parse(
                "'index' must be a name, a key pattern or '*'",
            ));
        }
    };
    let uuid = coll.uuid.clone();
    let mut dropped = Vec::new();
    let mut kept = Vec::new();
    for (index, drop) in std::mem::take(&mut coll.indexes).into_iter().zip(dropping) {
        if drop {
            dropped.push(index);
        } else {
            kept.push(index);
        }
    }
    coll.indexes = kept;
    coll.sync_lookups();
    // Each dropped index is its own history entry.
    let recorded = !dropped.is_empty();
    for index in dropped {
        st.oplog.append(
            vec![PendingEvent::new(
                ns.clone(),
                EventKind::DropIndexes {
                    indexes: vec![index],
                },
                Some(uuid.clone()),
            )],
            None,
        );
    }
    std::mem::drop(st);
    if recorded {
        ctx.shared.history_grew.notify_waiters();
    }
    Ok(doc! {"nIndexesWas": was})
}

/// `getParameter`: `"*"` for every parameter, or the parameters named with a true value.
pub fn get_parameter(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let lifetime = ctx.shared.config.transaction_lifetime.as_secs().max(1) as i64;
    let (major, minor) = ctx.shared.feature_compatibility();
    let all = doc! {
        "featureCompatibilityVersion": {"version": format!("{major}.{minor}")},
        "enableTestCommands": true,
        "transactionLifetimeLimitSeconds": lifetime,
    };
    if matches!(ctx.cmd.get("getParameter"), Some(Bson::String(s)) if s == "*") {
        return Ok(all);
    }
    let mut reply = Document::new();
    for key in ctx.cmd.keys().skip(1) {
        if key.starts_with('$') || matches!(key.as_str(), "lsid" | "comment") {
            continue;
        }
        match all.get(key) {
            Some(value) => {
                reply.insert(key.clone(), value.clone());
            }
            None => {
                return Err(CommandError::new(72, "no option found to get"));
            }
        }
    }
    if reply.is_empty() {
        return Err(CommandError::new(72, "no option found to get"));
    }
    Ok(reply)
}

/// `setFeatureCompatibilityVersion: "M.m"` (on `admin`, with `confirm: true` from 7.0 on): a
/// version no later than the release's own.
pub fn set_feature_compatibility_version(ctx: &Ctx<'_>) -> CmdResult<Document> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "setFeatureCompatibilityVersion may only be run against the admin database.",
        ));
    }
    let release = release(&ctx.shared.config);
    if release.0 >= 7 && !ctx.bool_field("confirm", false) {
        return Err(CommandError::new(
            7369100,
            "Once you have upgraded to the new feature compatibility version, you cannot downgrade \
             without support assistance. Pass confirm: true to go ahead.",
        ));
    }
    let asked = ctx.cmd.get_str("setFeatureCompatibilityVersion").ok();
    let version = asked
        .and_then(|v| v.split_once('.'))
        .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)))
        .filter(|version: &(i32, i32)| *version <= release && version.0 >= release.0 - 1)
        .ok_or_else(|| {
            CommandError::new(
                2,
                format!(
                    "Invalid feature compatibility version value '{}'",
                    asked.unwrap_or("")
                ),
            )
        })?;
    *ctx.shared
        .feature_compatibility
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = version;
    Ok(Document::new())
}
