//! Test policy: commits one event correctly, then reports two.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let checkpoint = host::load_checkpoint();
            let stream =
                host::open_stream(&types::StreamStart::Now).map_err(|e| format!("{e:?}"))?;
            let first = stream
                .next()
                .map_err(|e| format!("{e:?}"))?
                .ok_or("no event")?;
            host::commit(&types::CommitRequest {
                expected: checkpoint.token,
                next: first.token,
                mode: types::ResumeMode::ResumeAfter,
                outbox_id: Some("first".into()),
            })
            .map_err(|e| format!("{e:?}"))?;
            Ok(types::Report {
                status: types::RunStatus::HandedOff,
                events_handed_off: 2,
                last_event_id: "first".into(),
            })
        }
    }

    export!(Policy);
}
