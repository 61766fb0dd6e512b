//! Change streams: `aggregate` with `$changeStream`, `getMore` with await, resume tokens,
//! post-batch tokens, invalidation and history loss.

use std::pin::pin;
use std::time::{Duration, Instant};

use bson::{Bson, Document, Timestamp, doc};
use tracing::debug;

use super::Ctx;
use super::crud::cursor_id;
use crate::cursor::{BeforeChange, ChangeCursor, Cursor, EventOptions, FullDocument, Scope};
use crate::error::{CmdResult, CommandError, MAX_BSON_OBJECT_SIZE};
use crate::namespace::Namespace;
use crate::oplog::{EventKind, KIND_EVENT, KIND_INVALIDATE, OplogEntry, TokenKey};
use crate::state::State;
use crate::values::doc_key;

const DEFAULT_BATCH: usize = 101;
const DEFAULT_AWAIT: Duration = Duration::from_millis(1000);
/// Longest a getMore waits, whatever maxTimeMS says.
const MAX_AWAIT_MS: f64 = 3_600_000.0;

pub fn is_change_stream(cmd: &Document) -> bool {
    matches!(cmd.get("pipeline"), Some(Bson::Array(p))
        if matches!(p.first(), Some(Bson::Document(s)) if s.contains_key("$changeStream")))
}

pub fn is_change_cursor(ctx: &Ctx<'_>) -> CmdResult<bool> {
    let id = cursor_id(&ctx.cmd)?;
    Ok(matches!(
        ctx.shared.lock().cursors.get(&id),
        Some(Cursor::Change(_))
    ))
}

fn history_lost() -> CommandError {
    CommandError::new(
        286,
        "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
    )
}

fn token_arg(v: &Bson, which: &str) -> CmdResult<TokenKey> {
    let Bson::Document(d) = v else {
        return Err(CommandError::type_mismatch(format!(
            "'{which}' must be a resume token document"
        )));
    };
    TokenKey::from_document(d)
        .ok_or_else(|| CommandError::new(260, "Invalid resume token: unrecognised _data"))
}

/// The position just before `ts`, so that events at `ts` are included.
fn before(ts: Timestamp) -> TokenKey {
    if ts.increment > 0 {
        TokenKey::new(
            Timestamp {
                time: ts.time,
                increment: ts.increment - 1,
            },
            u32::MAX,
            2,
        )
    } else {
        TokenKey::new(
            Timestamp {
                time: ts.time.saturating_sub(1),
                increment: u32::MAX,
            },
            u32::MAX,
            2,
        )
    }
}

pub fn aggregate(ctx: &Ctx<'_>) -> CmdResult<Document> {
    if ctx.shared.config.standalone {
        return Err(CommandError::new(
            40573,
            "The $changeStream stage is only supported on replica sets",
        ));
    }
    if ctx.in_txn() {
        return Err(CommandError::new(
            263,
            "$changeStream may not be opened in a transaction",
        ));
    }
    let Some(Bson::Array(pipeline)) = ctx.cmd.get("pipeline") else {
        return Err(CommandError::failed_to_parse("pipeline must be an array"));
    };
    let Some(Bson::Document(first)) = pipeline.first() else {
        return Err(CommandError::failed_to_parse("empty pipeline"));
    };
    let spec = match first.get("$changeStream") {
        Some(Bson::Document(d)) => d.clone(),
        _ => {
            return Err(CommandError::failed_to_parse(
                "$changeStream must be an object",
            ));
        }
    };
    let pipeline = crate::stages::parse_change_stream(&pipeline[1..])?;
    let options = event_options(ctx, &spec)?;
    let all_for_cluster = matches!(spec.get("allChangesForCluster"), Some(Bson::Boolean(true)));
    let (scope, ns) = match ctx.cmd.get("aggregate") {
        Some(Bson::String(c)) => {
            super::validate_collection_name(c)?;
            let ns = Namespace::new(ctx.db.clone(), c.clone());
            // A view (a time-series collection is one over its buckets) has no change stream.
            let kind = ctx
                .shared
                .lock()
                .store
                .collection(&ns)
                .map_or("collection", |coll| coll.kind());
            if kind != "collection" {
                return Err(CommandError::new(
                    166,
                    format!("Namespace {ns} is a view, not a collection"),
                ));
            }
            (Scope::Collection(ns.clone()), ns.to_string())
        }
        Some(v) if crate::values::as_f64(v) == Some(1.0) => {
            if all_for_cluster {
                if ctx.db != "admin" {
                    return Err(CommandError::new(
                        ErrorCodes::CLUSTER_ON_ADMIN,
                        "$changeStream with allChangesForCluster must be run against the admin database",
                    ));
                }
                (Scope::Cluster, "admin.$cmd.aggregate".to_string())
            } else {
                (
                    Scope::Database(ctx.db.clone()),
                    format!("{}.$cmd.aggregate", ctx.db),
                )
            }
        }
        _ => {
            return Err(CommandError::failed_to_parse(
                "aggregate needs a collection name or 1",
            ));
        }
    };
    let resume_after = spec.get("resumeAfter");
    let start_after = spec.get("startAfter");
    let start_at = spec.get("startAtOperationTime");
    if resume_after.is_some() && start_after.is_some() {
        return Err(CommandError::new(
            50865,
            "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage",
        ));
    }
    if start_at.is_some() && (resume_after.is_some() || start_after.is_some()) {
        return Err(CommandError::new(
            40674,
            "Only one type of resume option is allowed, but multiple were found.",
        ));
    }
    let batch = match ctx.cmd.get("cursor") {
        Some(Bson::Document(c)) => c
            .get("batchSize")
            .and_then(crate::values::as_f64)
            .map(|n| n.max(0.0) as usize)
            .unwrap_or(DEFAULT_BATCH),
        _ => DEFAULT_BATCH,
    };

    let mut st = ctx.shared.lock();
    let after = if let Some(t) = resume_after {
        let key = token_arg(t, "resumeAfter")?;
        if key.kind == KIND_INVALIDATE {
            return Err(CommandError::new(
                260,
                "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.",
            ));
        }
        if st.oplog.lost_after(key) {
            return Err(history_lost());
        }
        key
    } else if let Some(t) = start_after {
        let key = token_arg(t, "startAfter")?;
        if st.oplog.lost_after(key) {
            return Err(history_lost());
        }
        key
    } else if let Some(t) = start_at {
        let Bson::Timestamp(ts) = t else {
            return Err(CommandError::type_mismatch(
                "startAtOperationTime must be a timestamp",
            ));
        };
        if st.oplog.lost_from(*ts) {
            return Err(history_lost());
        }
        before(*ts)
    } else {
        TokenKey::high_water(st.oplog.cluster_time())
    };
    if after.fragment.is_some() && !pipeline.split {
        return Err(CommandError::new(
            280,
            "To resume from a split event, the $changeStream pipeline must include a $changeStreamSplitLargeEvent stage",
        ));
    }
    let mut cursor = ChangeCursor {
        scope,
        after,
        options,
        pipeline,
        ns: ns.clone(),
    };
    let (events, closed) = scan(&st, &mut cursor, batch)?;
    let token = cursor.after.to_document();
    let id = if closed || batch == usize::MAX {
        0
    } else {
        let id = st.new_cursor_id();
        st.put_cursor(id, Cursor::Change(Box::new(cursor)));
        id
    };
    drop(st);
    debug!(cursor_id = id, namespace = %ns, events = events.len(), "change stream opened");
    Ok(doc! {"cursor": {"firstBatch": events, "postBatchResumeToken": token, "id": id, "ns": ns}})
}

struct ErrorCodes;
impl ErrorCodes {
    const CLUSTER_ON_ADMIN: i32 = 73;
}

pub async fn get_more(ctx: &Ctx<'_>) -> CmdResult<Document> {
    let id = cursor_id(&ctx.cmd)?;
    let batch = ctx
        .cmd
        .get("batchSize")
        .and_then(crate::values::as_f64)
        .filter(|n| *n > 0.0)
        .map(|n| n as usize)
        .unwrap_or(DEFAULT_BATCH);
    let wait = ctx
        .cmd
        .get("maxTimeMS")
        .and_then(crate::values::as_f64)
        .map(|n| Duration::from_millis(n.clamp(0.0, MAX_AWAIT_MS) as u64))
        .unwrap_or(DEFAULT_AWAIT);
    let mut cursor = {
        let mut st = ctx.shared.lock();
        match st.cursors.remove(&id) {
            Some(Cursor::Change(c)) => c,
            Some(other) => {
                st.cursors.insert(id, other);
                return Err(CommandError::new(
                    43,
                    format!("cursor id {id} is not a change stream"),
                ));
            }
            None => return Err(CommandError::new(43, format!("cursor id {id} not found"))),
        }
    };
    if let Some(Bson::String(coll)) = ctx.cmd.get("collection") {
        let expected = cursor.ns.split_once('.').map(|(_, c)| c).unwrap_or("");
        if coll != expected && !cursor.ns.ends_with(".$cmd.aggregate") {
            ctx.shared.lock().put_cursor(id, Cursor::Change(cursor));
            return Err(CommandError::new(
                13,
                "Requested getMore on a namespace that the cursor does not belong to",
            ));
        }
    }
    let deadline = Instant::now() + wait;
    let (events, closed) = loop {
        let mut woken = pin!(ctx.shared.history_grew.notified());
        woken.as_mut().enable();
        let (events, closed) = {
            let st = ctx.shared.lock();
            scan(&st, &mut cursor, batch)?
        };
        let now = Instant::now();
        if !events.is_empty() || closed || now >= deadline {
            break (events, closed);
        }
        let _ = tokio::time::timeout(deadline - now, woken).await;
    };
    let token = cursor.after.to_document();
    let ns = cursor.ns.clone();
    let reply_id = if closed {
        0
    } else {
        ctx.shared.lock().put_cursor(id, Cursor::Change(cursor));
        id
    };
    Ok(
        doc! {"cursor": {"nextBatch": events, "postBatchResumeToken": token, "id": reply_id, "ns": ns}},
    )
}

/// The `$changeStream` options that shape events: `fullDocument`,
/// `fullDocumentBeforeChange` and `showExpandedEvents`.
fn event_options(ctx: &Ctx<'_>, spec: &Document) -> CmdResult<EventOptions> {
    let string_option = |name: &str, allowed: &[&str]| -> CmdResult<Option<String>> {
        match spec.get(name) {
            None => Ok(None),
            Some(Bson::String(s)) if allowed.contains(&s.as_str()) => Ok(Some(s.clone())),
            Some(Bson::String(s)) => Err(CommandError::bad_value(format!(
                "Enumeration value '{s}' for field '$changeStream.{name}' is not a valid value."
            ))),
            Some(other) => Err(CommandError::type_mismatch(format!(
                "BSON field '$changeStream.{name}' is the wrong type '{}', expected type 'string'",
                crate::expression::type_name(Some(other))
            ))),
        }
    };
    let full_document = match string_option(
        "fullDocument",
        &["default", "updateLookup", "whenAvailable", "required"],
    )?
    .as_deref()
    {
        Some("updateLookup") => FullDocument::UpdateLookup,
        Some("whenAvailable") => FullDocument::WhenAvailable,
        Some("required") => FullDocument::Required,
        _ => FullDocument::Default,
    };
    let before_change = match string_option(
        "fullDocumentBeforeChange",
        &["off", "whenAvailable", "required"],
    )?
    .as_deref()
    {
        Some("whenAvailable") => BeforeChange::WhenAvailable,
        Some("required") => BeforeChange::Required,
        _ => BeforeChange::Off,
    };
    let expanded = match spec.get("showExpandedEvents") {
        None => false,
        Some(Bson::Boolean(b)) => *b,
        Some(other) => {
            return Err(CommandError::type_mismatch(format!(
                "BSON field '$changeStream.showExpandedEvents' is the wrong type '{}', expected type 'bool'",
                crate::expression::type_name(Some(other))
            )));
        }
    };
    Ok(EventOptions {
        full_document,
        before_change,
        expanded,
        disambiguated_paths: super::admin::release(&ctx.shared.config) >= (7, 0),
    })
}

/// Does this entry end the stream (after being reported)?
fn invalidates(scope: &Scope, e: &OplogEntry) -> bool {
    match scope {
        Scope::Collection(ns) => {
            matches!(e.kind, EventKind::Drop | EventKind::Rename { .. }) && e.ns == *ns
        }
        Scope::Database(db) => matches!(e.kind, EventKind::DropDatabase) && e.ns.db == *db,
        Scope::Cluster => false,
    }
}

fn visible(cursor: &ChangeCursor, e: &OplogEntry) -> bool {
    if e.ns.coll.starts_with("system.") {
        return false;
    }
    if e.kind.is_expanded_only() && !cursor.options.expanded {
        return false;
    }
    match &cursor.scope {
        Scope::Collection(ns) => e.ns == *ns,
        Scope::Database(db) => e.ns.db == *db,
        Scope::Cluster => true,
    }
}

fn bson_size(d: &Document) -> usize {
    d.to_vec().map_or(usize::MAX, |b| b.len())
}

/// An event as the client receives it, after the pipeline's stages; `None` if a stage
/// dropped it.
fn render(st: &State, cursor: &ChangeCursor, e: &OplogEntry) -> CmdResult<Option<Document>> {
    let ev = event_doc(st, e, e.key(), &cursor.options)?;
    apply_stages(ev, &cursor.pipeline.stages)
}

fn too_large(ev: &Document, size: usize) -> CommandError {
    let data = ev
        .get_document("_id")
        .and_then(|t| t.get_str("_data"))
        .unwrap_or_default();
    let first = format!("_id: {{ _data: \"{data}\" }}");
    CommandError::object_too_large(size, &first)
}

/// Collects up to `limit` events after the cursor's position, advancing it. Returns the
/// events and whether the stream was invalidated (the cursor is then finished).
///
/// As on MongoDB, a batch holds at most 16 MiB of events (always at least one), and an event
/// larger than 16 MiB fails the command with `BSONObjectTooLarge` (10334) unless the pipeline
/// ends with `$changeStreamSplitLargeEvent`, which splits it into fragments.
fn scan(st: &State, cursor: &mut ChangeCursor, limit: usize) -> CmdResult<(Vec<Bson>, bool)> {
    if st.oplog.lost_after(cursor.after) {
        return Err(history_lost());
    }
    let mut out = Vec::new();
    let mut bytes = 0usize;
    // Events up to this time may be reported: on a sharded cluster every shard has applied
    // past them (an idle shard holds the stream back until its no-op).
    let upto = st.oplog.visible_time();
    // Positioned on a fragment: the rest of that event's fragments come first.
    if let Some(done) = cursor.after.fragment {
        let base = cursor.after.without_fragment();
        let Some(prev) = st.oplog.entry(base) else {
            return Err(CommandError::new(
                280,
                "cannot resume stream; the resume token was not found",
            ));
        };
        let Some(ev) = render(st, cursor, prev)? else {
            return Err(CommandError::new(
                280,
                "cannot resume stream; the resume token was not found",
            ));
        };
        if bson_size(&ev) <= MAX_BSON_OBJECT_SIZE {
            return Err(CommandError::new(
                280,
                "Attempted to resume from a split event fragment, but the event in the resumed stream was not large enough to be split",
            ));
        }
        let fragments = split_event(&ev, base)?;
        if fragments.len() <= done as usize {
            return Err(CommandError::new(
                280,
                "Attempted to resume from a split event, but the resumed stream produced a different split. Ensure that the pipeline used to resume is the same as the original",
            ));
        }
        for (n, fragment) in fragments.into_iter().enumerate().skip(done as usize + 1) {
            let size = bson_size(&fragment);
            if out.len() >= limit || (!out.is_empty() && bytes + size > MAX_BSON_OBJECT_SIZE) {
                return Ok((out, false));
            }
            bytes += size;
            out.push(Bson::Document(fragment));
            cursor.after = base.with_fragment(n as u32);
        }
        if invalidates(&cursor.scope, prev) {
            cursor.after = base;
            if out.len() >= limit {
                return Ok((out, false));
            }
            let inv = TokenKey::new(prev.ts, prev.op_index, KIND_INVALIDATE);
            out.push(Bson::Document(invalidate_doc(prev, inv)));
            cursor.after = inv;
            return Ok((out, true));
        }
    }
    // A stream positioned exactly on an invalidating event still owes its invalidate.
    if cursor.after.kind == KIND_EVENT
        && cursor.after.fragment.is_none()
        && let Some(prev) = st.oplog.entry(cursor.after)
        && invalidates(&cursor.scope, prev)
    {
        if limit == 0 {
            return Ok((out, false));
        }
        let key = TokenKey::new(prev.ts, prev.op_index, KIND_INVALIDATE);
        out.push(Bson::Document(invalidate_doc(prev, key)));
        cursor.after = key;
        return Ok((out, true));
    }
    while out.len() < limit {
        let Some(e) = st.oplog.next_after(cursor.after, upto) else {
            // Scanned everything reportable: the position covers the history up to then.
            let hw = TokenKey::high_water(upto);
            if hw > cursor.after {
                cursor.after = hw;
            }
            return Ok((out, false));
        };
        let key = e.key();
        let previous = cursor.after;
        cursor.after = key;
        if !visible(cursor, e) {
            continue;
        }
        if let Some(ev) = render(st, cursor, e)? {
            let size = bson_size(&ev);
            if size > MAX_BSON_OBJECT_SIZE {
                if !cursor.pipeline.split {
                    return Err(too_large(&ev, size));
                }
                let fragments = split_event(&ev, key)?;
                let mut delivered = false;
                for (n, fragment) in fragments.into_iter().enumerate() {
                    let size = bson_size(&fragment);
                    if out.len() >= limit
                        || (!out.is_empty() && bytes + size > MAX_BSON_OBJECT_SIZE)
                    {
                        // The batch is full: the next one continues this event.
                        if !delivered {
                            cursor.after = previous;
                        }
                        return Ok((out, false));
                    }
                    bytes += size;
                    out.push(Bson::Document(fragment));
                    cursor.after = key.with_fragment(n as u32);
                    delivered = true;
                }
                // Every fragment went out: the position is the event's own.
                cursor.after = key;
            } else {
                if !out.is_empty() && bytes + size > MAX_BSON_OBJECT_SIZE {
                    // The batch is full: this event opens the next one.
                    cursor.after = previous;
                    return Ok((out, false));
                }
                bytes += size;
                out.push(Bson::Document(ev));
            }
        }
        if invalidates(&cursor.scope, e) {
            if out.len() < limit {
                let inv = TokenKey::new(e.ts, e.op_index, KIND_INVALIDATE);
                out.push(Bson::Document(invalidate_doc(e, inv)));
                cursor.after = inv;
                return Ok((out, true));
            }
            return Ok((out, false));
        }
    }
    Ok((out, false))
}

/// Splits an oversized event as `$changeStreamSplitLargeEvent` does: its fields other than
/// `_id`, ordered by encoded size then name, fill fragments greedily; each fragment starts
/// with its own resume token and `splitEvent: {fragment, of}`. A fragment (counted with the
/// sort key MongoDB attaches to it) stays below 16 MiB less the event token's size.
fn split_event(ev: &Document, key: TokenKey) -> CmdResult<Vec<Document>> {
    let element_size = |k: &str, v: &Bson| {
        let mut one = Document::new();
        one.insert(k, v.clone());
        bson_size(&one).saturating_sub(5)
    };
    let mut fields: Vec<(usize, &String, &Bson)> = ev
        .iter()
        .filter(|(k, _)| k.as_str() != "_id")
        .map(|(k, v)| (element_size(k, v), k, v))
        .collect();
    if fields.is_empty() {
        return Err(CommandError::new(
            7182502,
            "Cannot split an empty event or an event containing solely '_id' field",
        ));
    }
    fields.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let max = MAX_BSON_OBJECT_SIZE.saturating_sub(bson_size(&key.to_document()));
    let mut fragments: Vec<Document> = Vec::new();
    let mut it = fields.into_iter().peekable();
    while it.peek().is_some() {
        let token = key.with_fragment(fragments.len() as u32).to_document();
        let mut fragment = doc! {
            "_id": token.clone(),
            "splitEvent": {"fragment": fragments.len() as i32 + 1, "of": 0i32},
        };
        let sort_key = doc! {"$sortKey": {"": token}};
        let mut size = bson_size(&fragment) + bson_size(&sort_key) - 5;
        while let Some((field_size, k, v)) = it.next_if(|_| true) {
            fragment.insert(k.clone(), v.clone());
            size += field_size;
            match it.peek() {
                Some((next, _, _)) if size + next <= max => {}
                _ => break,
            }
        }
        if size > max {
            return Err(CommandError::new(
                7182500,
                format!(
                    "Splitting change event failed: fragment size {size} is greater than maximum allowed fragment size {max}"
                ),
            ));
        }
        fragments.push(fragment);
    }
    let of = fragments.len() as i32;
    for f in &mut fragments {
        if let Ok(split) = f.get_document_mut("splitEvent") {
            split.insert("of", of);
        }
    }
    Ok(fragments)
}

/// Runs the user's stages on one event; `None` if filtered out. Changing `_id` is fatal.
fn apply_stages(ev: Document, stages: &[crate::stages::Stage]) -> CmdResult<Option<Document>> {
    let token = ev.get("_id").cloned();
    let mut ev = ev;
    for stage in stages {
        match crate::stages::apply(stage, ev)? {
            Some(next) => ev = next,
            None => return Ok(None),
        }
    }
    if ev.get("_id").cloned() != token {
        return Err(CommandError::new(
            280,
            "Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. \
             Modifying the _id field of an event makes it impossible to resume the stream from that point. \
             Only transformations that retain the unmodified _id field are allowed.",
        ));
    }
    Ok(Some(ev))
}

fn ns_doc(ns: &Namespace) -> Document {
    if ns.coll.is_empty() {
        doc! {"db": ns.db.clone()}
    } else {
        doc! {"db": ns.db.clone(), "coll": ns.coll.clone()}
    }
}

fn invalidate_doc(e: &OplogEntry, key: TokenKey) -> Document {
    doc! {
        "_id": key.to_document(),
        "operationType": "invalidate",
        "clusterTime": Bson::Timestamp(e.ts),
        "wallTime": e.wall,
    }
}

/// The event named in a missing-image error, as MongoDB describes it.
fn described(e: &OplogEntry) -> String {
    let mut d = doc! {
        "operationType": e.kind.operation_type(),
        "ns": ns_doc(&e.ns),
        "clusterTime": Bson::Timestamp(e.ts),
    };
    if let Some(t) = &e.txn {
        d.insert("txnNumber", t.txn_number);
    }
    crate::expression::display(&Bson::Document(d))
}

fn image(doc: Option<&std::sync::Arc<Document>>) -> Bson {
    doc.map_or(Bson::Null, |d| Bson::Document((**d).clone()))
}

/// An event's `documentKey`: `{_id}`, or on a sharded collection its shard key fields and
/// `_id` as recorded with the event.
fn document_key(e: &OplogEntry, id: &Bson) -> Document {
    e.document_key
        .clone()
        .unwrap_or_else(|| doc! {"_id": id.clone()})
}

/// The change event as a client receives it.
fn event_doc(
    st: &State,
    e: &OplogEntry,
    key: TokenKey,
    options: &EventOptions,
) -> CmdResult<Document> {
    let mut d = doc! {
        "_id": key.to_document(),
        "operationType": e.kind.operation_type(),
        "clusterTime": Bson::Timestamp(e.ts),
    };
    if options.expanded
        && let Some(uuid) = &e.uuid
    {
        d.insert("collectionUUID", Bson::Binary(uuid.clone()));
    }
    d.insert("wallTime", e.wall);
    let pre_image = e.images.as_ref().and_then(|i| i.pre.as_ref());
    // The pre-image stage runs before the post-image stage, so its error comes first.
    let wants_pre = options.before_change != BeforeChange::Off
        && matches!(
            e.kind,
            EventKind::Update { .. } | EventKind::Replace { .. } | EventKind::Delete { .. }
        );
    if wants_pre && pre_image.is_none() && options.before_change == BeforeChange::Required {
        return Err(CommandError::new(
            47,
            format!(
                "Change stream was configured to require a pre-image for all update, delete and replace events, but the pre-image was not found for event: {}",
                described(e)
            ),
        ));
    }
    match &e.kind {
        EventKind::Insert { id, doc } | EventKind::Replace { id, doc } => {
            d.insert("fullDocument", Bson::Document((**doc).clone()));
            d.insert("ns", ns_doc(&e.ns));
            d.insert("documentKey", document_key(e, id));
        }
        EventKind::Update {
            id,
            updated,
            removed,
            truncated,
            disambiguated,
        } => {
            match options.full_document {
                FullDocument::Default => {}
                FullDocument::UpdateLookup => {
                    let current = st
                        .store
                        .get(&e.ns, &doc_key(id), None)
                        .map(|d| Bson::Document((*d).clone()))
                        .unwrap_or(Bson::Null);
                    d.insert("fullDocument", current);
                }
                FullDocument::WhenAvailable | FullDocument::Required => {
                    let post = e.images.as_ref().and_then(|i| i.post.as_ref());
                    if post.is_none() && options.full_document == FullDocument::Required {
                        return Err(CommandError::new(
                            47,
                            format!(
                                "Change stream was configured to require a post-image for all update events, but the post-image was not found for event: {}",
                                described(e)
                            ),
                        ));
                    }
                    d.insert("fullDocument", image(post));
                }
            }
            d.insert("ns", ns_doc(&e.ns));
            d.insert("documentKey", document_key(e, id));
            let mut description = doc! {
                "updatedFields": updated.clone(),
                "removedFields": removed.iter().cloned().map(Bson::String).collect::<Vec<_>>(),
                "truncatedArrays": truncated.clone(),
            };
            if options.expanded && options.disambiguated_paths {
                description.insert("disambiguatedPaths", disambiguated.clone());
            }
            d.insert("updateDescription", description);
        }
        EventKind::Delete { id } => {
            d.insert("ns", ns_doc(&e.ns));
            d.insert("documentKey", document_key(e, id));
        }
        EventKind::Drop | EventKind::DropDatabase => {
            d.insert("ns", ns_doc(&e.ns));
        }
        EventKind::Rename { to, drop_target } => {
            d.insert("ns", ns_doc(&e.ns));
            d.insert("to", ns_doc(to));
            if options.expanded {
                let mut description = doc! {"to": ns_doc(to)};
                if let Some(uuid) = drop_target {
                    description.insert("dropTarget", Bson::Binary(uuid.clone()));
                }
                d.insert("operationDescription", description);
            }
        }
        EventKind::Create { description } | EventKind::ShardCollection { description } => {
            d.insert("ns", ns_doc(&e.ns));
            d.insert("operationDescription", description.clone());
        }
        EventKind::CreateIndexes { indexes } | EventKind::DropIndexes { indexes } => {
            d.insert("ns", ns_doc(&e.ns));
            d.insert(
                "operationDescription",
                doc! {"indexes": indexes.iter().cloned().map(Bson::Document).collect::<Vec<_>>()},
            );
        }
        EventKind::Modify {
            description,
            options_before,
        } => {
            d.insert("ns", ns_doc(&e.ns));
            d.insert("operationDescription", description.clone());
            d.insert(
                "stateBeforeChange",
                doc! {"collectionOptions": options_before.clone()},
            );
        }
    }
    if let Some(t) = &e.txn {
        d.insert("lsid", t.lsid.clone());
        d.insert("txnNumber", t.txn_number);
    }
    if wants_pre {
        d.insert("fullDocumentBeforeChange", image(pre_image));
    }
    Ok(d)
}
