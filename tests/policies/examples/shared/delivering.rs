//! The head the test policies that decide a delivery's effects (contract 1.6) share: a policy
//! never run, declaring no parameters, whose `delivery` export answers as the policy including
//! this says.

/// A contract-1.6 policy whose `effect-of($outbox)` is `$effect` and whose
/// `classify($failure)` is `$classify`.
macro_rules! delivering_policy {
    (effect($outbox:ident): $effect:block, classify($failure:ident): $classify:block) => {
        #[cfg(target_arch = "wasm32")]
        mod policy {
            wit_bindgen::generate!({ path: "../../wit", world: "delivering-policy" });

            use exports::handoff::policy::declared::{self, Parameter};
            #[allow(unused_imports)]
            use exports::handoff::policy::delivery::{
                self, DeliveryRecord, Effect, Failure, Operation, SinkRequest, Verdict,
            };
            use exports::handoff::policy::policy::Guest;
            use handoff::policy::types;

            struct Policy;

            impl Guest for Policy {
                fn run(_settings: types::Settings) -> Result<types::Report, String> {
                    Err("never run".into())
                }
            }

            impl declared::Guest for Policy {
                fn parameter_count() -> u32 {
                    0
                }

                fn parameter_at(_index: u32) -> Parameter {
                    unreachable!("no parameters")
                }
            }

            impl delivery::Guest for Policy {
                fn effect_of($outbox: DeliveryRecord) -> Effect $effect

                fn classify($failure: Failure) -> Option<Verdict> $classify
            }

            export!(Policy);
        }
    };
}
