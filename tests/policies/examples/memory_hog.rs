//! Test policy: allocates until the memory cap stops it.
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
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(core::hint::black_box(vec![1u8; 1 << 20]));
            }
        }
    }

    export!(Policy);
}
