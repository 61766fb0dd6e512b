//! Backends: where change events come from and where the checkpoint and outbox live.
//!
//! Each backend implements one of the two traits of [`crate::domain`], so that any source pairs
//! with any store: a [`ChangeSource`](crate::domain::ChangeSource) (the deployment's identity and
//! its change stream) and a [`CheckpointStore`](crate::domain::CheckpointStore) (the checkpoint
//! compare-and-set and the record inserts, atomically).
//!
//! - `replay`: a recorded change stream (the fixture format) served with a real server's resume
//!   semantics;
//! - `redb_store`: checkpoint and outbox in an embedded ACID store on disk;
//! - `mongo`: a MongoDB replica set through the official driver (source and store);
//! - `memory`: an in-memory store for tests and benchmarks.

pub mod memory;
pub mod mongo;
pub mod redb_store;
pub mod replay;
