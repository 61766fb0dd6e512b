//! The thin shell binding policies to the WIT contract (wasm32 only).
//!
//! `bindings` is generated once here, with a public `export!` macro, so that other policies reuse
//! it; [`WitHost`] adapts the imports to the native [`Host`](crate::Host) trait.

/// The contract's generated bindings.
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "handoff-policy",
        pub_export_macro: true,
        default_bindings_module: "handoff_policy_sdk::component::bindings",
    });
}

pub use bindings::exports::handoff::policy::policy::Guest;
use bindings::handoff::policy::host;
use bindings::handoff::policy::types;

/// The host as the decision logic sees it.
#[derive(Default)]
pub struct WitHost {
    stream: Option<host::ChangeStream>,
}

fn mode_to_wit(mode: crate::Mode) -> types::ResumeMode {
    match mode {
        crate::Mode::ResumeAfter => types::ResumeMode::ResumeAfter,
        crate::Mode::StartAfter => types::ResumeMode::StartAfter,
    }
}

fn stream_error(error: types::StreamError) -> String {
    match error {
        types::StreamError::HistoryLost(m)
        | types::StreamError::InvalidToken(m)
        | types::StreamError::Fatal(m)
        | types::StreamError::Unavailable(m)
        | types::StreamError::Rejected(m) => m,
    }
}

fn commit_error(error: types::CommitError) -> String {
    match error {
        types::CommitError::Conflict(m)
        | types::CommitError::Rejected(m)
        | types::CommitError::Unavailable(m) => m,
    }
}

/// The checkpoint as the host loaded it.
pub fn load_checkpoint() -> crate::Checkpoint {
    let saved = host::load_checkpoint();
    crate::Checkpoint {
        token: saved.token,
        mode: match saved.mode {
            types::ResumeMode::ResumeAfter => crate::Mode::ResumeAfter,
            types::ResumeMode::StartAfter => crate::Mode::StartAfter,
        },
    }
}

/// The run's settings in native form.
pub fn settings(settings: types::Settings) -> crate::Settings {
    crate::Settings {
        max_events: settings.max_events,
        max_wait_ms: settings.max_wait_ms,
        params: settings.params,
    }
}

/// A native report in the contract's form.
pub fn report(report: crate::Report) -> types::Report {
    types::Report {
        status: match report.status {
            crate::Status::Idle => types::RunStatus::Idle,
            crate::Status::HandedOff => types::RunStatus::HandedOff,
            crate::Status::Invalidated => types::RunStatus::Invalidated,
        },
        events_handed_off: report.events_handed_off,
        last_event_id: report.last_event_id,
    }
}

/// Writes a log line through the host.
pub fn log(message: &str) {
    host::log(types::LogLevel::Info, message, &[]);
}

/// A batched commit (`commit-records`, contract 1.2: its decisions cover `commit-batch`'s and
/// shaped records).
fn commit_records(
    expected: Option<&str>,
    next: &str,
    mode: crate::Mode,
    decisions: Vec<crate::Decision>,
) -> Result<(), String> {
    let decisions = decisions
        .into_iter()
        .map(|d| match d {
            crate::Decision::HandOff(id) => types::RecordDecision::HandOff(id),
            crate::Decision::Skip(reason) => types::RecordDecision::Skip(reason),
            crate::Decision::Quarantine { id, reason } => {
                types::RecordDecision::Quarantine(types::QuarantineDecision { id, reason })
            }
            crate::Decision::Record(record) => {
                let crate::Record {
                    id,
                    event_type,
                    schema_version,
                    aggregate_id,
                    aggregate_version,
                    payload,
                } = *record;
                types::RecordDecision::HandOffRecord(types::OutboxRecord {
                    id,
                    event_type,
                    schema_version,
                    aggregate_id,
                    aggregate_version,
                    payload,
                })
            }
        })
        .collect();
    host::commit_records(&types::RecordsRequest {
        expected: expected.map(str::to_string),
        next: next.to_string(),
        mode: mode_to_wit(mode),
        decisions,
    })
    .map_err(commit_error)
}

impl crate::Host for WitHost {
    fn open(&mut self, start: crate::Start) -> Result<(), String> {
        let start = match start {
            crate::Start::Now => types::StreamStart::Now,
            crate::Start::ResumeAfter(t) => types::StreamStart::ResumeAfter(t),
            crate::Start::StartAfter(t) => types::StreamStart::StartAfter(t),
        };
        self.stream = Some(host::open_stream(&start).map_err(stream_error)?);
        Ok(())
    }

    fn next(&mut self) -> Result<Option<crate::Event>, String> {
        let stream = self.stream.as_ref().ok_or("stream not open")?;
        Ok(stream
            .next()
            .map_err(stream_error)?
            .map(|event| crate::Event {
                token: event.token,
                operation_type: event.operation_type,
            }))
    }

    fn watermark(&mut self) -> Option<String> {
        self.stream.as_ref().and_then(|s| s.watermark())
    }

    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: crate::Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), String> {
        host::commit(&types::CommitRequest {
            expected: expected.map(str::to_string),
            next: next.to_string(),
            mode: mode_to_wit(mode),
            outbox_id: outbox_id.map(str::to_string),
        })
        .map_err(commit_error)
    }

    fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: crate::Mode,
        decisions: Vec<crate::Decision>,
    ) -> Result<(), String> {
        commit_records(expected, next, mode, decisions)
    }

    fn field(&mut self, token: &str, path: &str) -> Option<String> {
        self.stream.as_ref().and_then(|s| s.field(token, path))
    }

    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), String> {
        host::advance_watermark(expected, next).map_err(commit_error)
    }

    fn now_ms(&mut self) -> u64 {
        host::monotonic_ms()
    }
}

/// Exports a policy's `run` (any `fn(&mut impl Host, Checkpoint, &Settings) -> Result<Report,
/// String>`) as the component's `handoff:policy/policy.run`.
#[macro_export]
macro_rules! export_policy {
    ($run:path) => {
        const _: () = {
            use $crate::component::bindings::handoff::policy::types as wit;

            struct Policy;

            impl $crate::component::Guest for Policy {
                fn run(settings: wit::Settings) -> Result<wit::Report, String> {
                    let report = $run(
                        &mut $crate::component::WitHost::default(),
                        $crate::component::load_checkpoint(),
                        &$crate::component::settings(settings),
                    )?;
                    Ok($crate::component::report(report))
                }
            }

    $crate::component::bindings::export!(Policy with_types_in $crate::component::bindings);
        };
    };
}
