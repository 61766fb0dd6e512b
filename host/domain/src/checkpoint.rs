//! The checkpoint document: created as the baseline creates it, and refused when it belongs to
//! another deployment or has a shape neither this tool nor the baseline writes.

use bson::{Bson, DateTime, Document, doc};

use super::config::{Partition, StreamConfig};
use super::deployment::Pin;
use super::lease::{Holder, Lease};
use super::text::escape_untrusted;
use crate::error::{HandoffError, Result};

/// How a saved token resumes a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    ResumeAfter,
    StartAfter,
}

impl Mode {
    /// The name stored in the checkpoint document, as the baseline writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ResumeAfter => "resumeAfter",
            Mode::StartAfter => "startAfter",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        match name {
            "resumeAfter" => Some(Mode::ResumeAfter),
            "startAfter" => Some(Mode::StartAfter),
            _ => None,
        }
    }
}

/// A checkpoint as loaded and validated before the run: the token (none for a fresh consumer)
/// and the mode it must be resumed with, and what binds it: its revision, the run holding it
/// and the stream configuration it was written with.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub token: Option<Document>,
    pub mode: Mode,
    /// Incremented by every write of this tool; `None` on a checkpoint it never wrote.
    pub revision: Option<i64>,
    /// The last run that took the lease, and until when.
    pub holder: Option<Holder>,
    /// The stream configuration recorded; `None` on a checkpoint the baseline created, whose
    /// configuration is the baseline's.
    pub config: Option<StreamConfig>,
    /// The policy the last run decided with; `None` before any run recorded one.
    pub policy: Option<PolicyBinding>,
    /// How many runs claimed the checkpoint ([`crate::history::RUNS_FIELD`]); 0 before any.
    pub runs: i64,
    /// How many times an operator moved it ([`crate::history::MOVES_FIELD`]).
    pub moves: i64,
}

/// The policy a consumer's runs decide with: its component's SHA-256 and a digest of its
/// parameters. Every commit of a run's decisions records it in the checkpoint; the commands that hand documents to the
/// policy (`backfill`, `reconcile`) must decide with the same one, or their records would be
/// another policy's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyBinding {
    pub sha256: String,
    /// Hex SHA-256 of the parameters, sorted, each key and value length-prefixed.
    pub params: String,
}

impl PolicyBinding {
    pub fn new(sha256: &str, params: &[(String, String)]) -> PolicyBinding {
        use sha2::Digest as _;
        let mut sorted: Vec<&(String, String)> = params.iter().collect();
        sorted.sort();
        let mut digest = sha2::Sha256::new();
        for (key, value) in sorted {
            for part in [key, value] {
                digest.update((part.len() as u64).to_le_bytes());
                digest.update(part.as_bytes());
            }
        }
        PolicyBinding {
            sha256: sha256.to_string(),
            params: hex::encode(digest.finalize()),
        }
    }

    /// The checkpoint's `policy` field.
    pub fn document(&self) -> Document {
        doc! { "sha256": &self.sha256, "params": &self.params }
    }

    fn from_document(stored: &Document) -> Option<PolicyBinding> {
        Some(PolicyBinding {
            sha256: stored.get_str("sha256").ok()?.to_string(),
            params: stored.get_str("params").ok()?.to_string(),
        })
    }
}

/// Refuses a command that would decide with another policy (or other parameters) than the one
/// that decided the consumer's last committed events. A consumer no run has committed for takes
/// any.
pub fn check_policy(loaded: &Checkpoint, used: &PolicyBinding, command: &str) -> Result<()> {
    let Some(recorded) = &loaded.policy else {
        return Ok(());
    };
    if recorded == used {
        return Ok(());
    }
    let what = if recorded.sha256 == used.sha256 {
        "the same policy with other parameters".to_string()
    } else {
        format!(
            "policy {} (the consumer's runs use {})",
            short(&used.sha256),
            short(&recorded.sha256)
        )
    };
    Err(HandoffError::Mismatch(format!(
        "`{command}` was given {what}: its records would not be the ones the consumer's policy \
         decides. Pass the consumer's own --policy and --policy-param values, or run the consumer \
         with the new policy first (each run records the policy it decides with). Nothing was \
         written"
    )))
}

/// The first 12 hex digits of a digest, as printed.
fn short(sha256: &str) -> String {
    escape_untrusted(&sha256.chars().take(12).collect::<String>(), 12)
}

impl Checkpoint {
    /// A consumer's checkpoint before any binding: a token and its mode.
    pub fn at(token: Option<Document>, mode: Mode) -> Checkpoint {
        Checkpoint {
            token,
            mode,
            revision: None,
            holder: None,
            config: None,
            policy: None,
            runs: 0,
            moves: 0,
        }
    }
}

/// A new checkpoint: `_id` plus the baseline's `$setOnInsert` fields, in its order.
/// The deployment is named by `pin`: `replicaSetId` for a replica set (the baseline's field),
/// `clusterId` for a sharded cluster.
pub fn initial<'a>(consumer: &str, source: &str, pin: impl Into<Pin<'a>>) -> Document {
    let pin = pin.into();
    let mut created = doc! { "_id": consumer, "source": source };
    created.insert(pin.field(), pin.id());
    created.insert("token", Bson::Null);
    created.insert("mode", Mode::ResumeAfter.as_str());
    created
}

/// A new checkpoint of this tool: the baseline's fields, then the configuration it is bound to
/// and revision 0.
pub fn initial_bound<'a>(
    consumer: &str,
    source: &str,
    pin: impl Into<Pin<'a>>,
    config: &StreamConfig,
) -> Document {
    let mut created = initial(consumer, source, pin);
    created.insert("revision", 0_i64);
    created.insert("config", config.to_document());
    created.insert("configDigest", config.digest());
    created
}

/// The largest revision a checkpoint may hold (2^53, exact in every client's numbers): far more
/// writes than any consumer makes, and room for every later increment.
pub const MAX_REVISION: i64 = 1 << 53;

/// How many configuration changes a checkpoint remembers (`configChanges`, newest last).
pub const CONFIG_CHANGES_KEPT: i32 = 20;

/// The write that binds a checkpoint to this run: applied only if the checkpoint is still at
/// the revision the run read.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The revision the run read (`None`: the checkpoint had none).
    pub seen_revision: Option<i64>,
    /// `owner`, `leaseUntil`, `config` and `configDigest`.
    pub set: Document,
    /// A configuration change accepted by the operator, appended to `configChanges`.
    pub change: Option<Document>,
    /// The run's number for its consumer, which the claim records (`runs`).
    pub run: i64,
    /// The operator's moves of the checkpoint so far (`moves`), for the run's record.
    pub moves: i64,
}

/// What a run asks of the checkpoint it loaded.
pub struct Binding<'a> {
    pub config: &'a StreamConfig,
    /// The operator's reason to accept a configuration other than the recorded one.
    pub accept_change: Option<&'a str>,
    pub lease: &'a Lease,
    pub now: DateTime,
}

/// Decides whether this run may take the checkpoint: another run's live lease is a conflict, a
/// configuration other than the recorded one a mismatch (unless the operator accepts it).
/// Nothing is written for either.
pub fn claim(loaded: &Checkpoint, binding: &Binding<'_>) -> Result<Claim> {
    if let Some(holder) = &loaded.holder
        && holder.owner != binding.lease.owner
        && holder.holds(binding.now)
    {
        return Err(HandoffError::Conflict(format!(
            "Another run ({}) holds this consumer until {}; it renews its lease with every commit. \
             Retry once it has ended (or its lease has expired)",
            escape_untrusted(&holder.owner, 120),
            holder.until.try_to_rfc3339_string().unwrap_or_default()
        )));
    }
    let recorded = loaded.config.clone().unwrap_or_default();
    // A partition is part of the consumer's identity: its checkpoint stands for the events of
    // that share of the source only. Another index, count, or a partition added or removed would
    // hand some events off twice and leave others to no one, which no reason can accept.
    if recorded.partition != binding.config.partition {
        let share = |p: Option<Partition>| {
            p.map_or_else(
                || "none".to_string(),
                |p| format!("{}/{}", p.index, p.count),
            )
        };
        return Err(HandoffError::Mismatch(format!(
            "The consumer's checkpoint was written for another partition (partition: checkpoint \
             {}, this run {}). A partition is part of a consumer's identity: moving a consumer to \
             another partition or partition count would hand some events off twice and others \
             not at all, so no --accept-config-change reason accepts it. Run with the recorded \
             partition, or give each partition of the new layout a new consumer ID (e.g. \
             orders-1-of-4), created before the source is written to",
            share(recorded.partition),
            share(binding.config.partition)
        )));
    }
    let differences = binding.config.differences(&recorded);
    let change = match (differences.is_empty(), binding.accept_change) {
        (true, _) => None,
        (false, None) => {
            return Err(HandoffError::Mismatch(format!(
                "The consumer's checkpoint was written with another stream configuration ({}). \
                 Run with the recorded configuration, use a new consumer_id, or pass \
                 --accept-config-change REASON to continue this consumer with the new one \
                 (records already handed off stay as they are)",
                differences.join("; ")
            )));
        }
        (false, Some(reason)) => Some(doc! {
            "at": binding.now,
            "by": &binding.lease.owner,
            "reason": reason,
            "from": recorded.digest(),
            "to": binding.config.digest(),
            "differences": differences,
        }),
    };
    let run = loaded.runs + 1;
    Ok(Claim {
        seen_revision: loaded.revision,
        set: doc! {
            "owner": &binding.lease.owner,
            "leaseUntil": binding.lease.until(binding.now),
            "config": binding.config.to_document(),
            "configDigest": binding.config.digest(),
            crate::history::RUNS_FIELD: run,
        },
        change,
        run,
        moves: loaded.moves,
    })
}

/// What the baseline advises when a checkpoint belongs to another replica set.
pub const OTHER_DEPLOYMENT_ADVICE: &str = "reconcile from a verified snapshot before reset";

/// Checks that a stored checkpoint belongs to the deployment `pin` names: the same replica set
/// (the baseline's check; `advice` ends its message) or the same sharded cluster, never one of
/// the other kind. A checkpoint naming both kinds, or naming one with something other than text,
/// is malformed.
pub fn check_pin<'a>(stored: &Document, pin: impl Into<Pin<'a>>, advice: &str) -> Result<()> {
    let pin = pin.into();
    let malformed = || {
        HandoffError::MalformedCheckpoint(
            "Checkpoint is malformed (replicaSetId and clusterId name its deployment, as text, \
             one of them); restore a verified checkpoint before retrying"
                .into(),
        )
    };
    let named = |field: &str| match stored.get(field) {
        None => Ok(None),
        Some(Bson::String(id)) => Ok(Some(id.as_str())),
        Some(_) => Err(malformed()),
    };
    let (this, other) = (named(pin.field())?, named(pin.other_field())?);
    match (this, other) {
        (Some(_), Some(_)) => Err(malformed()),
        (Some(id), None) if id == pin.id() => Ok(()),
        (None, Some(_)) => Err(HandoffError::Mismatch(format!(
            "Consumer checkpoint belongs to a {}, and this deployment is a {}: its resume \
                 tokens mean nothing here, and a checkpoint never moves between a replica set and \
                 a sharded cluster. Point MONGODB_URI at the deployment the checkpoint was \
                 written on, or use a new consumer_id",
            pin.other_kind(),
            pin.kind()
        ))),
        _ => Err(HandoffError::Mismatch(format!(
            "Consumer checkpoint belongs to another {}; {advice}",
            pin.kind()
        ))),
    }
}

/// A stored checkpoint's token (none yet: `Ok(None)`) when the checkpoint belongs to the
/// deployment `pin` names; another deployment's is [`check_pin`]'s refusal, its token having no
/// meaning (no lag, no margin) there.
pub fn token_on<'d, 'a>(
    stored: &'d Document,
    pin: impl Into<Pin<'a>>,
) -> Result<Option<&'d Document>> {
    check_pin(stored, pin, OTHER_DEPLOYMENT_ADVICE)?;
    Ok(stored.get_document("token").ok())
}

/// Checks a loaded checkpoint in the baseline's order: source, deployment, shape.
pub fn validate<'a>(
    stored: &Document,
    source: &str,
    pin: impl Into<Pin<'a>>,
) -> Result<Checkpoint> {
    if stored.get_str("source").ok() != Some(source) {
        return Err(HandoffError::Mismatch(
            "Consumer checkpoint belongs to another source; use the original source or a new consumer_id".into(),
        ));
    }
    check_pin(stored, pin, OTHER_DEPLOYMENT_ADVICE)?;
    let malformed = || {
        HandoffError::MalformedCheckpoint(
            "Checkpoint is malformed; restore a verified token before retrying".into(),
        )
    };
    let mode = match stored.get("mode") {
        None => Mode::ResumeAfter,
        Some(Bson::String(name)) => Mode::parse(name).ok_or_else(malformed)?,
        Some(_) => return Err(malformed()),
    };
    let token = match stored.get("token") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(token)) if is_resume_token(token) => Some(token.clone()),
        Some(_) => return Err(malformed()),
    };
    let revision = match stored.get("revision") {
        None => None,
        Some(Bson::Int64(n)) if (0..MAX_REVISION).contains(n) => Some(*n),
        Some(Bson::Int32(n)) if *n >= 0 => Some(i64::from(*n)),
        Some(_) => return Err(malformed()),
    };
    // Bookkeeping, not position: a counter someone set by hand (a double from a shell) or
    // damaged is read as a number where it is one, else started again from 0 (the claim writes
    // it back); it never stops a run.
    let runs = match stored.get(crate::history::RUNS_FIELD) {
        Some(Bson::Int64(n)) if (0..MAX_REVISION - 1).contains(n) => *n,
        Some(Bson::Int32(n)) if *n >= 0 => i64::from(*n),
        Some(Bson::Double(n))
            if n.fract() == 0.0 && (0.0..(MAX_REVISION - 1) as f64).contains(n) =>
        {
            *n as i64
        }
        _ => 0,
    };
    let moves = match stored.get(crate::history::MOVES_FIELD) {
        Some(Bson::Int64(n)) if *n >= 0 => *n,
        Some(Bson::Int32(n)) if *n >= 0 => i64::from(*n),
        _ => 0,
    };
    let holder = match (stored.get("owner"), stored.get("leaseUntil")) {
        (None, None) => None,
        (Some(Bson::String(owner)), Some(Bson::DateTime(until))) => Some(Holder {
            owner: owner.clone(),
            until: *until,
        }),
        _ => return Err(malformed()),
    };
    let config = match stored.get("config") {
        None => None,
        Some(Bson::Document(config)) => Some(StreamConfig::from_document(config).map_err(|e| {
            HandoffError::MalformedCheckpoint(format!(
                "Checkpoint is malformed ({e}); restore a verified checkpoint before retrying"
            ))
        })?),
        Some(_) => return Err(malformed()),
    };
    let policy = match stored.get("policy") {
        None => None,
        Some(Bson::Document(policy)) => {
            Some(PolicyBinding::from_document(policy).ok_or_else(malformed)?)
        }
        Some(_) => return Err(malformed()),
    };
    Ok(Checkpoint {
        token,
        mode,
        revision,
        holder,
        config,
        policy,
        runs,
        moves,
    })
}

/// The longest `_data` accepted (a real token is well under 1 KiB; one naming a large
/// document key can be longer).
const MAX_TOKEN_DATA: usize = 64 << 10;

/// A resume token as MongoDB writes it: `_data`, a non-empty string of hex digits, and optionally
/// `_typeBits` (binary), nothing else.
pub fn is_resume_token(token: &Document) -> bool {
    let data_ok = matches!(token.get("_data"), Some(Bson::String(data))
        if !data.is_empty()
            && data.len() <= MAX_TOKEN_DATA
            && data.bytes().all(|b| b.is_ascii_hexdigit()));
    data_ok
        && token.iter().all(|(key, value)| match key.as_str() {
            "_data" => true,
            "_typeBits" => matches!(value, Bson::Binary(_)),
            _ => false,
        })
}

#[cfg(test)]
mod tests;
