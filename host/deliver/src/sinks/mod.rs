//! The sinks, one file each behind [`Sink`](crate::sink::Sink).
//!
//! - `projection`: a MongoDB collection, the effect and the ledger in one transaction;
//! - `webhook`: an HTTP endpoint, signed the Standard Webhooks way, at least once with a stable
//!   `webhook-id`.

pub mod projection;
pub mod webhook;
