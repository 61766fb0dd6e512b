//! The sandboxed policy runtime.
//!
//! - `engine`: the wasmtime engine, linker and the run loop of one policy call;
//! - `policy`: loading and checking policy components against the contract;
//! - `bindings`: the WIT contract bound to the host (imports delegate to the session);
//! - `session`: the host side of a run and the validation of every policy decision;
//! - `limits`: memory cap, compute slice and run deadline;
//! - `stop`: graceful stop on SIGTERM / SIGINT;
//! - `cache`: compiled artifacts keyed by policy digest and engine;
//! - `wasi`: the WASI a policy gets, its waits bounded by the slice, the deadline and the stop flag;
//! - `clock`: real or virtual (replay) clocks and random sources;
//! - `watchdog`: ends the process when a run outlives its deadline plus a grace period.

mod bindings;
pub mod cache;
pub mod clock;
pub mod engine;
pub mod limits;
pub mod policy;
pub mod session;
pub mod stop;
pub mod wasi;
pub mod watchdog;

pub use bindings::PROCESS_START;
pub use engine::{Runtime, Settings};
pub use limits::Limits;
pub use policy::{Policy, PolicySource};
pub use stop::StopSignal;
pub use wasi::Sandbox;
