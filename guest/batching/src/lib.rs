//! The batching policy: up to `batch_size` events (policy parameter, default 10, at most 500) per
//! transaction — one checkpoint move and several outbox records — with the baseline's event IDs.
//!
//! A batch is committed when it is full, when the stream has nothing more within its await bound,
//! at an invalidation (which ends the batch and the run, saved with `startAfter`), and at the end
//! of the run. Everything else — resume mode, idle timer, `max_events`, idle watermark — is the
//! default policy's: all of it is the SDK's run loop.

use handoff_policy_sdk::{Decision, Delivered, FromSettings, MAX_BATCH, Policy, Settings};

/// Baseline hand-offs, `size` per transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    pub size: usize,
}

impl FromSettings for Batching {
    /// The batch size from the `batch_size` parameter.
    fn from_settings(settings: &Settings) -> Result<Batching, String> {
        let size = match settings.param("batch_size") {
            None => 10,
            Some(text) => match text.parse::<usize>() {
                Ok(n) if (1..=MAX_BATCH).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "batch_size must be an integer from 1 to {MAX_BATCH}, not {text:?}"
                    ));
                }
            },
        };
        Ok(Batching { size })
    }
}

impl Policy for Batching {
    const PARAMETERS: &'static [(&'static str, &'static str)] =
        &[("batch_size", "events per transaction, 1-500 (default 10)")];

    fn decide(&mut self, _event: &mut Delivered<'_>, id: String) -> Decision {
        Decision::HandOff(id)
    }

    fn batch_size(&self) -> usize {
        self.size
    }
}

#[cfg(target_arch = "wasm32")]
handoff_policy_sdk::export_policy!(Batching);

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_policy_sdk::fake::FakeHost;
    use handoff_policy_sdk::{Mode, Status, event_id, run};

    #[test]
    fn batch_size_is_bounded() {
        let with = |v: &str| Settings::default().param_set("batch_size", v);
        assert_eq!(
            Batching::from_settings(&Settings::default()),
            Ok(Batching { size: 10 })
        );
        assert_eq!(
            Batching::from_settings(&with("3")),
            Ok(Batching { size: 3 })
        );
        for bad in ["0", "501", "x", "-1"] {
            assert!(Batching::from_settings(&with(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn batches_of_three_and_an_invalidation_that_ends_the_last() {
        let mut host = FakeHost::new();
        for (token, op) in [
            ("A", "insert"),
            ("B", "insert"),
            ("C", "insert"),
            ("D", "insert"),
            ("E", "invalidate"),
        ] {
            host = host.event(token, op);
        }
        let settings = Settings::new(50, 3000).param_set("batch_size", "3");
        let report = run::<Batching>(&mut host, &settings).unwrap();
        assert_eq!(report.status, Status::Invalidated);
        assert_eq!(report.events_handed_off, 4);
        let covered: Vec<_> = host
            .commits
            .iter()
            .map(|c| (c.next.as_str(), c.decisions.len()))
            .collect();
        assert_eq!(covered, vec![("C", 3), ("E", 2)]);
        assert_eq!((host.token(), host.mode()), (Some("E"), Mode::StartAfter));
        assert_eq!(host.handed_off()[3], event_id("D"));
    }
}
