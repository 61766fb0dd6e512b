//! Test policy: declares its parameters (contract 1.4) but sleeps when asked (a WASI wait, where
//! no epoch deadline reaches): the host must refuse it at once, before any run.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[macro_use]
#[path = "shared/declaring.rs"]
mod declaring;

declaring_policy! {
    count: {
        std::thread::sleep(std::time::Duration::from_secs(3600));
        0
    },
    at(_index): { unreachable!("never asked") }
}
