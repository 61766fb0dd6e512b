//! Command dispatch: decoding a request into a command, gating sessions and transactions,
//! fault injection, and shaping replies.

pub mod admin;
pub mod bulk_write;
pub mod change_stream;
pub mod crud;
pub mod failpoint;
pub mod local;
pub mod sharding;
pub mod txn;

use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document, doc};
use tracing::{debug, warn};

use crate::error::{CmdResult, CommandError, LabelContext};
use crate::namespace::Namespace;
use crate::state::Shared;
use crate::wire::{self, Message};

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The server's port: a replica-set primary, a standalone server or a `mongos`.
    Main,
    /// Shard `i`'s own port (sharded mode).
    Shard(usize),
}

impl Listener {
    /// The shard whose port this is.
    pub fn shard(self) -> Option<usize> {
        match self {
            Listener::Main => None,
            Listener::Shard(i) => Some(i),
        }
    }
}

/// The connection a request arrived on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub listener: Listener,
    pub id: i64,
    pub peer: String,
    /// The `client.application.name` of the connection's handshake, if it sent one.
    pub app_name: std::sync::OnceLock<String>,
}

/// What the connection does after a request.
#[derive(Debug)]
pub enum Outcome {
    Reply(Vec<u8>),
    NoReply,
    Close,
}

/// Session fields of a command.
#[derive(Debug, Clone)]
pub struct SessionArgs {
    pub key: Vec<u8>,
    pub lsid: Document,
    pub txn_number: Option<i64>,
    pub autocommit: Option<bool>,
    pub start_transaction: bool,
}

impl SessionArgs {
    pub fn in_txn(&self) -> bool {
        self.autocommit == Some(false)
    }
}

/// One command being executed.
pub struct Ctx<'a> {
    pub shared: &'a Arc<Shared>,
    pub conn: &'a ConnInfo,
    pub db: String,
    pub name: String,
    pub cmd: Document,
    pub session: Option<SessionArgs>,
}

impl Ctx<'_> {
    pub fn in_txn(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.in_txn())
    }

    /// The session key when this command runs inside a transaction.
    pub fn txn_key(&self) -> Option<&[u8]> {
        self.session
            .as_ref()
            .filter(|s| s.in_txn())
            .map(|s| s.key.as_slice())
    }

    /// A retryable write: txnNumber without autocommit.
    pub fn retryable_write(&self) -> Option<(&[u8], i64)> {
        let s = self.session.as_ref()?;
        if s.autocommit.is_some() {
            return None;
        }
        Some((s.key.as_slice(), s.txn_number?))
    }

    /// The collection named by the command's first field.
    pub fn collection_name(&self) -> CmdResult<String> {
        match self.cmd.get(&self.name) {
            Some(Bson::String(s)) if !s.is_empty() => {
                validate_collection_name(s)?;
                Ok(s.clone())
            }
            _ => Err(CommandError::new(
                73,
                format!(
                    "collection name has invalid type or is empty for {}",
                    self.name
                ),
            )),
        }
    }

    pub fn ns(&self) -> CmdResult<Namespace> {
        Ok(Namespace::new(self.db.clone(), self.collection_name()?))
    }

    pub fn bool_field(&self, key: &str, default: bool) -> bool {
        match self.cmd.get(key) {
            Some(Bson::Boolean(b)) => *b,
            Some(v) => crate::values::as_f64(v)
                .map(|n| n != 0.0)
                .unwrap_or(default),
            None => default,
        }
    }

    pub fn int_field(&self, key: &str) -> Option<i64> {
        self.cmd
            .get(key)
            .and_then(crate::values::as_f64)
            .map(|n| n as i64)
    }
}

pub fn validate_collection_name(name: &str) -> CmdResult<()> {
    if name.is_empty() || name.contains('\0') || name.starts_with('.') || name.contains('$') {
        return Err(CommandError::new(
            73,
            format!("Invalid collection name: {name}"),
        ));
    }
    Ok(())
}

pub fn validate_db_name(name: &str) -> CmdResult<()> {
    if name.is_empty() || name.len() > 63 || name.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
        return Err(CommandError::new(
            73,
            format!("Invalid database name: '{name}'"),
        ));
    }
    Ok(())
}

/// Decodes, executes and encodes one request.
pub async fn handle_message(shared: &Arc<Shared>, conn: &ConnInfo, msg: Message) -> Outcome {
    let request_id = msg.request_id();
    let more_to_come = msg.more_to_come();
    let (db, body, legacy) = match msg {
        Message::Msg(m) => {
            let db = match m.body.get("$db") {
                Some(Bson::String(s)) => Some(s.clone()),
                _ => None,
            };
            (db, m.body, false)
        }
        Message::Query(q) => {
            let db = q
                .full_collection_name
                .strip_suffix(".$cmd")
                .map(|s| s.to_string());
            let body = match q.query.get("$query") {
                Some(Bson::Document(inner)) => inner.clone(),
                _ => q.query,
            };
            (db, body, true)
        }
    };
    let reply = match db {
        Some(db) => run_command(shared, conn, db, body).await,
        None => Some(
            CommandError::new(40571, "OP_MSG requests require a $db argument")
                .to_document(LabelContext::default()),
        ),
    };
    let Some(reply) = reply else {
        return Outcome::Close;
    };
    if more_to_come {
        return Outcome::NoReply;
    }
    let encoded = if legacy {
        wire::encode_op_reply(next_reply_id(), request_id, &reply)
    } else {
        wire::encode_op_msg(next_reply_id(), request_id, &reply)
    };
    match encoded {
        Ok(bytes) => Outcome::Reply(bytes),
        Err(e) => {
            warn!(connection_id = conn.id, error = %e, "cannot encode reply");
            Outcome::Close
        }
    }
}

fn next_reply_id() -> i32 {
    use std::sync::atomic::{AtomicI32, Ordering};
    static NEXT: AtomicI32 = AtomicI32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) & i32::MAX
}

fn session_args(body: &Document) -> CmdResult<Option<SessionArgs>> {
    let Some(lsid) = body.get("lsid") else {
        if body.contains_key("txnNumber") {
            return Err(CommandError::new(
                50768,
                "txnNumber may only be provided for multi-document transactions and retryable write commands, and requires a session id",
            ));
        }
        return Ok(None);
    };
    let Bson::Document(lsid) = lsid else {
        return Err(CommandError::type_mismatch("lsid must be an object"));
    };
    let key = match lsid.get("id") {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        _ => lsid.to_vec().unwrap_or_default(),
    };
    let txn_number = match body.get("txnNumber") {
        None => None,
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Int32(n)) => Some(*n as i64),
        Some(_) => {
            return Err(CommandError::type_mismatch(
                "txnNumber must be a 64-bit integer",
            ));
        }
    };
    let autocommit = match body.get("autocommit") {
        None => None,
        Some(Bson::Boolean(b)) => Some(*b),
        Some(_) => return Err(CommandError::type_mismatch("autocommit must be a boolean")),
    };
    if autocommit == Some(true) {
        return Err(CommandError::new(72, "autocommit must be false"));
    }
    if autocommit.is_some() && txn_number.is_none() {
        return Err(CommandError::new(
            72,
            "'autocommit' field requires a transaction number",
        ));
    }
    let start_transaction = match body.get("startTransaction") {
        None => false,
        Some(Bson::Boolean(true)) => true,
        Some(_) => return Err(CommandError::new(72, "startTransaction must be true")),
    };
    if start_transaction && autocommit.is_none() {
        return Err(CommandError::new(
            72,
            "'startTransaction' requires 'autocommit: false'",
        ));
    }
    Ok(Some(SessionArgs {
        key,
        lsid: lsid.clone(),
        txn_number,
        autocommit,
        start_transaction,
    }))
}

const TXN_COMMANDS: &[&str] = &[
    "find",
    "bulkWrite",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "aggregate",
    "getMore",
    "distinct",
    "commitTransaction",
    "abortTransaction",
    "killCursors",
    "create",
    "createIndexes",
    "listCollections",
    "listIndexes",
];

const RETRYABLE_WRITES: &[&str] = &[
    "bulkWrite",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
];

/// Runs one command; `None` means close the connection without replying.
async fn run_command(
    shared: &Arc<Shared>,
    conn: &ConnInfo,
    db: String,
    body: Document,
) -> Option<Document> {
    let Some(name) = body.keys().next().cloned() else {
        return Some(
            CommandError::failed_to_parse("empty command").to_document(LabelContext::default()),
        );
    };
    if matches!(name.as_str(), "hello" | "isMaster" | "ismaster")
        && let Ok(app) = body
            .get_document("client")
            .and_then(|c| c.get_document("application"))
            .and_then(|a| a.get_str("name"))
    {
        let _ = conn.app_name.set(app.to_string());
    }
    shared.record_command(conn.app_name.get().map(String::as_str), &db, &name, &body);
    let session = session_args(&body);
    let mut label_ctx = LabelContext {
        is_commit: name == "commitTransaction",
        is_abort: name == "abortTransaction",
        is_get_more: name == "getMore",
        ..Default::default()
    };
    if let Ok(Some(s)) = &session {
        label_ctx.in_transaction = s.in_txn();
        label_ctx.retryable_write = s.txn_number.is_some()
            && s.autocommit.is_none()
            && RETRYABLE_WRITES.contains(&name.as_str());
    }

    // Fault injection first, as a real server does.
    let mut write_concern_error = None;
    if name != "configureFailPoint" {
        let fired = shared.failpoints_of(conn.listener.shard()).check(&name);
        if let Some(action) = fired {
            write_concern_error = action.write_concern_error;
            if let Some(ms) = action.block_ms {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if action.close_connection {
                debug!(connection_id = conn.id, command = %name, "fail point closes the connection");
                return None;
            }
            if let Some(err) = action.error {
                debug!(connection_id = conn.id, command = %name, code = err.code, "fail point fails the command");
                // Errors raised in front of a command carry no change-stream resume label.
                let ctx = LabelContext {
                    is_get_more: label_ctx.is_get_more && action.in_cursor,
                    ..label_ctx
                };
                let mut reply = err.to_document(ctx);
                append_cluster_time(shared, &mut reply);
                return Some(reply);
            }
        }
    }

    let write_concern = match body.get("writeConcern") {
        Some(Bson::Document(wc)) => Some(wc.clone()),
        _ => None,
    };
    let result = async {
        let session = session?;
        if let Some(s) = &session {
            if s.txn_number.is_some() && shared.config.standalone {
                return Err(CommandError::new(
                    20,
                    "Transaction numbers are only allowed on a replica set member or mongos",
                ));
            }
            if s.in_txn() && !TXN_COMMANDS.contains(&name.as_str()) {
                return Err(CommandError::new(
                    263,
                    format!("Cannot run '{name}' in a multi-document transaction."),
                ));
            }
        }
        validate_db_name(&db)?;
        let ctx = Ctx {
            shared,
            conn,
            db: db.clone(),
            name: name.clone(),
            cmd: body,
            session,
        };
        if ctx.in_txn() && !matches!(name.as_str(), "commitTransaction" | "abortTransaction") {
            txn::begin_statement(&ctx)?;
        }
        if let Some((key, n)) = ctx.retryable_write()
            && RETRYABLE_WRITES.contains(&name.as_str())
        {
            if let Some(cached) = txn::cached_retry(&ctx, key, n) {
                return Ok(cached);
            }
            let reply = dispatch(&ctx).await?;
            txn::remember_retry(&ctx, key, n, &reply);
            return Ok(reply);
        }
        dispatch(&ctx).await
    }
    .await;

    let mut reply = match result {
        Ok(mut d) => {
            if !d.contains_key("ok") {
                d.insert("ok", 1.0);
            }
            let write_concern_error = write_concern_error.or_else(|| {
                if shared.is_replica_set() && WRITE_CONCERN_COMMANDS.contains(&name.as_str()) {
                    unsatisfiable_write_concern(write_concern.as_ref())
                } else {
                    None
                }
            });
            if let Some(wce) = write_concern_error {
                add_write_concern_error(&mut d, wce, label_ctx);
            }
            // A mongos names the shard that can recover a transaction's outcome; drivers send
            // it back with commitTransaction / abortTransaction.
            if label_ctx.in_transaction && shared.is_sharded() && conn.listener == Listener::Main {
                d.insert(
                    "recoveryToken",
                    doc! {"recoveryShardId": crate::cluster::shard_name(0)},
                );
            }
            d
        }
        Err(e) => {
            debug!(connection_id = conn.id, command = %name, code = e.code, "command failed");
            e.to_document(label_ctx)
        }
    };
    append_cluster_time(shared, &mut reply);
    Some(reply)
}

/// Commands that wait for their write concern once they have succeeded.
const WRITE_CONCERN_COMMANDS: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "bulkWrite",
    "commitTransaction",
    "abortTransaction",
    "create",
    "drop",
    "dropDatabase",
    "renameCollection",
    "createIndexes",
    "dropIndexes",
    "deleteIndexes",
];

/// The write concern error a single-member replica set reports once the write is applied: `w`
/// asking for more members than the one there is (UnsatisfiableWriteConcern, 100), or naming a
/// mode other than `majority` (UnknownReplWriteConcern, 79; the set configures no tags).
fn unsatisfiable_write_concern(wc: Option<&Document>) -> Option<Document> {
    let wc = wc?;
    let (code, message) = match wc.get("w")? {
        Bson::String(mode) if mode != "majority" => (
            79,
            format!("No write concern mode named '{mode}' found in replica set configuration"),
        ),
        w => match crate::values::as_f64(w) {
            Some(n) if n > 1.0 => (100, "Not enough data-bearing nodes".to_string()),
            _ => return None,
        },
    };
    let mut applied = wc.clone();
    applied.insert("provenance", "clientSupplied");
    Some(doc! {
        "code": code,
        "codeName": crate::error::code_name(code),
        "errmsg": message,
        "errInfo": {"writeConcern": applied},
    })
}

/// Reports an injected write concern error on an otherwise successful reply, with the labels
/// a server adds for it.
fn add_write_concern_error(reply: &mut Document, mut wce: Document, ctx: LabelContext) {
    let labels: Vec<Bson> = match wce.remove("errorLabels") {
        Some(Bson::Array(l)) => l,
        _ => {
            let code = wce
                .get("code")
                .and_then(crate::values::as_f64)
                .unwrap_or(0.0) as i32;
            let retryable_command = ctx.retryable_write || ctx.is_commit || ctx.is_abort;
            if retryable_command && crate::error::is_retryable_code(code) {
                vec![Bson::String(crate::error::RETRYABLE_WRITE.to_string())]
            } else {
                Vec::new()
            }
        }
    };
    if !wce.contains_key("codeName")
        && let Some(code) = wce.get("code").and_then(crate::values::as_f64)
    {
        wce.insert("codeName", crate::error::code_name(code as i32));
    }
    reply.insert("writeConcernError", wce);
    if !labels.is_empty() {
        reply.insert("errorLabels", labels);
    }
}

/// Adds `operationTime` and `$clusterTime` (replica-set mode only).
pub fn append_cluster_time(shared: &Shared, reply: &mut Document) {
    if !shared.is_replica_set() {
        return;
    }
    let ts = shared.lock().oplog.cluster_time();
    reply.insert("operationTime", Bson::Timestamp(ts));
    reply.insert(
        "$clusterTime",
        doc! {
            "clusterTime": Bson::Timestamp(ts),
            "signature": {
                "hash": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0u8; 20] }),
                "keyId": 0i64,
            },
        },
    );
}

async fn dispatch(ctx: &Ctx<'_>) -> CmdResult<Document> {
    if ctx.shared.is_sharded() {
        match ctx.conn.listener {
            Listener::Shard(i) => return sharding::shard_command(ctx, i),
            Listener::Main => {
                if let Some(reply) = sharding::router_command(ctx) {
                    return reply;
                }
            }
        }
    }
    local::refuse_oplog_writes(ctx)?;
    match ctx.name.as_str() {
        "hello" => admin::hello(ctx, false),
        "isMaster" | "ismaster" => admin::hello(ctx, true),
        "ping" => Ok(Document::new()),
        "buildInfo" | "buildinfo" => Ok(admin::build_info(ctx)),
        "replSetGetConfig" => admin::repl_set_get_config(ctx),
        "replSetGetStatus" => admin::repl_set_get_status(ctx),
        "serverStatus" => Ok(admin::server_status(ctx)),
        "getCmdLineOpts" => Ok(doc! {"argv": ["mongo-sim"], "parsed": {}}),
        "getParameter" => admin::get_parameter(ctx),
        "setParameter" => Ok(doc! {"was": Bson::Null}),
        "setFeatureCompatibilityVersion" => admin::set_feature_compatibility_version(ctx),
        "connectionStatus" => {
            Ok(doc! {"authInfo": {"authenticatedUsers": [], "authenticatedUserRoles": []}})
        }
        "whatsmyuri" => Ok(doc! {"you": ctx.conn.peer.clone()}),
        "hostInfo" => Ok(doc! {"system": {"hostname": ctx.shared.me.clone()}}),
        "endSessions" => txn::end_sessions(ctx),
        "refreshSessions" => Ok(Document::new()),
        "killAllSessions" | "killAllSessionsByPattern" | "killSessions" => txn::kill_sessions(ctx),
        "commitTransaction" => txn::commit(ctx),
        "abortTransaction" => txn::abort(ctx),
        "listDatabases" => admin::list_databases(ctx),
        "listCollections" => admin::list_collections(ctx),
        "create" => admin::create(ctx),
        "collMod" => admin::coll_mod(ctx),
        "drop" => admin::drop(ctx),
        "renameCollection" => admin::rename_collection(ctx),
        "dropDatabase" => admin::drop_database(ctx),
        "listIndexes" => admin::list_indexes(ctx),
        "createIndexes" => admin::create_indexes(ctx),
        "dropIndexes" | "deleteIndexes" => admin::drop_indexes(ctx),
        "dbStats" | "collStats" => Ok(doc! {"ns": ctx.db.clone()}),
        "bulkWrite" => bulk_write::bulk_write(ctx).await,
        "insert" => crud::insert(ctx).await,
        "update" => crud::update(ctx).await,
        "delete" => crud::delete(ctx).await,
        "findAndModify" | "findandmodify" => crud::find_and_modify(ctx).await,
        "find" if local::targets_oplog(ctx) => local::find(ctx),
        "find" => crud::find(ctx),
        "count" if local::targets_oplog(ctx) => local::count(ctx),
        "count" => crud::count(ctx),
        "distinct" => crud::distinct(ctx),
        "aggregate" => {
            if change_stream::is_change_stream(&ctx.cmd) {
                change_stream::aggregate(ctx)
            } else if local::targets_oplog(ctx) {
                local::aggregate(ctx)
            } else {
                crud::aggregate(ctx)
            }
        }
        "getMore" => {
            if change_stream::is_change_cursor(ctx)? {
                change_stream::get_more(ctx).await
            } else {
                crud::get_more(ctx)
            }
        }
        "killCursors" => crud::kill_cursors(ctx),
        "configureFailPoint" => failpoint::configure(ctx),
        other => Err(CommandError::new(59, format!("no such command: '{other}'"))),
    }
}
