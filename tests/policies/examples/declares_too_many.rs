//! Test policy: declares more parameters than the contract allows (200): the host must refuse
//! it before asking for any.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[macro_use]
#[path = "shared/declaring.rs"]
mod declaring;

declaring_policy! {
    count: { 200 },
    at(index): {
        Parameter {
            name: format!("p{index}"),
            summary: "x".repeat(10_000),
        }
    }
}
