//! Test policy: commits the first delivered event under an outbox ID longer than the contract
//! allows (`--policy-param len=N`, 201 by default).
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            let len: usize = settings
                .params
                .iter()
                .find(|(k, _)| k == "len")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(201);
            let checkpoint = host::load_checkpoint();
            let start = match (&checkpoint.token, checkpoint.mode) {
                (None, _) => types::StreamStart::Now,
                (Some(t), types::ResumeMode::ResumeAfter) => {
                    types::StreamStart::ResumeAfter(t.clone())
                }
                (Some(t), types::ResumeMode::StartAfter) => {
                    types::StreamStart::StartAfter(t.clone())
                }
            };
            let stream = host::open_stream(&start).map_err(|e| format!("{e:?}"))?;
            let first = stream
                .next()
                .map_err(|e| format!("{e:?}"))?
                .ok_or("no event")?;
            let id = "x".repeat(len);
            host::commit(&types::CommitRequest {
                expected: checkpoint.token,
                next: first.token,
                mode: types::ResumeMode::ResumeAfter,
                outbox_id: Some(id.clone()),
            })
            .map_err(|e| format!("{e:?}"))?;
            Ok(types::Report {
                status: types::RunStatus::HandedOff,
                events_handed_off: 1,
                last_event_id: id,
            })
        }
    }

    export!(Policy);
}
