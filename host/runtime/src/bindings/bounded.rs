//! The imports a policy can make read its memory without bound (`log`, `commit-batch`,
//! `commit-records`), replaced by ones that read lazily, each string cut at its bound and every
//! call's reading counted: a policy under its memory cap cannot pin the host's CPU or memory
//! from inside one host call.

use super::{
    LOG_FIELDS, LOG_KEY_CHARS, LOG_MESSAGE_CHARS, LOG_VALUE_CHARS, RunState, commit_error, types,
    wit_host,
};
use handoff_session as session;

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
        let interface = format!("handoff:policy/host@{}", crate::policy::CONTRACT);
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
    use handoff_session::{
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
