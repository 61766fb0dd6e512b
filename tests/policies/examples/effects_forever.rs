//! Test policy: asked for a delivery's effect (contract 1.6), computes forever: the host must
//! stop it within its slice and deliver nothing.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[macro_use]
#[path = "shared/delivering.rs"]
mod delivering;

delivering_policy! {
    effect(_outbox): {
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    },
    classify(_failure): { None }
}
