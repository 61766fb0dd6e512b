//! Test policy: decides a delivery's effects (contract 1.6) with nonsense — a body that is not
//! JSON, a header that would smuggle a second one in — which the host must refuse before any
//! effect.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[macro_use]
#[path = "shared/delivering.rs"]
mod delivering;

delivering_policy! {
    effect(outbox): {
        let _ = outbox;
        Effect::Request(SinkRequest {
            operation: Operation::Post,
            key: None,
            version: None,
            body: Some("{not json".into()),
            headers: vec![("x-smuggled".into(), "a\r\nwebhook-id: forged".into())],
        })
    },
    classify(_failure): { None }
}
