//! From inputs to a finished run: the one place that fixes a run's plan, chooses its backends
//! and drives it.
//!
//! - `inputs`: the baseline task's inputs, validated;
//! - `plan`: what a run is given (inputs, policy settings, limits, stop signal, stream options), its deadline
//!   fixed once when it begins, and the run itself;
//! - `backends`: where the events come from and where the state goes (a replica set, or a
//!   recording with an embedded store);
//! - `watchdog`: ends the process when a run outlives its deadline plus a grace period.

pub mod backends;
pub mod inputs;
pub mod plan;
pub mod watchdog;

pub use backends::Backends;
pub use inputs::{Inputs, RawInputs};
pub use plan::{FailedRun, Finished, Plan, StreamOptions, begin};
