//! Test policy: declares its parameters (contract 1.4) but never answers when asked: the host
//! must refuse it within its bound, before any run.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[macro_use]
#[path = "shared/declaring.rs"]
mod declaring;

declaring_policy! {
    count: {
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    },
    at(_index): { unreachable!("never asked") }
}
