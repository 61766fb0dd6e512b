//! Test policy: reads 1,001 events without ever committing one.
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
            let mut read = 0u32;
            for _ in 0..1001 {
                if stream.next().map_err(|e| format!("{e:?}"))?.is_some() {
                    read += 1;
                }
            }
            Err(format!("read {read} events and committed none"))
        }
    }

    export!(Policy);
}
