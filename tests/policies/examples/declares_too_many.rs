//! Test policy: declares more parameters than the contract allows (200): the host must refuse
//! it before asking for any.
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
        fn parameter_count() -> u32 {
            200
        }

        fn parameter_at(index: u32) -> Parameter {
            Parameter {
                name: format!("p{index}"),
                summary: "x".repeat(10_000),
            }
        }
    }

    export!(Policy);
}
