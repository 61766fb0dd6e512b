//! The thin shell binding the policy to the WIT contract.

wit_bindgen::generate!({
    path: "../wit",
    world: "handoff-policy",
});

use handoff::policy::host;
use handoff::policy::types;

struct DefaultPolicy;

/// The host as the decision logic sees it.
struct WitHost {
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

    fn advance_watermark(&mut self, expected: Option<&str>, next: &str) -> Result<(), String> {
        host::advance_watermark(expected, next).map_err(commit_error)
    }

    fn now_ms(&mut self) -> u64 {
        host::monotonic_ms()
    }
}

impl exports::handoff::policy::policy::Guest for DefaultPolicy {
    fn run(settings: types::Settings) -> Result<types::Report, String> {
        let saved = host::load_checkpoint();
        let checkpoint = crate::Checkpoint {
            token: saved.token,
            mode: match saved.mode {
                types::ResumeMode::ResumeAfter => crate::Mode::ResumeAfter,
                types::ResumeMode::StartAfter => crate::Mode::StartAfter,
            },
        };
        let settings = crate::Settings {
            max_events: settings.max_events,
            max_wait_ms: settings.max_wait_ms,
        };
        let mut wit_host = WitHost { stream: None };
        let report = crate::run(&mut wit_host, checkpoint, &settings)?;
        Ok(types::Report {
            status: match report.status {
                crate::Status::Idle => types::RunStatus::Idle,
                crate::Status::HandedOff => types::RunStatus::HandedOff,
                crate::Status::Invalidated => types::RunStatus::Invalidated,
            },
            events_handed_off: report.events_handed_off,
            last_event_id: report.last_event_id,
        })
    }
}

export!(DefaultPolicy);
