//! When a failed attempt is tried again: exponential backoff with jitter, never sooner than the
//! sink asked (`Retry-After`), never later than the bound.

use std::time::Duration;

use rand::RngExt as _;

/// How retries are paced.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// The pause after the first failure (before jitter).
    pub base: Duration,
    /// The longest pause, whatever the attempt or the sink's ask.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The pause after failed attempt `attempt` (1 for the first): `base · 2^(attempt-1)`,
    /// capped, with "equal jitter" (uniform in its upper half, so deliverers that failed
    /// together spread out), at least `retry_after`, at most `max`.
    pub fn pause(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exponent = attempt.saturating_sub(1).min(30);
        let full = self
            .base
            .saturating_mul(1u32 << exponent.min(20))
            .min(self.max);
        let half = full / 2;
        let jitter = if half.is_zero() {
            Duration::ZERO
        } else {
            let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(rand::rng().random_range(0..=nanos))
        };
        (half + jitter)
            .max(retry_after.unwrap_or_default())
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_stay_bounded_and_honour_the_sink() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10),
        };
        for _ in 0..100 {
            let first = backoff.pause(1, None);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let fifth = backoff.pause(5, None);
            assert!(fifth >= Duration::from_millis(800) && fifth <= Duration::from_millis(1600));
            assert!(backoff.pause(60, None) <= Duration::from_secs(10));
            assert!(backoff.pause(60, None) >= Duration::from_secs(5));
            assert_eq!(
                backoff.pause(1, Some(Duration::from_secs(7))),
                Duration::from_secs(7)
            );
            assert_eq!(
                backoff.pause(1, Some(Duration::from_secs(3600))),
                Duration::from_secs(10)
            );
        }
    }
}
