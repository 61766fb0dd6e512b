//! The clocks and random source a policy sees through WASI.
//!
//! A live run gives the policy real clocks and the host's random source. A replay (and so every
//! `policy test` case) gives it virtual ones, so that a run depends only on its fixture and its
//! policy:
//!
//! - monotonic clock: the replay source's virtual clock ([`VirtualClock`], shared with the
//!   source, which advances it by the await bound whenever its stream is idle). A wait on it
//!   (`std::thread::sleep`, `subscribe-duration` / `subscribe-instant` then `block` / `poll`)
//!   does not wait: the clock moves to the earliest deadline waited for, at once;
//! - wall clock: a fixed epoch (the `clusterTime` of the fixture's first event, else
//!   [`DEFAULT_WALL_EPOCH_SECS`]) plus the virtual clock;
//! - `wasi:random/random` and `wasi:random/insecure`: ChaCha20 generators seeded from the
//!   fixture's and the policy's digests; `insecure-seed` derived from the same.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;
use sha2::{Digest, Sha256};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::clocks::HostWallClock;

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
    pub(crate) fn note_wait(&self, ns: u64) {
        self.waiting_for.fetch_min(ns, Ordering::SeqCst);
    }

    /// The earliest deadline noted since the last call, and forgets it.
    pub(crate) fn take_wait(&self) -> Option<u64> {
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

/// The policy's monotonic clock.
#[derive(Clone, Debug)]
pub enum Clock {
    /// Real time since the run started.
    Real(Instant),
    Virtual(VirtualClock),
}

impl Clock {
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Real(origin) => u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX),
            Clock::Virtual(clock) => clock.now_ns(),
        }
    }
}

/// The wall clock of a replay: the epoch plus the virtual clock.
struct VirtualWallClock {
    epoch: Duration,
    clock: VirtualClock,
}

impl HostWallClock for VirtualWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        self.epoch
            .saturating_add(Duration::from_nanos(self.clock.now_ns()))
    }
}

/// Sets a WASI context's wall clock and random sources to the virtual ones of a replay.
pub fn make_deterministic(builder: &mut WasiCtxBuilder, time: &VirtualTime, policy_sha256: &str) {
    let seed = |purpose: &str| -> [u8; 32] {
        let mut hash = Sha256::new();
        hash.update(b"handoff/replay-random/v1\0");
        hash.update(purpose.as_bytes());
        hash.update(b"\0");
        hash.update(time.recording_digest);
        hash.update(policy_sha256.as_bytes());
        hash.finalize().into()
    };
    let insecure_seed = seed("insecure-seed");
    let mut half = [0u8; 16];
    half.copy_from_slice(&insecure_seed[..16]);
    builder
        .wall_clock(VirtualWallClock {
            epoch: time.wall_epoch,
            clock: time.clock.clone(),
        })
        .secure_random(ChaCha20Rng::from_seed(seed("random")))
        .insecure_random(ChaCha20Rng::from_seed(seed("insecure")))
        .insecure_random_seed(u128::from_le_bytes(half));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_virtual_clock_only_moves_forward() {
        let clock = VirtualClock::new();
        clock.advance_ms(1000);
        assert_eq!(clock.now_ms(), 1000);
        clock.advance_to_ns(500);
        assert_eq!(clock.now_ns(), 1_000_000_000);
        clock.advance_to_ns(2_500_000_000);
        assert_eq!(clock.now_ms(), 2500);
    }

    #[test]
    fn the_earliest_noted_wait_is_taken_once() {
        let clock = VirtualClock::new();
        assert_eq!(clock.take_wait(), None);
        clock.note_wait(30);
        clock.note_wait(10);
        clock.note_wait(20);
        assert_eq!(clock.take_wait(), Some(10));
        assert_eq!(clock.take_wait(), None);
    }
}
