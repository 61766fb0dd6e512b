//! The head the test policies that declare parameters (contract 1.4) share: a policy that is
//! never run, whose `declared` export answers as the policy including this says.

/// A contract-1.4 policy never run, whose `parameter-count` is `$count` and whose
/// `parameter-at($index)` is `$at`.
macro_rules! declaring_policy {
    (count: $count:block, at($index:ident): $at:block) => {
        #[cfg(target_arch = "wasm32")]
        mod policy {
            wit_bindgen::generate!({ path: "../../wit", world: "declared-policy" });

            use exports::handoff::policy::declared::{self, Parameter};
            use exports::handoff::policy::policy::Guest;
            use handoff::policy::types;

            struct Policy;

            impl Guest for Policy {
                fn run(_settings: types::Settings) -> Result<types::Report, String> {
                    Err("never run".into())
                }
            }

            impl declared::Guest for Policy {
                fn parameter_count() -> u32 $count

                fn parameter_at($index: u32) -> Parameter $at
            }

            export!(Policy);
        }
    };
}
