//! Test policy: subscribes to a deadline days away and waits on it with `wasi:io/poll` `poll`
//! over a list (two pollables), a wait in host code that epoch interruption cannot end.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    // The WASI 0.2 imports the standard library links against, called directly.
    #[link(wasm_import_module = "wasi:clocks/monotonic-clock@0.2.12")]
    unsafe extern "C" {
        #[link_name = "subscribe-duration"]
        fn subscribe_duration(nanoseconds: i64) -> i32;
    }

    #[link(wasm_import_module = "wasi:io/poll@0.2.12")]
    unsafe extern "C" {
        /// `poll(in: list<borrow<pollable>>) -> list<u32>`: (pointer, length, return area).
        #[link_name = "poll"]
        fn poll(pollables: *const i32, len: usize, ret: *mut [usize; 2]);
    }

    struct Policy;

    impl Guest for Policy {
        fn run(_: types::Settings) -> Result<types::Report, String> {
            let _ = host::load_checkpoint();
            let days = 3 * 24 * 3600 * 1_000_000_000i64;
            // SAFETY: the imports take plain integers and an array the host reads and writes.
            let pollables = unsafe { [subscribe_duration(days), subscribe_duration(2 * days)] };
            loop {
                let mut ret = [0usize; 2];
                unsafe { poll(pollables.as_ptr(), pollables.len(), &mut ret) };
                core::hint::black_box(ret);
            }
        }
    }

    export!(Policy);
}
