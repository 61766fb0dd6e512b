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
//!   [`DEFAULT_WALL_EPOCH_SECS`](handoff_domain::time::DEFAULT_WALL_EPOCH_SECS)) plus the virtual clock;
//! - `wasi:random/random` and `wasi:random/insecure`: ChaCha20 generators seeded from the
//!   fixture's and the policy's digests; `insecure-seed` derived from the same.

use std::time::{Duration, Instant};

use handoff_domain::time::{VirtualClock, VirtualTime};

use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;
use sha2::{Digest, Sha256};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::clocks::HostWallClock;

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
