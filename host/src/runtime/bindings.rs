//! The WIT contract bound to the host: generated types plus the import implementations, each a
//! thin translation onto [`Session`](super::session::Session).

use std::time::Instant;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::PROCESS_START;
use super::limits::Limiter;
use crate::domain::text::escape_untrusted;
use crate::domain::{Mode, Start};
use crate::session::{self, Refusal, RefusalKind, Session};

/// The generated bindings, kept in their own module: the WIT package's `handoff` namespace would
/// otherwise shadow this crate's name.
mod generated {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handoff-policy",
        with: {
            "handoff:policy/host.change-stream": super::StreamHandle,
        },
    });
}

pub use generated::HandoffPolicy;
pub use generated::exports::handoff::policy::policy as export;
use generated::handoff::policy::host as wit_host;
pub use generated::handoff::policy::types;

/// The host side of the `change-stream` resource. A run has at most one stream, owned by the
/// session; the handle only names it.
pub struct StreamHandle;

/// Everything a store holds for one run.
pub struct RunState {
    pub session: Session,
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limiter: Limiter,
    /// When the guest last got control back from the host (start of its current compute slice).
    pub slice_started: Instant,
    /// Why the host interrupted the guest, when it did.
    pub interrupted: Option<String>,
    /// What bounds the policy's waits in WASI.
    pub waits: super::wasi::Waits,
}

impl WasiView for RunState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn mode_from(mode: types::ResumeMode) -> Mode {
    match mode {
        types::ResumeMode::ResumeAfter => Mode::ResumeAfter,
        types::ResumeMode::StartAfter => Mode::StartAfter,
    }
}

/// A refused stream call as the contract's `stream-error`.
fn stream_error(refusal: Refusal) -> types::StreamError {
    let Refusal { kind, message } = refusal;
    match kind {
        RefusalKind::HistoryLost => types::StreamError::HistoryLost(message),
        RefusalKind::InvalidToken => types::StreamError::InvalidToken(message),
        RefusalKind::Fatal => types::StreamError::Fatal(message),
        RefusalKind::Unavailable => types::StreamError::Unavailable(message),
        RefusalKind::Conflict | RefusalKind::Rejected => types::StreamError::Rejected(message),
    }
}

/// A refused commit as the contract's `commit-error`.
fn commit_error(refusal: Refusal) -> types::CommitError {
    let Refusal { kind, message } = refusal;
    match kind {
        RefusalKind::Conflict => types::CommitError::Conflict(message),
        RefusalKind::Unavailable => types::CommitError::Unavailable(message),
        RefusalKind::HistoryLost
        | RefusalKind::InvalidToken
        | RefusalKind::Fatal
        | RefusalKind::Rejected => types::CommitError::Rejected(message),
    }
}

impl RunState {
    /// Every import ends here: the guest's next compute slice starts now.
    /// A commit of both commit functions (`commit-batch`, `commit-records`), once their decisions
    /// are in the session's terms.
    fn commit_decisions(
        &mut self,
        expected: Option<String>,
        next: &str,
        mode: types::ResumeMode,
        decisions: Vec<session::Decision>,
    ) -> Result<(), types::CommitError> {
        let result = self
            .session
            .commit_batch(expected.as_deref(), next, mode_from(mode), decisions)
            .map_err(commit_error);
        self.back_to_guest(result)
    }

    fn back_to_guest<R>(&mut self, result: R) -> R {
        self.slice_started = Instant::now();
        result
    }
}

impl types::Host for RunState {}

impl wit_host::Host for RunState {
    fn deployment_identity(&mut self) -> types::Deployment {
        let identity = types::Deployment {
            consumer: self.session.consumer().consumer.clone(),
            source: self.session.consumer().source.clone(),
            replica_set_id: self.session.deployment().replica_set_id.clone(),
        };
        self.back_to_guest(identity)
    }

    fn load_checkpoint(&mut self) -> types::Checkpoint {
        if let Some(start) = PROCESS_START.get() {
            let unix_us = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64);
            tracing::debug!(
                target: "handoff::startup",
                first_policy_call_us = start.elapsed().as_micros() as u64,
                first_policy_call_unix_us = unix_us,
                "policy called the host"
            );
        }
        let (token, mode) = self.session.checkpoint();
        let checkpoint = types::Checkpoint {
            token,
            mode: match mode {
                Mode::ResumeAfter => types::ResumeMode::ResumeAfter,
                Mode::StartAfter => types::ResumeMode::StartAfter,
            },
        };
        self.back_to_guest(checkpoint)
    }

    fn kind_of_run(&mut self) -> types::RunKind {
        let kind = match self.session.kind() {
            session::RunKind::Changes => types::RunKind::Changes,
            session::RunKind::Backfill => types::RunKind::Backfill,
            session::RunKind::Repair => types::RunKind::Repair,
        };
        self.back_to_guest(kind)
    }

    fn open_stream(
        &mut self,
        start: types::StreamStart,
    ) -> Result<Resource<StreamHandle>, types::StreamError> {
        let start = match start {
            types::StreamStart::Now => Start::Now,
            types::StreamStart::ResumeAfter(t) => Start::ResumeAfter(t),
            types::StreamStart::StartAfter(t) => Start::StartAfter(t),
        };
        let result = self
            .session
            .open_stream(start)
            .map_err(stream_error)
            .and_then(|()| {
                self.table.push(StreamHandle).map_err(|e| {
                    types::StreamError::Rejected(format!("cannot open the stream: {e}"))
                })
            });
        self.back_to_guest(result)
    }

    fn commit(&mut self, request: types::CommitRequest) -> Result<(), types::CommitError> {
        let result = self
            .session
            .commit(
                request.expected.as_deref(),
                &request.next,
                mode_from(request.mode),
                request.outbox_id.as_deref(),
            )
            .map_err(commit_error);
        self.back_to_guest(result)
    }

    fn commit_batch(&mut self, request: types::BatchRequest) -> Result<(), types::CommitError> {
        let decisions = request
            .decisions
            .into_iter()
            .map(|d| match d {
                types::EventDecision::HandOff(id) => session::Decision::HandOff(id),
                types::EventDecision::Skip(reason) => session::Decision::Skip(reason),
                types::EventDecision::Quarantine(q) => session::Decision::Quarantine {
                    id: q.id,
                    reason: q.reason,
                },
            })
            .collect();
        self.commit_decisions(request.expected, &request.next, request.mode, decisions)
    }

    fn commit_records(&mut self, request: types::RecordsRequest) -> Result<(), types::CommitError> {
        let decisions = request
            .decisions
            .into_iter()
            .map(|d| match d {
                types::RecordDecision::HandOff(id) => session::Decision::HandOff(id),
                types::RecordDecision::HandOffRecord(r) => {
                    session::Decision::HandOffRecord(Box::new(session::Shaped {
                        id: r.id,
                        event_type: r.event_type,
                        schema_version: r.schema_version,
                        aggregate_id: r.aggregate_id,
                        aggregate_version: r.aggregate_version,
                        payload: r.payload,
                    }))
                }
                types::RecordDecision::Skip(reason) => session::Decision::Skip(reason),
                types::RecordDecision::Quarantine(q) => session::Decision::Quarantine {
                    id: q.id,
                    reason: q.reason,
                },
            })
            .collect();
        self.commit_decisions(request.expected, &request.next, request.mode, decisions)
    }

    fn advance_watermark(
        &mut self,
        expected: Option<String>,
        next: String,
    ) -> Result<(), types::CommitError> {
        let result = self
            .session
            .advance_watermark(expected.as_deref(), &next)
            .map_err(commit_error);
        self.back_to_guest(result)
    }

    fn monotonic_ms(&mut self) -> u64 {
        let now = self.session.now_ms();
        self.back_to_guest(now)
    }

    fn log(&mut self, level: types::LogLevel, message: String, fields: Vec<(String, String)>) {
        let message = escape_untrusted(&message, LOG_MESSAGE_CHARS);
        let fields: Vec<String> = fields
            .into_iter()
            .take(LOG_FIELDS)
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    escape_untrusted(&k, LOG_KEY_CHARS),
                    escape_untrusted(&v, LOG_VALUE_CHARS)
                )
            })
            .collect();
        let fields = fields.join(" ");
        match level {
            types::LogLevel::Trace => tracing::trace!(target: "policy", %fields, "{message}"),
            types::LogLevel::Debug => tracing::debug!(target: "policy", %fields, "{message}"),
            types::LogLevel::Info => tracing::info!(target: "policy", %fields, "{message}"),
            types::LogLevel::Warn => tracing::warn!(target: "policy", %fields, "{message}"),
            types::LogLevel::Error => tracing::error!(target: "policy", %fields, "{message}"),
        }
        self.back_to_guest(())
    }
}

impl wit_host::HostChangeStream for RunState {
    fn next(
        &mut self,
        _stream: Resource<StreamHandle>,
    ) -> Result<Option<types::ChangeEvent>, types::StreamError> {
        let result = self
            .session
            .next_event()
            .map(|event| {
                event.map(|e| types::ChangeEvent {
                    token: e.token,
                    operation_type: e.operation_type,
                    namespace: e.namespace,
                    cluster_time: e.cluster_time,
                })
            })
            .map_err(stream_error);
        self.back_to_guest(result)
    }

    fn watermark(&mut self, _stream: Resource<StreamHandle>) -> Option<String> {
        let mark = self.session.watermark();
        self.back_to_guest(mark)
    }

    fn field(
        &mut self,
        _stream: Resource<StreamHandle>,
        event: String,
        path: String,
    ) -> Option<String> {
        let value = self.session.field(&event, &path);
        self.back_to_guest(value)
    }

    fn drop(&mut self, stream: Resource<StreamHandle>) -> wasmtime::Result<()> {
        self.table.delete(stream)?;
        Ok(())
    }
}

/// The longest log message and field key and value kept, in characters (one more is read so
/// that a cut stays visible).
const LOG_MESSAGE_CHARS: usize = 1024;
const LOG_KEY_CHARS: usize = 64;
const LOG_VALUE_CHARS: usize = 256;
/// How many log fields are kept.
const LOG_FIELDS: usize = 16;

/// The first `chars` characters of a string in guest memory, plus one to mark a cut.
fn bounded(
    text: &wasmtime::component::WasmStr,
    store: impl wasmtime::AsContext,
    chars: usize,
) -> wasmtime::Result<String> {
    Ok(text.to_str(&store)?.chars().take(chars + 1).collect())
}

/// What one commit call may read of the policy's memory in all. Each string is checked whole (as
/// UTF-8) before it is cut, so without this bound 500 decisions whose strings alias one large
/// buffer would pin the host's CPU in a single call, out of the compute slice's reach.
const MAX_SCANNED_PER_CALL: usize = 256 << 20;

/// The strings one call has read, against [`MAX_SCANNED_PER_CALL`].
#[derive(Default)]
struct Scan {
    scanned: usize,
}

/// A call that read more than [`MAX_SCANNED_PER_CALL`]; it is refused.
struct OverScan;

impl Scan {
    fn count(&mut self, text: &str) -> Result<(), OverScan> {
        self.scanned = self.scanned.saturating_add(text.len());
        if self.scanned > MAX_SCANNED_PER_CALL {
            Err(OverScan)
        } else {
            Ok(())
        }
    }

    /// [`bounded`], counted.
    fn chars(
        &mut self,
        text: &wasmtime::component::WasmStr,
        store: impl wasmtime::AsContext,
        chars: usize,
    ) -> wasmtime::Result<Result<String, OverScan>> {
        let whole = text.to_str(&store)?;
        Ok(self
            .count(&whole)
            .map(|()| whole.chars().take(chars + 1).collect()))
    }

    /// [`bounded_bytes`], counted.
    fn bytes(
        &mut self,
        text: &wasmtime::component::WasmStr,
        store: impl wasmtime::AsContext,
        bytes: usize,
    ) -> wasmtime::Result<Result<String, OverScan>> {
        let whole = text.to_str(&store)?;
        if let Err(over) = self.count(&whole) {
            return Ok(Err(over));
        }
        let mut end = 0;
        for (at, c) in whole.char_indices() {
            end = at + c.len_utf8();
            if at >= bytes {
                break;
            }
        }
        Ok(Ok(whole[..end].to_string()))
    }
}

impl Scan {
    /// A decision's ID.
    fn id(
        &mut self,
        id: &wasmtime::component::WasmStr,
        store: impl wasmtime::AsContext,
    ) -> wasmtime::Result<Result<String, OverScan>> {
        self.chars(id, store, session::MAX_ID_LEN)
    }

    /// A skip's or a quarantine's reason.
    fn reason(
        &mut self,
        reason: &wasmtime::component::WasmStr,
        store: impl wasmtime::AsContext,
    ) -> wasmtime::Result<Result<String, OverScan>> {
        self.chars(reason, store, REASON_CHARS)
    }

    /// A quarantine decision, as both commit functions take it.
    fn quarantine(
        &mut self,
        q: &QuarantineView,
        store: impl wasmtime::AsContext,
    ) -> wasmtime::Result<Result<types::QuarantineDecision, OverScan>> {
        let id = match self.id(&q.id, &store)? {
            Ok(id) => id,
            Err(over) => return Ok(Err(over)),
        };
        Ok(self
            .reason(&q.reason, &store)?
            .map(|reason| types::QuarantineDecision { id, reason }))
    }
}

/// The answer to a commit call that read too much of the policy's memory: the run fails.
fn over_scan(
    store: &mut wasmtime::StoreContextMut<'_, RunState>,
) -> Result<(), types::CommitError> {
    let refusal = store.data_mut().session.refuse(format!(
        "a commit's strings exceed {} MiB of policy memory",
        MAX_SCANNED_PER_CALL >> 20
    ));
    store.data_mut().back_to_guest(Err(commit_error(refusal)))
}

/// `?` for a counted read: a trap propagates, an over-long read ends the call with its refusal.
macro_rules! scanned {
    ($store:ident, $read:expr) => {
        match $read? {
            Ok(text) => text,
            Err(OverScan) => return Ok((over_scan(&mut $store),)),
        }
    };
}

/// The contract's host interface as the linker defines it.
type HostInstance<'a> = wasmtime::component::LinkerInstance<'a, RunState>;

/// Replaces the generated imports that take strings a policy can make alias one buffer (`log`,
/// `commit-batch`, `commit-records`) with ones that read them lazily and bounded, below.
pub fn add_bounded_imports(
    linker: &mut wasmtime::component::Linker<RunState>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    {
        let interface = format!("handoff:policy/host@{}", super::policy::CONTRACT);
        let mut host = linker.instance(&interface)?;
        bounded_log(&mut host)?;
        bounded_commit_batch(&mut host)?;
        bounded_commit_records(&mut host)?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// Replaces the generated `log` import with one that reads its list lazily. Lifting the list
/// whole would copy every string it names, and a policy can make a million entries name the
/// same 30 MiB of its memory: terabytes of host allocations from a policy under its memory cap.
/// Only the first fields, and the first characters of each, are ever copied.
fn bounded_log(host: &mut HostInstance<'_>) -> wasmtime::Result<()> {
    use wasmtime::component::{WasmList, WasmStr};
    host.func_wrap(
        "log",
        |mut store: wasmtime::StoreContextMut<'_, RunState>,
         (level, message, fields): (types::LogLevel, WasmStr, WasmList<(WasmStr, WasmStr)>)| {
            let message = bounded(&message, &store, LOG_MESSAGE_CHARS)?;
            let mut kept = Vec::new();
            for index in 0..fields.len().min(LOG_FIELDS) {
                let Some(field) = fields.get(&mut store, index) else {
                    break;
                };
                let (key, value) = field?;
                kept.push((
                    bounded(&key, &store, LOG_KEY_CHARS)?,
                    bounded(&value, &store, LOG_VALUE_CHARS)?,
                ));
            }
            wit_host::Host::log(store.data_mut(), level, message, kept);
            Ok(())
        },
    )
}

/// `batch-request` as it lies in the policy's memory: the decisions are read one by one.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct BatchView {
    expected: Option<String>,
    next: String,
    mode: types::ResumeMode,
    decisions: wasmtime::component::WasmList<DecisionView>,
}

/// `event-decision` with its strings left in the policy's memory.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(variant)]
enum DecisionView {
    #[component(name = "hand-off")]
    HandOff(wasmtime::component::WasmStr),
    #[component(name = "skip")]
    Skip(wasmtime::component::WasmStr),
    #[component(name = "quarantine")]
    Quarantine(QuarantineView),
}

/// `quarantine-decision` with its strings left in the policy's memory.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct QuarantineView {
    id: wasmtime::component::WasmStr,
    reason: wasmtime::component::WasmStr,
}

/// The longest decision reason kept, in characters.
const REASON_CHARS: usize = 1024;

/// `records-request` as it lies in the policy's memory.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct RecordsView {
    expected: Option<String>,
    next: String,
    mode: types::ResumeMode,
    decisions: wasmtime::component::WasmList<RecordDecisionView>,
}

/// `record-decision` with its strings left in the policy's memory.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(variant)]
enum RecordDecisionView {
    #[component(name = "hand-off")]
    HandOff(wasmtime::component::WasmStr),
    #[component(name = "hand-off-record")]
    HandOffRecord(OutboxRecordView),
    #[component(name = "skip")]
    Skip(wasmtime::component::WasmStr),
    #[component(name = "quarantine")]
    Quarantine(QuarantineView),
}

/// `outbox-record` with its strings left in the policy's memory.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct OutboxRecordView {
    id: wasmtime::component::WasmStr,
    #[component(name = "event-type")]
    event_type: wasmtime::component::WasmStr,
    #[component(name = "schema-version")]
    schema_version: u32,
    #[component(name = "aggregate-id")]
    aggregate_id: wasmtime::component::WasmStr,
    #[component(name = "aggregate-version")]
    aggregate_version: Option<wasmtime::component::WasmStr>,
    payload: wasmtime::component::WasmStr,
}

/// Replaces the generated `commit-records` import, as `commit-batch`: at most one decision more
/// than a commit may cover, each string read up to one unit past its bound, and payload text
/// copied only while the commit's total stays within its bound. What is read is then validated
/// by the session (an over-long part is still refused).
fn bounded_commit_records(host: &mut HostInstance<'_>) -> wasmtime::Result<()> {
    use crate::session::{
        MAX_EVENT_TYPE_LEN, MAX_PAYLOAD_TEXT, MAX_PAYLOADS_PER_COMMIT, MAX_VALUE_TEXT,
    };
    host.func_wrap(
        "commit-records",
        |mut store: wasmtime::StoreContextMut<'_, RunState>, (request,): (RecordsView,)| {
            let mut decisions = Vec::new();
            let mut payloads = 0usize;
            let mut scan = Scan::default();
            for index in 0..request.decisions.len().min(session::MAX_BATCH + 1) {
                let Some(decision) = request.decisions.get(&mut store, index) else {
                    break;
                };
                decisions.push(match decision? {
                    RecordDecisionView::HandOff(id) => {
                        types::RecordDecision::HandOff(scanned!(store, scan.id(&id, &store)))
                    }
                    RecordDecisionView::Skip(reason) => {
                        types::RecordDecision::Skip(scanned!(store, scan.reason(&reason, &store)))
                    }
                    RecordDecisionView::Quarantine(q) => types::RecordDecision::Quarantine(
                        scanned!(store, scan.quarantine(&q, &store)),
                    ),
                    RecordDecisionView::HandOffRecord(r) => {
                        let left = (MAX_PAYLOADS_PER_COMMIT + 1).saturating_sub(payloads);
                        let payload = scanned!(
                            store,
                            scan.bytes(&r.payload, &store, MAX_PAYLOAD_TEXT.min(left))
                        );
                        payloads += payload.len();
                        let aggregate_version = match &r.aggregate_version {
                            Some(v) => Some(scanned!(store, scan.bytes(v, &store, MAX_VALUE_TEXT))),
                            None => None,
                        };
                        types::RecordDecision::HandOffRecord(types::OutboxRecord {
                            id: scanned!(store, scan.id(&r.id, &store)),
                            event_type: scanned!(
                                store,
                                scan.chars(&r.event_type, &store, MAX_EVENT_TYPE_LEN)
                            ),
                            schema_version: r.schema_version,
                            aggregate_id: scanned!(
                                store,
                                scan.bytes(&r.aggregate_id, &store, MAX_VALUE_TEXT)
                            ),
                            aggregate_version,
                            payload,
                        })
                    }
                });
                if payloads > MAX_PAYLOADS_PER_COMMIT {
                    break;
                }
            }
            let request = types::RecordsRequest {
                expected: request.expected,
                next: request.next,
                mode: request.mode,
                decisions,
            };
            Ok((wit_host::Host::commit_records(store.data_mut(), request),))
        },
    )
}

/// Replaces the generated `commit-batch` import with one that reads at most one decision more
/// than a commit may cover, and at most one character more than an ID or reason may hold, so
/// that decisions whose strings alias one large buffer cannot amplify host allocations. What is
/// read is then validated exactly as before (an over-long ID or list is still refused).
fn bounded_commit_batch(host: &mut HostInstance<'_>) -> wasmtime::Result<()> {
    host.func_wrap(
        "commit-batch",
        |mut store: wasmtime::StoreContextMut<'_, RunState>, (request,): (BatchView,)| {
            let mut decisions = Vec::new();
            let mut scan = Scan::default();
            for index in 0..request.decisions.len().min(session::MAX_BATCH + 1) {
                let Some(decision) = request.decisions.get(&mut store, index) else {
                    break;
                };
                decisions.push(match decision? {
                    DecisionView::HandOff(id) => {
                        types::EventDecision::HandOff(scanned!(store, scan.id(&id, &store)))
                    }
                    DecisionView::Skip(reason) => {
                        types::EventDecision::Skip(scanned!(store, scan.reason(&reason, &store)))
                    }
                    DecisionView::Quarantine(q) => types::EventDecision::Quarantine(scanned!(
                        store,
                        scan.quarantine(&q, &store)
                    )),
                });
            }
            let request = types::BatchRequest {
                expected: request.expected,
                next: request.next,
                mode: request.mode,
                decisions,
            };
            Ok((wit_host::Host::commit_batch(store.data_mut(), request),))
        },
    )
}
