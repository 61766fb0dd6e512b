//! The default handoff policy.
//!
//! It reproduces the baseline task exactly: resume mode from the checkpoint, event ID = SHA-256 of
//! the canonical token text, one atomic commit per event, an invalidation saved with `startAfter`
//! and ending the run, and an idle watermark that never leaves an uncheckpointed gap. All of that
//! is the SDK's run loop; the policy's one decision is to hand every event off under its baseline
//! ID.

pub use handoff_policy_sdk::*;

/// Every event handed off under its baseline ID, one per transaction.
#[derive(Clone, Copy, Debug, Default)]
pub struct Baseline;

impl Policy for Baseline {
    fn decide(&mut self, _event: &mut Delivered<'_>, id: String) -> Decision {
        Decision::HandOff(id)
    }
}

/// Drives one bounded run exactly as the baseline task does.
pub fn run(host: &mut dyn Host, settings: &Settings) -> Result<Report, String> {
    handoff_policy_sdk::run::<Baseline>(host, settings)
}

#[cfg(target_arch = "wasm32")]
handoff_policy_sdk::export_policy!(Baseline);

#[cfg(test)]
mod tests;
