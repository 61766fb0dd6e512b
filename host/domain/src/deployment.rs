//! Who reads what, and from where.

/// What the source runs on: a replica set, or a sharded cluster reached through `mongos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    ReplicaSet,
    ShardedCluster,
}

/// The deployment the source belongs to, and its identity, which every checkpoint is pinned to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployment {
    pub topology: Topology,
    /// A replica set's name (`hello.setName`); empty for a sharded cluster.
    pub set_name: String,
    /// A replica set's `settings.replicaSetId`, or a sharded cluster's `clusterId` (in
    /// `config.version`), as hex.
    pub id: String,
}

impl Deployment {
    pub fn replica_set(set_name: impl Into<String>, id: impl Into<String>) -> Deployment {
        Deployment {
            topology: Topology::ReplicaSet,
            set_name: set_name.into(),
            id: id.into(),
        }
    }

    pub fn sharded_cluster(id: impl Into<String>) -> Deployment {
        Deployment {
            topology: Topology::ShardedCluster,
            set_name: String::new(),
            id: id.into(),
        }
    }

    /// What a checkpoint of this deployment is pinned to.
    pub fn pin(&self) -> Pin<'_> {
        match self.topology {
            Topology::ReplicaSet => Pin::ReplicaSet(&self.id),
            Topology::ShardedCluster => Pin::ShardedCluster(&self.id),
        }
    }
}

/// The deployment a checkpoint belongs to: its resume tokens mean something there only. A
/// checkpoint never moves between replica sets, between clusters, or between a replica set and
/// a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pin<'a> {
    /// `replicaSetId` in the checkpoint (the baseline's field).
    ReplicaSet(&'a str),
    /// `clusterId` in the checkpoint.
    ShardedCluster(&'a str),
}

impl<'a> From<&'a str> for Pin<'a> {
    /// A replica set's ID.
    fn from(id: &'a str) -> Pin<'a> {
        Pin::ReplicaSet(id)
    }
}

impl<'a> From<&'a String> for Pin<'a> {
    /// A replica set's ID.
    fn from(id: &'a String) -> Pin<'a> {
        Pin::ReplicaSet(id)
    }
}

impl<'a> Pin<'a> {
    /// The checkpoint field holding the ID.
    pub fn field(self) -> &'static str {
        match self {
            Pin::ReplicaSet(_) => "replicaSetId",
            Pin::ShardedCluster(_) => "clusterId",
        }
    }

    /// The field the other kind of deployment writes.
    pub fn other_field(self) -> &'static str {
        match self {
            Pin::ReplicaSet(_) => "clusterId",
            Pin::ShardedCluster(_) => "replicaSetId",
        }
    }

    pub fn id(self) -> &'a str {
        match self {
            Pin::ReplicaSet(id) | Pin::ShardedCluster(id) => id,
        }
    }

    /// "replica set" or "sharded cluster".
    pub fn kind(self) -> &'static str {
        match self {
            Pin::ReplicaSet(_) => "replica set",
            Pin::ShardedCluster(_) => "sharded cluster",
        }
    }

    /// The kind of deployment [`Pin::other_field`] names.
    pub fn other_kind(self) -> &'static str {
        match self {
            Pin::ReplicaSet(_) => "sharded cluster",
            Pin::ShardedCluster(_) => "replica set",
        }
    }
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
