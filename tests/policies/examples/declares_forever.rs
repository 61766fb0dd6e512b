//! Test policy: declares its parameters (contract 1.4) but never answers when asked: the host
//! must refuse it within its bound, before any run.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "declared-policy" });

    use exports::handoff::policy::declared::{self, Parameter};
    use exports::handoff::policy::policy::Guest;
    use handoff::policy::types;

    struct Policy;

    impl Guest for Policy {
        fn run(_settings: types::Settings) -> Result<types::Report, String> {
            Err("never run".into())
        }
    }

    impl declared::Guest for Policy {
        fn parameter_at(_index: u32) -> Parameter {
            unreachable!("never asked")
        }

        fn parameter_count() -> u32 {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
    }

    export!(Policy);
}
