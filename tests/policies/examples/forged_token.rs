//! Test policy: commits a token the stream never delivered.
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
            let _ = stream.next();
            host::commit(&types::CommitRequest {
                expected: checkpoint.token,
                next: r#"{"_data": "82FFFFFFFF00000001"}"#.to_string(),
                mode: types::ResumeMode::ResumeAfter,
                outbox_id: Some("forged".into()),
            })
            .map_err(|e| format!("{e:?}"))?;
            Ok(types::Report {
                status: types::RunStatus::HandedOff,
                events_handed_off: 1,
                last_event_id: "forged".into(),
            })
        }
    }

    export!(Policy);
}
