//! Test policy: hands every event off under its baseline ID, as the default does, and never
//! answers when asked for a projection's effect (contract 1.6): the host's time slice must end
//! the call, in a delivery or a `deliver reconcile --repair` alike, before anything is written.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    use handoff_policy_sdk::{Decision, Delivered, DeliveryRecord, Effect, Policy, SinkKind};

    #[derive(Default)]
    struct Forever;

    impl Policy for Forever {
        fn decide(&mut self, _event: &mut Delivered<'_>, id: String) -> Decision {
            Decision::HandOff(id)
        }

        fn effect(record: &DeliveryRecord) -> Effect {
            if record.sink != SinkKind::Projection {
                return Effect::Default;
            }
            let mut spins: u64 = 0;
            loop {
                spins = std::hint::black_box(spins.wrapping_add(1));
            }
        }
    }

    handoff_policy_sdk::export_policy!(Forever);
}
