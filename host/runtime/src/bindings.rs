//! The WIT contract bound to the host: generated types plus the import implementations, each a
//! thin translation onto [`Session`](handoff_session::Session).

use std::time::Instant;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::PROCESS_START;
use super::limits::Limiter;
use handoff_domain::text::escape_untrusted;
use handoff_domain::{Mode, Start};
use handoff_session::{self as session, Refusal, RefusalKind, Session};

mod bounded;
pub use bounded::add_bounded_imports;

/// The generated bindings, kept in their own module: the WIT package's `handoff` namespace would
/// otherwise shadow this crate's name.
mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit",
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
            replica_set_id: self.session.deployment().id.clone(),
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

    fn source_transaction_of(&mut self, event: String) -> Option<types::SourceTransaction> {
        let place = self
            .session
            .source_transaction_of(&event)
            .map(|t| types::SourceTransaction {
                id: t.id,
                index: t.index,
                size: t.size,
            });
        self.back_to_guest(place)
    }

    fn follows(&mut self) -> bool {
        let follow = self.session.follows();
        self.back_to_guest(follow)
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

// The longest parts of a log call kept, in characters (one more is read so that a cut stays
// visible).
/// The longest log message kept.
const LOG_MESSAGE_CHARS: usize = 1024;
/// The longest log field key kept.
const LOG_KEY_CHARS: usize = 64;
/// The longest log field value kept.
const LOG_VALUE_CHARS: usize = 256;
/// How many log fields are kept.
const LOG_FIELDS: usize = 16;
