//! Delivery: a consumer's outbox taken to a sink, each effect once where the sink can make it
//! so (a MongoDB projection: the effect and the ledger in one transaction), at least once with a
//! stable idempotency key where it cannot (a webhook), never lost, through a ledger
//! ([`handoff_domain::delivery`]) that every change of goes through the one transaction runner.
//!
//! The ledger is behind [`handoff_domain::ledger::Ledger`]: in the consumer's MongoDB database
//! (`handoff_mongo::ledger`, admitting from the outbox's change stream) or in the embedded store
//! beside its outbox (`handoff_backend::redb_ledger`).
//!
//! - `engine`: the loop: lanes, workers, retries, bounds, leases, the report;
//! - `retry`: backoff with jitter and `Retry-After`;
//! - `sink`: the trait every sink is behind; `sinks`: one file each.

pub mod engine;
pub mod retry;
pub mod sink;
pub mod sinks;

pub use engine::{Ended, Options, Report, deliver};
