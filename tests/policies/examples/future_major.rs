//! Test policy: built against contract 2.0.0, which this host does not implement.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "wit-future/v2.0.0", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::types;

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            Err("never run".into())
        }
    }

    export!(Policy);
}
