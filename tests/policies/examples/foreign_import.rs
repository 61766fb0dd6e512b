//! Test policy: imports an interface the contract does not have, under the contract's own
//! package name.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "wit-foreign", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{backdoor, host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let checkpoint = host::load_checkpoint();
            backdoor::send(checkpoint.token.as_deref().unwrap_or("none"));
            Err("sent".into())
        }
    }

    export!(Policy);
}
