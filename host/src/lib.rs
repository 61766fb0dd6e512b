//! handoff: hands MongoDB change-stream events to a durable outbox, one atomic commit per event,
//! under a sandboxed WebAssembly policy.
//!
//! Each room is a crate under `host/`, lower rooms first; a crate can name only the rooms below
//! it, so the compiler keeps the layering:
//! - [`domain`] (`handoff-domain`): the shared vocabulary (checkpoint, modes, deployment, tokens,
//!   server errors, the fixture format), the failure classes and their exit codes ([`error`]), and
//!   the two backend traits, [`ChangeSource`] and [`CheckpointStore`];
//! - [`session`] (`handoff-session`): the guarantees: every call a policy makes, validated, and
//!   the commits it makes; no WebAssembly, no driver;
//! - [`backend`] (`handoff-backend`, and `handoff-mongo` as [`backend::mongo`], the only crate
//!   that names the driver): the sources and stores (recorded replay, embedded store, memory,
//!   snapshot runs, MongoDB);
//! - [`runtime`] (`handoff-runtime`): the wasmtime host that loads and limits a policy component
//!   and translates its calls onto the session;
//! - [`run`] (`handoff-run`): inputs turned into a run plan, the backends chosen, the run driven;
//! - [`output`] (`handoff-output`): what a finished run tells the workflow engine, one file per
//!   format;
//! - [`kit`] (`handoff-kit`): the policy authors' kit (cases, checks, scaffold, recording);
//! - [`operate`] (`handoff-operate`): the operator's toolkit (status, audited reset, backfill,
//!   reconcile, progress, dead records);
//! - [`deliver`] (`handoff-deliver`): the outbox delivered to sinks through a ledger, one file per
//!   sink.
//!
//! The `handoff` command line lives in this crate's binary (`src/cli`), the only crate that
//! depends on `clap`, on top of this API.

pub use handoff_deliver as deliver;
pub use handoff_domain as domain;
pub use handoff_domain::error;
pub use handoff_kit as kit;
pub use handoff_operate as operate;
pub use handoff_output as output;
pub use handoff_run as run;
pub use handoff_runtime as runtime;
pub use handoff_session as session;

/// The sources and stores: `handoff-backend`, with the MongoDB backend (`handoff-mongo`) as
/// [`mongo`](backend::mongo).
pub mod backend {
    pub use handoff_backend::*;
    pub use handoff_mongo as mongo;
}

pub use domain::{ChangeSource, Checkpoint, CheckpointStore, Mode};
pub use error::{HandoffError, Result};
pub use run::{Finished, Plan};
pub use runtime::{Limits, Policy, PolicySource, Runtime};
pub use session::{RunSummary, Session};
