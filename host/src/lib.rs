//! handoff: hands MongoDB change-stream events to a durable outbox, one atomic commit per event,
//! under a sandboxed WebAssembly policy.
//!
//! The crate is laid out by responsibility, lower rooms first:
//! - [`domain`]: the shared vocabulary (checkpoint, modes, deployment, tokens, server errors,
//!   the fixture format) and the two backend traits, [`ChangeSource`] and [`CheckpointStore`]: the
//!   crate `handoff-domain` (`host/domain`), which names no room above it;
//! - [`session`]: the guarantees: every call a policy makes, validated, and the commits it makes;
//! - [`backend`]: the sources and stores (MongoDB, recorded replay, embedded store, memory);
//! - [`runtime`]: the wasmtime host that loads and limits a policy component and translates its
//!   calls onto the session;
//! - [`run`]: inputs turned into a run plan, the backends chosen, the run driven;
//! - [`output`]: what a finished run tells the workflow engine, one file per format;
//! - [`kit`]: the policy authors' kit (cases, checks, scaffold, recording);
//! - [`operate`]: the operator's toolkit (status, audited reset, backfill, reconcile, progress);
//! - [`error`]: the failure classes and their exit codes (in `handoff-domain` too).
//!
//! The `handoff` command line lives in the binary (`src/cli`), on top of this API.

pub mod backend;
pub use handoff_domain as domain;
pub use handoff_domain::error;
pub mod kit;
pub mod operate;
pub mod output;
pub mod run;
pub mod runtime;
pub mod session;

pub use domain::{ChangeSource, Checkpoint, CheckpointStore, Mode};
pub use error::{HandoffError, Result};
pub use run::{Finished, Plan};
pub use runtime::{Limits, Policy, PolicySource, Runtime};
pub use session::{Session, Summary};
