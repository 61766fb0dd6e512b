//! The batching policy: up to `batch_size` events (policy parameter, default 10, at most 500) per
//! transaction — one checkpoint move and several outbox records — with the baseline's event IDs.
//!
//! A batch is committed when it is full, when the stream has nothing more within its await bound,
//! at an invalidation (which ends the batch and the run, saved with `startAfter`), and at the end
//! of the run. Everything else — resume mode, idle timer, `max_events`, idle watermark — is the
//! default policy's.

use handoff_policy_sdk::{
    Checkpoint, Decision, Host, Mode, Report, Settings, Tally, event_id, mode_after, stream_start,
};

/// The largest batch the host accepts.
pub const MAX_BATCH: usize = 500;

/// The batch size from the `batch_size` parameter.
pub fn batch_size(settings: &Settings) -> Result<usize, String> {
    match settings.param("batch_size") {
        None => Ok(10),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_BATCH).contains(&n) => Ok(n),
            _ => Err(format!(
                "batch_size must be an integer from 1 to {MAX_BATCH}, not {text:?}"
            )),
        },
    }
}

struct Batch {
    last: Option<(String, Mode)>,
    decisions: Vec<Decision>,
}

impl Batch {
    /// Commits the pending decisions, if any; returns the new checkpoint token.
    fn flush<H: Host>(&mut self, host: &mut H, token: &mut Option<String>) -> Result<(), String> {
        if let Some((next, mode)) = self.last.take() {
            let decisions = std::mem::take(&mut self.decisions);
            host.commit_batch(token.as_deref(), &next, mode, decisions)?;
            *token = Some(next);
        }
        Ok(())
    }
}

pub fn run<H: Host>(
    host: &mut H,
    checkpoint: Checkpoint,
    settings: &Settings,
) -> Result<Report, String> {
    let size = batch_size(settings)?;
    let mut tally = Tally::new(&checkpoint);
    let mut batch = Batch {
        last: None,
        decisions: Vec::new(),
    };

    host.open(stream_start(&checkpoint))?;
    let mut deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    while tally.events < settings.max_events && host.now_ms() < deadline {
        let Some(event) = host.next()? else {
            // Caught up for now: do not hold delivered events back.
            batch.flush(host, &mut tally.token)?;
            continue;
        };
        let mode = mode_after(&event);
        tally.events += 1;
        if mode == Mode::StartAfter {
            batch.decisions.push(Decision::Skip("invalidate".into()));
            tally.invalidate(&event.token);
            batch.last = Some((event.token, mode));
            break;
        }
        let id = event_id(&event.token);
        batch.decisions.push(Decision::HandOff(id.clone()));
        batch.last = Some((event.token, mode));
        tally.hand_off(id);
        if batch.decisions.len() >= size {
            batch.flush(host, &mut tally.token)?;
        }
        deadline = host.now_ms().saturating_add(settings.max_wait_ms);
    }
    batch.flush(host, &mut tally.token)?;
    tally.finish(host, settings)
}

#[cfg(target_arch = "wasm32")]
handoff_policy_sdk::export_policy!(run);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_size_is_bounded() {
        let with = |v: &str| Settings {
            params: vec![("batch_size".into(), v.into())],
            ..Settings::default()
        };
        assert_eq!(batch_size(&Settings::default()), Ok(10));
        assert_eq!(batch_size(&with("3")), Ok(3));
        for bad in ["0", "501", "x", "-1"] {
            assert!(batch_size(&with(bad)).is_err(), "{bad}");
        }
    }
}
