//! Test policy: hands every event off under its baseline ID, as the default does, and shapes a
//! projection's documents (contract 1.6): an upsert holds only the document's `qty` and
//! `shaped: true`; everything else is the default's effect.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    use handoff_policy_sdk::{
        Decision, Delivered, DeliveryRecord, Effect, Operation, Policy, SinkKind, SinkRequest,
    };

    #[derive(Default)]
    struct Shaped;

    impl Policy for Shaped {
        fn decide(&mut self, _event: &mut Delivered<'_>, id: String) -> Decision {
            Decision::HandOff(id)
        }

        fn effect(record: &DeliveryRecord) -> Effect {
            if record.sink != SinkKind::Projection {
                return Effect::Default;
            }
            let Ok(outbox) = serde_json::from_str::<serde_json::Value>(&record.json) else {
                return Effect::Refuse("the outbox record is not JSON".into());
            };
            let Some(document) = outbox
                .pointer("/event/fullDocument")
                .filter(|d| d.is_object())
            else {
                return Effect::Default;
            };
            let qty = document
                .get("qty")
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            let mut request = SinkRequest::new(Operation::Upsert);
            request.body = Some(serde_json::json!({ "qty": qty, "shaped": true }).to_string());
            Effect::Request(request)
        }
    }

    handoff_policy_sdk::export_policy!(Shaped);
}
