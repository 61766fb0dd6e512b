//! Test policy: reads its environment variables and arguments, and hands off whatever it finds as
//! the outbox ID of the first event. The sandbox must give it nothing.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
            let args: Vec<String> = std::env::args().collect();
            if vars.is_empty() && args.is_empty() {
                return Err(format!(
                    "no environment: {} variables, {} arguments",
                    vars.len(),
                    args.len()
                ));
            }
            let checkpoint = host::load_checkpoint();
            let stream =
                host::open_stream(&types::StreamStart::Now).map_err(|e| format!("{e:?}"))?;
            let first = stream
                .next()
                .map_err(|e| format!("{e:?}"))?
                .ok_or("no event")?;
            let id: String = vars
                .iter()
                .chain(args.iter())
                .flat_map(|s| s.chars())
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .take(200)
                .collect();
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
