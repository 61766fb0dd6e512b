//! The shared vocabulary of a run: what the session, the backends and the runtime all speak of,
//! with no WebAssembly and no driver in it.
//!
//! - `checkpoint`: a consumer's checkpoint document, its resume mode, how it is loaded and how a
//!   run binds it (lease, configuration);
//! - `config`: the stream's shape (scope, pipeline, pre- and post-images), checked and digested;
//! - `delivery`: what a delivery takes from the outbox to a sink, and its ledger; `effect`: what
//!   each record does to the sink, by the policy or the default;
//! - `ledger`: the trait every delivery ledger store is behind, and the changes it takes;
//! - `deployment`: the replica set, the consumer and where its state lives;
//! - `stream`: where a stream starts, server errors and their classes, the change-source trait;
//! - `lease`: which run holds a consumer, and until when;
//! - `position`: a consumer against its deployment: lag, checkpoint age, oplog margin;
//! - `history`: the run history (one record per run) and `forecast`: when the checkpoint would
//!   fall off the oplog if the rates hold;
//! - `state`: handoff's own state collections, which a database or deployment stream leaves out;
//! - `stop`: the flag SIGTERM and SIGINT raise to end a run after its in-flight commit;
//! - `store`: the atomic commit and the checkpoint-store trait;
//! - `token`: a resume token's canonical text (the form the policy sees and hashes);
//! - `text`: untrusted text (policy messages, server errors) made safe to print;
//! - `time`: the virtual clock a recorded stream runs on;
//! - `fixture`: a recorded change stream's text format, parsed;
//! - `error`: the failure classes and exit codes.
//!
//! A crate of its own: no room above it can be named here, and the crates that only speak this
//! vocabulary (the fuzz targets) build without the runtime or the driver.

pub mod checkpoint;
pub mod config;
pub mod delivery;
pub mod deployment;
pub mod effect;
pub mod error;
pub mod fixture;
pub mod forecast;
pub mod history;
pub mod lease;
pub mod ledger;
pub mod position;
pub mod state;
pub mod stop;
pub mod store;
pub mod stream;
pub mod text;
pub mod time;
pub mod token;

pub use checkpoint::{Checkpoint, Claim, Mode};
pub use config::StreamConfig;
pub use deployment::{Collections, Consumer, Deployment, Pin, Topology};
pub use lease::Lease;
pub use stop::StopSignal;
pub use store::{Applied, CheckpointStore, Commit, CommitError, Dump};
pub use stream::{ChangeSource, ServerError, Start, StreamError};
