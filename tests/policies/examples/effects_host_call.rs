//! Test policy: decides a delivery's effect (contract 1.6) after asking the contract's host for
//! the checkpoint, which no run provides then: the call must fail and nothing be delivered.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[macro_use]
#[path = "shared/delivering.rs"]
mod delivering;

delivering_policy! {
    effect(outbox): {
        let _ = outbox;
        let checkpoint = handoff::policy::host::load_checkpoint();
        Effect::Refuse(format!("read a checkpoint: {}", checkpoint.token.unwrap_or_default()))
    },
    classify(_failure): { None }
}
