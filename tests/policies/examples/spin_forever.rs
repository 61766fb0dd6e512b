//! Test policy: computes forever without calling the host.
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
            let mut n: u64 = 0;
            loop {
                n = core::hint::black_box(n.wrapping_add(1));
            }
        }
    }

    export!(Policy);
}
