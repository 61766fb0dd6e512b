//! The watchdog: ends the process when a run outlives its deadline plus a grace period.
//!
//! The run deadline ends a run from the inside (epoch callback, bounded waits, the session's
//! checks). Should anything still not return — a compilation that takes too long, a host call
//! that hangs — the watchdog thread, armed at process start, prints why on stderr and exits with
//! [`WATCHDOG_EXIT_CODE`]. What was committed stands.

use std::io::Write as _;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The exit code of a process the watchdog ended.
pub const WATCHDOG_EXIT_CODE: u8 = 14;

struct Armed {
    deadline: Instant,
    grace: Duration,
}

static WATCHDOG: OnceLock<(Mutex<Armed>, Condvar)> = OnceLock::new();

/// Arms the watchdog: the process ends at `run_deadline + grace` unless a run extends it. Only
/// the first call starts the thread; later ones move the deadline like [`extend`].
pub fn arm(run_deadline: Instant, grace: Duration) {
    let mut started = false;
    let watchdog = WATCHDOG.get_or_init(|| {
        started = true;
        (
            Mutex::new(Armed {
                deadline: run_deadline + grace,
                grace,
            }),
            Condvar::new(),
        )
    });
    if !started {
        if let Ok(mut armed) = watchdog.0.lock() {
            armed.grace = grace;
        }
        extend(run_deadline);
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || watch(watchdog));
    if let Err(error) = spawned {
        tracing::warn!(%error, "the watchdog thread could not start");
    }
}

/// Moves the watchdog's deadline to `run_deadline` plus the grace period, if that is later.
/// Nothing happens when the watchdog is not armed.
pub fn extend(run_deadline: Instant) {
    let Some((armed, wake)) = WATCHDOG.get() else {
        return;
    };
    if let Ok(mut armed) = armed.lock() {
        let deadline = run_deadline + armed.grace;
        if deadline > armed.deadline {
            armed.deadline = deadline;
            wake.notify_all();
        }
    }
}

fn watch((armed, wake): &(Mutex<Armed>, Condvar)) {
    let Ok(mut guard) = armed.lock() else {
        return;
    };
    loop {
        let now = Instant::now();
        if now >= guard.deadline {
            break;
        }
        let left = guard.deadline - now;
        guard = match wake.wait_timeout(guard, left) {
            Ok((guard, _)) => guard,
            Err(_) => return,
        };
    }
    let grace = guard.grace.as_secs_f64();
    tracing::error!(
        grace_seconds = grace,
        "watchdog: the run outlived its deadline"
    );
    // A closed stderr must not keep the process from ending.
    let _ = writeln!(
        std::io::stderr(),
        "error[watchdog]: the run did not end within its deadline plus the {grace} s grace period \
         (a policy compilation or a host call that does not return?); the process ends now, \
         what was committed stands and nothing else was written"
    );
    std::process::exit(i32::from(WATCHDOG_EXIT_CODE));
}
