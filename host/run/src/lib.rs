//! From inputs to a finished run: the one place that fixes a run's plan, chooses its backends
//! and drives it.
//!
//! - `inputs`: the baseline task's inputs, validated;
//! - `plan`: what a run is given (inputs, policy settings, limits, stop signal, stream options), its deadline
//!   fixed once when it begins, and the run itself;
//! - `backends`: where the events come from and where the state goes (a replica set, or a
//!   recording with an embedded store);
//! - `snapshot`: documents an operator command read, decided by the policy as a run's events;
//! - `held`: a run's hold on its consumer, given back with the run's record in its history;
//! - `watchdog`: ends the process when a run outlives its deadline plus a grace period.

pub mod backends;
pub mod held;
pub mod inputs;
pub mod plan;
pub mod snapshot;
pub mod watchdog;

pub use backends::Backends;
pub use inputs::{Inputs, RawInputs};
pub use plan::{FailedRun, Finished, Plan, StreamOptions, begin};
