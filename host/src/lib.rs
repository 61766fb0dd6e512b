//! handoff: hands MongoDB change-stream events to a durable outbox, one atomic commit per event,
//! under a sandboxed WebAssembly policy.
//!
//! The crate is laid out by responsibility:
//! - [`runtime`]: the wasmtime host that loads, limits and drives a policy component, and the
//!   session that validates every decision it makes;
//! - [`backend`]: change sources and checkpoint stores behind traits (replay, embedded store, memory);
//! - [`cli`]: the `handoff` commands;
//! - [`output`]: what a run prints for the workflow engine;
//! - [`kit`]: the policy authors' kit (cases, checks, scaffold, recording);
//! - domain modules: [`inputs`], [`checkpoint`], [`token`], [`fixture`], [`error`].

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod error;
pub mod fixture;
pub mod inputs;
pub mod kit;
pub mod output;
pub mod run;
pub mod runtime;
pub mod token;
