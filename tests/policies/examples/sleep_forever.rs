//! Test policy: sleeps for hours (`std::thread::sleep`: `wasi:clocks` `subscribe-duration`, then
//! `wasi:io/poll` `block`), a wait in host code that epoch interruption cannot end.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let _ = host::load_checkpoint();
            loop {
                std::thread::sleep(std::time::Duration::from_secs(6 * 3600));
            }
        }
    }

    export!(Policy);
}
