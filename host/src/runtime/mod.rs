//! The sandboxed policy runtime.
//!
//! - `engine`: the wasmtime engine, linker and the run loop of one policy call;
//! - `policy`: loading and checking policy components against the contract;
//! - `bindings`: the WIT contract bound to the host (imports delegate to the session);
//! - `session`: the host side of a run and the validation of every policy decision;
//! - `limits`: memory cap, compute slice and run deadline;
//! - `stop`: graceful stop on SIGTERM / SIGINT;
//! - `cache`: compiled artifacts keyed by policy digest and engine.

mod bindings;
pub mod cache;
pub mod engine;
pub mod limits;
pub mod policy;
pub mod session;
pub mod stop;

pub use bindings::PROCESS_START;
pub use engine::{Runtime, Settings};
pub use limits::Limits;
pub use policy::{Policy, PolicySource};
pub use stop::StopSignal;
