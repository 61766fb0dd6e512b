//! Test policy: one log call whose field list names the same 8 MiB of its memory 100,000 times
//! (the strings alias one buffer, so the policy stays far under its memory cap). Copying every
//! field would cost the host 1.6 TB. It then fails with "logged", so the run's end shows the host
//! came through.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use std::mem::ManuallyDrop;

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let mut big = ManuallyDrop::new("x".repeat(8 << 20));
            let (ptr, len, cap) = (big.as_mut_ptr(), big.len(), big.capacity());
            // SAFETY: every alias is read only, never dropped (the vector is leaked), and the
            // buffer outlives the call.
            let alias = || unsafe { String::from_raw_parts(ptr, len, cap) };
            let fields: ManuallyDrop<Vec<(String, String)>> =
                ManuallyDrop::new((0..100_000).map(|_| (alias(), alias())).collect());
            host::log(types::LogLevel::Info, "amplified", &fields);
            Err("logged".into())
        }
    }

    export!(Policy);
}
