//! The virtual time of a recorded stream: a monotonic clock the replay source moves and the
//! policy's WASI clocks follow, and the wall-clock epoch and seed that go with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The wall clock of a replay whose fixture has no event: 2020-01-01T00:00:00Z.
pub const DEFAULT_WALL_EPOCH_SECS: u64 = 1_577_836_800;

/// A virtual monotonic clock in nanoseconds, shared by a replay source and the policy's WASI.
#[derive(Clone, Debug)]
pub struct VirtualClock {
    nanos: Arc<AtomicU64>,
    /// The earliest deadline a wait is pending on (`u64::MAX`: none), see [`VirtualClock::note_wait`].
    waiting_for: Arc<AtomicU64>,
}

impl VirtualClock {
    pub fn new() -> Self {
        VirtualClock {
            nanos: Arc::new(AtomicU64::new(0)),
            waiting_for: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.nanos
            .fetch_add(ms.saturating_mul(1_000_000), Ordering::SeqCst);
    }

    /// Moves the clock to `ns` unless it is already past it.
    pub fn advance_to_ns(&self, ns: u64) {
        self.nanos.fetch_max(ns, Ordering::SeqCst);
    }

    /// Records that a wait is pending on the deadline `ns`.
    pub fn note_wait(&self, ns: u64) {
        self.waiting_for.fetch_min(ns, Ordering::SeqCst);
    }

    /// The earliest deadline noted since the last call, and forgets it.
    pub fn take_wait(&self) -> Option<u64> {
        match self.waiting_for.swap(u64::MAX, Ordering::SeqCst) {
            u64::MAX => None,
            ns => Some(ns),
        }
    }
}

impl Default for VirtualClock {
    fn default() -> Self {
        VirtualClock::new()
    }
}

/// What a replay gives the policy instead of the real time and randomness.
#[derive(Clone, Debug)]
pub struct VirtualTime {
    pub clock: VirtualClock,
    /// The wall clock when the virtual clock reads 0, since the Unix epoch.
    pub wall_epoch: Duration,
    /// Digest of the recording; combined with the policy's digest into the random seed.
    pub recording_digest: [u8; 32],
}
