//! The sandboxed policy runtime: a thin adapter between a WebAssembly component and the session.
//!
//! - `engine`: the wasmtime engine and linker, and one policy run over a session;
//! - `policy`: loading and checking policy components against the contract;
//! - `declared`: what a policy declares before any run (the parameters it reads);
//! - `effects`: what a policy makes of a delivery's records (contract 1.6);
//! - `bindings`: the WIT contract bound to the host, each import translated onto the session;
//! - `limits`: memory cap, compute slice and run timeout;
//! - `cache`: compiled artifacts keyed by policy digest and engine;
//! - `wasi`: the WASI a policy gets, its waits bounded by the slice, the deadline and the stop flag;
//! - `clock`: real or virtual (replay) clocks and random sources.

mod bindings;
pub mod cache;
pub mod clock;
pub mod declared;
pub mod effects;
pub mod engine;
pub mod limits;
pub mod policy;
pub mod wasi;

pub use engine::{Runtime, Settings};
pub use limits::Limits;
pub use policy::{Policy, PolicySource};

/// When the process started (set by the CLI's first line), for the start-up figure.
pub static PROCESS_START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
