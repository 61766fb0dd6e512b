//! Delivery: a consumer's outbox taken to a sink, each effect once where the sink can make it
//! so (a MongoDB projection: the effect and the ledger in one transaction), at least once with a
//! stable idempotency key where it cannot (a webhook), never lost, through a ledger
//! ([`handoff_domain::delivery`]) that every change of goes through the one transaction runner.
//!
//! - `admit`: the outbox's records into the ledger, in hand-off order (the outbox stream, a
//!   sweep when there is no position);
//! - `engine`: the loop: lanes, workers, retries, bounds, leases, the report;
//! - `effect`: the default policy's request for a record, and a record's lane;
//! - `retry`: backoff with jitter and `Retry-After`;
//! - `sink`: the trait every sink is behind; `sinks`: one file each.

pub mod admit;
pub mod effect;
pub mod engine;
pub mod retry;
pub mod sink;
pub mod sinks;

pub use engine::{Ended, Options, Report, deliver};
