//! Test policy: recurses without bound.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    fn depth(n: u64, pad: [u64; 16]) -> u64 {
        let pad = core::hint::black_box(pad);
        if n == 0 {
            pad[0]
        } else {
            depth(n - 1, pad) + pad[(n % 16) as usize]
        }
    }

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let _ = host::load_checkpoint();
            let n = depth(core::hint::black_box(u64::MAX), [1; 16]);
            Err(format!("unreachable {n}"))
        }
    }

    export!(Policy);
}
