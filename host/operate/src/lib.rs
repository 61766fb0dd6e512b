//! The operator's toolkit: what someone on call reads and does when a consumer needs attention.
//!
//! Every command here is bounded in time, works against a replica set and the test server, and
//! never prints credentials or raw resume tokens. Reading commands change nothing; the acting ones
//! (`checkpoint reset`, `lease release`, `backfill`, `reconcile --repair`, `recover`) write an audit record with what they
//! changed and why, in the same transaction as the change.
//!
//! What is here plans and reports (chunks and watermarks, comparisons, in-flight keys, audit
//! entries, the reports' renderings); every read and write of the deployment goes through the
//! typed functions of [`handoff_mongo`] (`operator`, `events`, `backfill`, `reconcile`).
//!
//! - `status`: checkpoint, lag, oplog window and margin, outbox figures;
//! - `reset`: the audited compare-and-set of a consumer's checkpoint;
//! - `backfill`: the collection's existing documents handed off beside the live stream
//!   (watermark-based incremental snapshot);
//! - `reconcile`: the source compared with what the outbox says each document is;
//! - `recover`: after lost history, the checkpoint moved to now and the outbox repaired, in
//!   one audited command that a rerun completes when it was killed;
//! - `delivery_status`: every delivery of a consumer with its ledger's figures and lag;
//! - `dead`: a delivery's dead records listed, replayed or discarded, audited;
//! - `projection`: a delivery's MongoDB projection compared with its source, and repaired;
//! - `outbox_view`: what the outbox says each document should be now;
//! - `audit`: the audit records;
//! - `progress`: rate and ETA of long work, on a terminal or as structured lines;
//! - `report`: the self-contained HTML report.

pub mod audit;
pub mod backfill;
pub mod dead;
pub mod delivery_status;
pub mod lease;
pub mod outbox_view;
pub mod progress;
pub mod projection;
pub mod reconcile;
pub mod recover;
pub mod report;
pub mod reset;
pub mod status;

#[cfg(test)]
mod tests {
    use handoff_domain::state::DEFAULT_NAMES;

    #[test]
    fn every_default_state_name_is_reserved() {
        for name in [
            handoff_domain::deployment::DEFAULT_CHECKPOINTS,
            handoff_domain::deployment::DEFAULT_OUTBOX,
            super::audit::DEFAULT_COLLECTION,
            super::backfill::DEFAULT_SIGNAL_COLLECTION,
            super::backfill::DEFAULT_STATE_COLLECTION,
        ] {
            assert!(DEFAULT_NAMES.contains(&name), "{name}");
        }
    }
}
