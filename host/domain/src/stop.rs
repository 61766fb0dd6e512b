//! Graceful stop: SIGTERM or SIGINT ends a run after its in-flight commit.
//!
//! The flag is checked at every policy call into the host, by the epoch callback while the
//! policy computes and every few milliseconds while it waits in WASI; a commit already under way
//! always finishes. The run then reports what it committed and exits with its own code.
//!
//! A second SIGTERM or SIGINT ends the process at once, with 128 + the signal's number (143 for
//! SIGTERM, 130 for SIGINT), as a shell reports a process a signal ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone, Debug, Default)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    /// A flag raised by SIGTERM and SIGINT; a second one ends the process at once.
    pub fn on_signals() -> std::io::Result<StopSignal> {
        let stop = StopSignal::default();
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            // Registered first, so it sees the flag as the first signal left it.
            signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, stop.0.clone())?;
            signal_hook::flag::register(signal, stop.0.clone())?;
        }
        Ok(stop)
    }

    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
