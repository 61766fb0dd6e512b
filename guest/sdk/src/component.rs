//! The thin shell binding policies to the WIT contract (wasm32 only).
//!
//! `bindings` is generated once here from the crate's copy of the contract (`wit/policy.wit`),
//! with a public `export!` macro; [`WitHost`] adapts the imports to the native
//! [`Host`](crate::Host) trait, and [`export_policy!`](crate::export_policy) exports a
//! [`Policy`](crate::Policy) over them.

/// The contract's generated bindings.
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "delivering-policy",
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

fn stream_error(error: types::StreamError) -> crate::StreamError {
    match error {
        types::StreamError::HistoryLost(m) => crate::StreamError::HistoryLost(m),
        types::StreamError::InvalidToken(m) => crate::StreamError::InvalidToken(m),
        types::StreamError::Fatal(m) => crate::StreamError::Fatal(m),
        types::StreamError::Unavailable(m) => crate::StreamError::Unavailable(m),
        types::StreamError::Rejected(m) => crate::StreamError::Rejected(m),
    }
}

fn commit_error(error: types::CommitError) -> crate::CommitError {
    match error {
        types::CommitError::Conflict(m) => crate::CommitError::Conflict(m),
        types::CommitError::Rejected(m) => crate::CommitError::Rejected(m),
        types::CommitError::Unavailable(m) => crate::CommitError::Unavailable(m),
    }
}

fn mode_from_wit(mode: types::ResumeMode) -> crate::Mode {
    match mode {
        types::ResumeMode::ResumeAfter => crate::Mode::ResumeAfter,
        types::ResumeMode::StartAfter => crate::Mode::StartAfter,
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

/// The component's `run`: one run of the policy `P` over the imports (what
/// [`export_policy!`](crate::export_policy) exports).
pub fn run<P: crate::Policy>(settings: types::Settings) -> Result<types::Report, String> {
    let report = crate::run::<P>(&mut WitHost::default(), &self::settings(settings))?;
    Ok(self::report(report))
}

/// The delivery interface's values in native form, and back.
pub mod delivery {
    use super::bindings::exports::handoff::policy::delivery as wit;

    fn sink(sink: wit::SinkKind) -> crate::SinkKind {
        match sink {
            wit::SinkKind::Projection => crate::SinkKind::Projection,
            wit::SinkKind::Webhook => crate::SinkKind::Webhook,
            wit::SinkKind::Cache => crate::SinkKind::Cache,
            wit::SinkKind::Broker => crate::SinkKind::Broker,
        }
    }

    /// The component's `effect-of` for the policy `P`.
    pub fn effect_of<P: crate::Policy>(record: wit::DeliveryRecord) -> wit::Effect {
        let record = crate::DeliveryRecord {
            delivery: record.delivery,
            sink: sink(record.sink),
            json: record.json,
        };
        match P::effect(&record) {
            crate::Effect::Default => wit::Effect::DefaultEffect,
            crate::Effect::Refuse(reason) => wit::Effect::Refuse(reason),
            crate::Effect::Request(request) => wit::Effect::Request(wit::SinkRequest {
                operation: match request.operation {
                    crate::Operation::Upsert => wit::Operation::Upsert,
                    crate::Operation::Delete => wit::Operation::Delete,
                    crate::Operation::Publish => wit::Operation::Publish,
                    crate::Operation::Post => wit::Operation::Post,
                    crate::Operation::Ignore => wit::Operation::Ignore,
                },
                key: request.key,
                version: request.version,
                body: request.body,
                headers: request.headers,
            }),
        }
    }

    /// The component's `classify` for the policy `P`.
    pub fn classify<P: crate::Policy>(failure: wit::Failure) -> Option<wit::Verdict> {
        let failure = crate::Failure {
            record_id: failure.record_id,
            sink: sink(failure.sink),
            attempt: failure.attempt,
            transient: failure.transient,
            http_status: failure.http_status,
            message: failure.message,
        };
        P::classify(&failure).map(|v| match v {
            crate::Verdict::Retry => wit::Verdict::Retry,
            crate::Verdict::Dead => wit::Verdict::Dead,
            crate::Verdict::Ignore => wit::Verdict::Ignore,
        })
    }
}

/// A batched commit (`commit-records`, contract 1.2: its decisions cover `commit-batch`'s and
/// shaped records).
fn commit_records(
    expected: Option<&str>,
    next: &str,
    mode: crate::Mode,
    decisions: Vec<crate::Decision>,
) -> Result<(), crate::CommitError> {
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
    fn deployment(&mut self) -> crate::Deployment {
        let identity = host::deployment_identity();
        crate::Deployment {
            consumer: identity.consumer,
            source: identity.source,
            replica_set_id: identity.replica_set_id,
        }
    }

    fn load_checkpoint(&mut self) -> crate::Checkpoint {
        let saved = host::load_checkpoint();
        crate::Checkpoint {
            token: saved.token,
            mode: mode_from_wit(saved.mode),
        }
    }

    fn run_kind(&mut self) -> crate::RunKind {
        match host::kind_of_run() {
            types::RunKind::Changes => crate::RunKind::Changes,
            types::RunKind::Backfill => crate::RunKind::Backfill,
            types::RunKind::Repair => crate::RunKind::Repair,
        }
    }

    fn open(&mut self, start: crate::Start) -> Result<(), crate::StreamError> {
        let start = match start {
            crate::Start::Now => types::StreamStart::Now,
            crate::Start::ResumeAfter(t) => types::StreamStart::ResumeAfter(t),
            crate::Start::StartAfter(t) => types::StreamStart::StartAfter(t),
        };
        self.stream = Some(host::open_stream(&start).map_err(stream_error)?);
        Ok(())
    }

    fn next(&mut self) -> Result<Option<crate::Event>, crate::StreamError> {
        let stream = self
            .stream
            .as_ref()
            .ok_or_else(|| crate::StreamError::Rejected("the stream is not open".into()))?;
        Ok(stream
            .next()
            .map_err(stream_error)?
            .map(|event| crate::Event {
                token: event.token,
                operation_type: event.operation_type,
                namespace: event.namespace,
                cluster_time: event.cluster_time,
            }))
    }

    fn watermark(&mut self) -> Option<String> {
        self.stream.as_ref().and_then(|s| s.watermark())
    }

    fn field(&mut self, token: &str, path: &str) -> Option<String> {
        self.stream.as_ref().and_then(|s| s.field(token, path))
    }

    fn follows(&mut self) -> bool {
        host::follows()
    }

    fn source_transaction(&mut self, token: &str) -> Option<crate::SourceTransaction> {
        host::source_transaction_of(token).map(|t| crate::SourceTransaction {
            id: t.id,
            index: t.index,
            size: t.size,
        })
    }

    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: crate::Mode,
        outbox_id: Option<&str>,
    ) -> Result<(), crate::CommitError> {
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
    ) -> Result<(), crate::CommitError> {
        commit_records(expected, next, mode, decisions)
    }

    fn advance_watermark(
        &mut self,
        expected: Option<&str>,
        next: &str,
    ) -> Result<(), crate::CommitError> {
        host::advance_watermark(expected, next).map_err(commit_error)
    }

    fn now_ms(&mut self) -> u64 {
        host::monotonic_ms()
    }

    fn log(&mut self, level: crate::Level, message: &str, fields: &[(&str, &str)]) {
        let level = match level {
            crate::Level::Trace => types::LogLevel::Trace,
            crate::Level::Debug => types::LogLevel::Debug,
            crate::Level::Info => types::LogLevel::Info,
            crate::Level::Warn => types::LogLevel::Warn,
            crate::Level::Error => types::LogLevel::Error,
        };
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        host::log(level, message, &fields);
    }
}

/// Exports a policy type (any [`Policy`](crate::Policy)) as the component's
/// `handoff:policy/policy.run`, with its [`PARAMETERS`](crate::Policy::PARAMETERS) as
/// `handoff:policy/declared`, and its [`effect`](crate::Policy::effect) and
/// [`classify`](crate::Policy::classify) as `handoff:policy/delivery`:
/// `handoff_policy_sdk::export_policy!(MyPolicy);`, on wasm32 only
/// (put it under `#[cfg(target_arch = "wasm32")]` in a crate that also builds natively).
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        const _: () = {
            use $crate::component::bindings::handoff::policy::types as wit;

            struct Component;

            impl $crate::component::Guest for Component {
                fn run(settings: wit::Settings) -> Result<wit::Report, String> {
                    $crate::component::run::<$policy>(settings)
                }
            }

            impl $crate::component::bindings::exports::handoff::policy::declared::Guest
                for Component
            {
                fn parameter_count() -> u32 {
                    <$policy as $crate::Policy>::PARAMETERS.len() as u32
                }

                fn parameter_at(
                    index: u32,
                ) -> $crate::component::bindings::exports::handoff::policy::declared::Parameter {
                    let (name, summary) = <$policy as $crate::Policy>::PARAMETERS
                        .get(index as usize)
                        .copied()
                        .unwrap_or(("", ""));
                    $crate::component::bindings::exports::handoff::policy::declared::Parameter {
                        name: name.to_string(),
                        summary: summary.to_string(),
                    }
                }
            }

            impl $crate::component::bindings::exports::handoff::policy::delivery::Guest
                for Component
            {
                fn effect_of(
                    outbox: $crate::component::bindings::exports::handoff::policy::delivery::DeliveryRecord,
                ) -> $crate::component::bindings::exports::handoff::policy::delivery::Effect {
                    $crate::component::delivery::effect_of::<$policy>(outbox)
                }

                fn classify(
                    failure: $crate::component::bindings::exports::handoff::policy::delivery::Failure,
                ) -> Option<$crate::component::bindings::exports::handoff::policy::delivery::Verdict> {
                    $crate::component::delivery::classify::<$policy>(failure)
                }
            }

            $crate::component::bindings::export!(Component with_types_in $crate::component::bindings);
        };
    };
}
