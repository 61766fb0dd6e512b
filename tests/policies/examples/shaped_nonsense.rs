//! Test policy: hands every event off under its baseline ID, as the default does, and answers a
//! projection's effects (contract 1.6) with nonsense — a body that is not JSON — which the host
//! must refuse before it writes anything, in a delivery or a `deliver reconcile --repair` alike.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    use handoff_policy_sdk::{
        Decision, Delivered, DeliveryRecord, Effect, Operation, Policy, SinkKind, SinkRequest,
    };

    #[derive(Default)]
    struct Nonsense;

    impl Policy for Nonsense {
        fn decide(&mut self, _event: &mut Delivered<'_>, id: String) -> Decision {
            Decision::HandOff(id)
        }

        fn effect(record: &DeliveryRecord) -> Effect {
            if record.sink != SinkKind::Projection {
                return Effect::Default;
            }
            let mut request = SinkRequest::new(Operation::Upsert);
            request.body = Some("{not json".into());
            Effect::Request(request)
        }
    }

    handoff_policy_sdk::export_policy!(Nonsense);
}
