//! The default handoff policy.
//!
//! It reproduces the baseline task exactly: resume mode from the checkpoint, event ID = SHA-256 of
//! the canonical token text, one atomic commit per event, an invalidation saved with `startAfter`
//! and ending the run, and an idle watermark that never leaves an uncheckpointed gap.
//!
//! The decision logic ([`run`]) is plain Rust over the [`Host`] trait, so it is unit-tested natively
//! and can be measured natively; on wasm32 the component exports it through the shared bindings.

pub use handoff_policy_sdk::*;

/// Drives one bounded run exactly as the baseline task does.
pub fn run<H: Host>(
    host: &mut H,
    checkpoint: Checkpoint,
    settings: &Settings,
) -> Result<Report, String> {
    let mut tally = Tally::new(&checkpoint);
    host.open(stream_start(&checkpoint))?;
    let mut deadline = host.now_ms().saturating_add(settings.max_wait_ms);

    while tally.events < settings.max_events && host.now_ms() < deadline {
        let Some(event) = host.next()? else {
            continue;
        };
        let id = event_id(&event.token);
        let mode = mode_after(&event);
        let outbox_id = (mode == Mode::ResumeAfter).then_some(id.as_str());
        host.commit(tally.token.as_deref(), &event.token, mode, outbox_id)?;
        tally.events += 1;
        if mode == Mode::StartAfter {
            tally.invalidate(&event.token);
            tally.token = Some(event.token);
            break;
        }
        tally.token = Some(event.token);
        tally.hand_off(id);
        deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    }
    tally.finish(host, settings)
}

#[cfg(target_arch = "wasm32")]
handoff_policy_sdk::export_policy!(run);

#[cfg(test)]
mod tests;
