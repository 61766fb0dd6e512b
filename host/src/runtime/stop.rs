//! Graceful stop: SIGTERM or SIGINT ends a run after its in-flight commit.
//!
//! The flag is checked at every policy call into the host and by the epoch callback while the
//! policy computes; a commit already under way always finishes. The run then reports what it
//! committed and exits with its own code.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone, Debug, Default)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    /// A flag raised by SIGTERM and SIGINT.
    pub fn on_signals() -> std::io::Result<StopSignal> {
        let stop = StopSignal::default();
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
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
