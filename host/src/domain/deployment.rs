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

/// The collections (tables) a consumer's state lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collections {
    pub checkpoints: String,
    pub outbox: String,
    pub quarantine: String,
}
