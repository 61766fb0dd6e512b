//! Sessions, multi-document transactions and retryable writes.

use bson::{Bson, Document};
use tracing::debug;

use super::Ctx;
use crate::error::{CmdResult, CommandError};
use crate::oplog::TxnInfo;
use crate::state::TxnStatus;

/// Checks (and on `startTransaction` opens) the transaction a statement belongs to.
pub fn begin_statement(ctx: &Ctx<'_>) -> CmdResult<()> {
    let Some(s) = &ctx.session else { return Ok(()) };
    let Some(n) = s.txn_number else { return Ok(()) };
    let mut st = ctx.shared.lock();
    let current = st.sessions.get(&s.key).map(|x| (x.txn_number, x.status));
    if s.start_transaction {
        if let Some((cur, status)) = current {
            if n < cur {
                return Err(CommandError::new(
                    225,
                    format!(
                        "Cannot start transaction {n} on session because a newer transaction {cur} has already started"
                    ),
                ));
            }
            if n == cur && status != TxnStatus::None {
                return Err(CommandError::no_such_transaction(n)
                    .with_labels(&[])
                    .reword(format!(
                        "Cannot start a transaction with txnNumber {n}: it has already been used"
                    )));
            }
        }
        st.begin_txn(&s.key, &s.lsid, n, ctx.shared.config.transaction_lifetime);
        drop(st);
        ctx.shared.txn_ended.notify_waiters();
        debug!(txn_number = n, "transaction started");
        return Ok(());
    }
    match current {
        Some((cur, TxnStatus::InProgress)) if cur == n => Ok(()),
        Some((cur, _)) if n < cur => Err(CommandError::new(
            225,
            format!(
                "Cannot continue transaction {n} because a newer transaction {cur} has started"
            ),
        )),
        _ => Err(CommandError::no_such_transaction(n)),
    }
}

impl CommandError {
    fn reword(mut self, message: String) -> Self {
        self.message = message;
        self
    }
}

/// Aborts the transaction of this command's session after a failed statement.
pub fn abort_after_error(ctx: &Ctx<'_>) {
    if let Some(key) = ctx.txn_key() {
        let ended = ctx.shared.lock().end_open_txn(key);
        if ended {
            ctx.shared.txn_ended.notify_waiters();
        }
    }
}

/// The stored reply of a retried write, if this txnNumber already ran.
pub fn cached_retry(ctx: &Ctx<'_>, key: &[u8], n: i64) -> Option<Document> {
    let mut st = ctx.shared.lock();
    let s = st.sessions.get(key)?;
    if let Some((m, reply)) = &s.retry
        && *m == n
    {
        let mut reply = reply.clone();
        reply.remove("operationTime");
        reply.remove("$clusterTime");
        return Some(reply);
    }
    if s.txn.is_some() && s.txn_number < n {
        st.end_open_txn(key);
    }
    None
}

pub fn remember_retry(ctx: &Ctx<'_>, key: &[u8], n: i64, reply: &Document) {
    let Some(s) = &ctx.session else { return };
    let mut st = ctx.shared.lock();
    let session = st.session(key, &s.lsid);
    if n >= session.txn_number {
        session.txn_number = n;
        session.status = TxnStatus::None;
        session.retry = Some((n, reply.clone()));
    }
}

fn txn_number(ctx: &Ctx<'_>) -> CmdResult<(Vec<u8>, i64)> {
    let s = ctx
        .session
        .as_ref()
        .ok_or_else(|| CommandError::new(50768, "commitTransaction requires a session id"))?;
    let n = s
        .txn_number
        .ok_or_else(|| CommandError::new(50768, "commitTransaction requires a txnNumber"))?;
    if s.autocommit != Some(false) {
        return Err(CommandError::new(50768, "'autocommit: false' is required"));
    }
    Ok((s.key.clone(), n))
}

pub fn commit(ctx: &Ctx<'_>) -> CmdResult<Document> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "commitTransaction may only be run against the admin database.",
        ));
    }
    let (key, n) = txn_number(ctx)?;
    let mut st = ctx.shared.lock();
    let Some(session) = st.sessions.get_mut(&key) else {
        return Err(CommandError::no_such_transaction(n));
    };
    if session.txn_number != n {
        return Err(CommandError::no_such_transaction(n));
    }
    match session.status {
        TxnStatus::Committed => return Ok(Document::new()),
        TxnStatus::InProgress => {}
        _ => return Err(CommandError::no_such_transaction(n)),
    }
    let Some(txn) = session.txn.take() else {
        return Err(CommandError::no_such_transaction(n));
    };
    session.status = TxnStatus::Committed;
    let info = TxnInfo {
        lsid: session.lsid.clone(),
        txn_number: n,
    };
    st.active.remove(&txn.id);
    let min = st.min_snapshot();
    let events = txn.events.len();
    let state = &mut *st;
    state.store.commit(&mut state.oplog, txn, info, min);
    drop(st);
    debug!(txn_number = n, events, "transaction committed");
    ctx.shared.txn_ended.notify_waiters();
    if events > 0 {
        ctx.shared.history_grew.notify_waiters();
    }
    Ok(Document::new())
}

pub fn abort(ctx: &Ctx<'_>) -> CmdResult<Document> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "abortTransaction may only be run against the admin database.",
        ));
    }
    let (key, n) = txn_number(ctx)?;
    let mut st = ctx.shared.lock();
    let status = st
        .sessions
        .get(&key)
        .filter(|s| s.txn_number == n)
        .map(|s| s.status);
    match status {
        Some(TxnStatus::InProgress) => {
            st.end_open_txn(&key);
            drop(st);
            ctx.shared.txn_ended.notify_waiters();
            debug!(txn_number = n, "transaction aborted");
            Ok(Document::new())
        }
        Some(TxnStatus::Committed) => Err(CommandError::new(
            256,
            "Transaction has been committed and cannot be aborted",
        )),
        _ => Err(CommandError::no_such_transaction(n)),
    }
}

fn session_keys(list: Option<&Bson>) -> Vec<Vec<u8>> {
    let Some(Bson::Array(items)) = list else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|i| match i {
            Bson::Document(d) => match d.get("id") {
                Some(Bson::Binary(b)) => Some(b.bytes.clone()),
                _ => d.to_vec().ok(),
            },
            _ => None,
        })
        .collect()
}

pub fn end_sessions(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let keys = session_keys(ctx.cmd.get("endSessions"));
    let mut st = ctx.shared.lock();
    for k in &keys {
        st.end_open_txn(k);
        st.sessions.remove(k);
    }
    drop(st);
    ctx.shared.txn_ended.notify_waiters();
    Ok(Document::new())
}

pub fn kill_sessions(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let mut st = ctx.shared.lock();
    let keys: Vec<Vec<u8>> = if ctx.name == "killSessions" {
        session_keys(ctx.cmd.get("killSessions"))
    } else {
        st.sessions.keys().cloned().collect()
    };
    for k in &keys {
        st.end_open_txn(k);
    }
    drop(st);
    ctx.shared.txn_ended.notify_waiters();
    Ok(Document::new())
}
