//! Who holds a consumer. A run takes a lease on its checkpoint when it starts (`owner`,
//! `leaseUntil`) and renews it with every commit, so that a second run on the same consumer
//! stops at its start instead of at its first commit. The lease only makes a conflict visible
//! early: the checkpoint's compare-and-set on the token is what keeps two runs from handing an
//! event off twice, with or without it (the baseline task knows no lease).
//!
//! Times are the writer's wall clock; a run on a machine whose clock is ahead by more than a
//! lease may take a lease over early, which costs the run that held it its next commit (a
//! conflict), never an event.

use std::time::Duration;

use bson::DateTime;

/// How long a lease lasts after it is taken or renewed, unless a run says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// This run's lease: its owner name and how long each renewal lasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// `handoff@<host>:<pid>:<start>.<n>`: unique to the process and the lease.
    pub owner: String,
    pub duration: Duration,
}

impl Lease {
    /// A lease for this process.
    pub fn new(duration: Duration) -> Lease {
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
            .map(|h| {
                h.trim()
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
                    .take(64)
                    .collect::<String>()
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        // The start time tells apart processes that reused a pid; the counter, leases of one
        // process.
        static TAKEN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let count = TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Lease {
            owner: format!("handoff@{host}:{}:{nanos:x}.{count}", std::process::id()),
            duration,
        }
    }

    /// When a lease taken or renewed at `now` ends.
    pub fn until(&self, now: DateTime) -> DateTime {
        let millis = i64::try_from(self.duration.as_millis()).unwrap_or(i64::MAX);
        DateTime::from_millis(now.timestamp_millis().saturating_add(millis))
    }
}

/// A lease as the checkpoint records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub owner: String,
    pub until: DateTime,
}

impl Holder {
    /// Whether the lease still holds at `now`.
    pub fn holds(&self, now: DateTime) -> bool {
        self.until > now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_unique_and_leases_end_after_their_duration() {
        let a = Lease::new(DEFAULT_LEASE);
        let b = Lease::new(DEFAULT_LEASE);
        assert_ne!(a.owner, b.owner);
        assert!(a.owner.starts_with("handoff@"), "{}", a.owner);
        let now = DateTime::from_millis(1_000);
        assert_eq!(a.until(now), DateTime::from_millis(61_000));
        let holder = Holder {
            owner: a.owner.clone(),
            until: a.until(now),
        };
        assert!(holder.holds(DateTime::from_millis(60_999)));
        assert!(!holder.holds(DateTime::from_millis(61_000)));
        let forever = Lease {
            owner: "x".into(),
            duration: Duration::MAX,
        };
        assert_eq!(forever.until(now), DateTime::from_millis(i64::MAX));
    }
}
