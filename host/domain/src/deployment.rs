//! Who reads what, and from where.

/// The replica set the source belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployment {
    pub set_name: String,
    pub replica_set_id: String,
}

/// Identifies a consumer's checkpoint: the consumer and the namespace it watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumer {
    pub consumer: String,
    pub source: String,
}

/// The checkpoint collection when none is named (the baseline's).
pub const DEFAULT_CHECKPOINTS: &str = "kestra_change_checkpoints";
/// The outbox collection when none is named (the baseline's).
pub const DEFAULT_OUTBOX: &str = "kestra_change_outbox";

/// The collections (tables) a consumer's state lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collections {
    pub checkpoints: String,
    pub outbox: String,
    pub quarantine: String,
}
