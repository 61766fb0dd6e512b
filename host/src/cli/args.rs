//! Arguments shared by the commands: the baseline's inputs and the policy's sandbox.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use handoff::domain::StreamConfig;
use handoff::domain::config::{
    BeforeChange, FullDocument, MAX_PIPELINE_BYTES, Partition, Scope, Watched,
    check_keeps_namespace, parse_pipeline,
};
use handoff::error::{HandoffError, Result};
use handoff::run::StreamOptions;
use handoff::run::inputs::{Inputs, RawInputs};
use handoff::runtime::cache::ArtifactCache;
use handoff::runtime::{Limits, Policy, PolicySource, Runtime};
use handoff::session::OutboxOptions;

/// Where a consumer's state lives, from flags or the baseline's environment variables.
#[derive(Args, Clone, Debug)]
pub struct ConsumerArgs {
    /// Stable consumer identity.
    #[arg(long, env = "CONSUMER_ID", default_value = "orders-to-outbox")]
    pub consumer_id: String,
    /// Collection (table) of the checkpoint.
    #[arg(
        long,
        env = "CHECKPOINT_COLLECTION",
        default_value = handoff::domain::deployment::DEFAULT_CHECKPOINTS
    )]
    pub checkpoint_collection: String,
    /// Collection (table) of the outbox.
    #[arg(
        long,
        env = "OUTBOX_COLLECTION",
        default_value = handoff::domain::deployment::DEFAULT_OUTBOX
    )]
    pub outbox_collection: String,
    /// Collection (table) of quarantined events (policies that refuse poison events write there).
    #[arg(
        long,
        env = "QUARANTINE_COLLECTION",
        default_value = "kestra_change_quarantine"
    )]
    pub quarantine_collection: String,
}

/// The baseline task's inputs, from flags or its environment variables (defaults: the flow's).
#[derive(Args, Clone, Debug)]
pub struct InputArgs {
    /// Database of the watched collection and of the checkpoint and outbox collections.
    #[arg(long, env = "SOURCE_DATABASE", default_value = "change_demo")]
    pub database: String,
    /// The watched collection.
    #[arg(long, env = "SOURCE_COLLECTION", default_value = "orders")]
    pub collection: String,
    #[command(flatten)]
    pub consumer: ConsumerArgs,
    /// Events per run, 1-500.
    #[arg(long, env = "MAX_EVENTS", default_value = "50")]
    pub max_events: String,
    /// Idle seconds before the run ends, 1-30.
    #[arg(long, env = "MAX_WAIT_SECONDS", default_value = "10")]
    pub max_wait_seconds: String,
    #[command(flatten)]
    pub keep: KeepEventArgs,
    /// Write an outbox record for each invalidation of the stream (its `_id` the invalidate
    /// event's ID, `marker: "invalidate"`), so that readers see where the stream restarted.
    #[arg(
        long,
        env = "INVALIDATE_MARKER",
        default_value = "false",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub invalidate_marker: bool,
}

impl InputArgs {
    pub fn validate(&self) -> Result<Inputs> {
        RawInputs {
            database: self.database.clone(),
            collection: self.collection.clone(),
            consumer_id: self.consumer.consumer_id.clone(),
            checkpoint_collection: self.consumer.checkpoint_collection.clone(),
            outbox_collection: self.consumer.outbox_collection.clone(),
            quarantine_collection: self.consumer.quarantine_collection.clone(),
            max_events: self.max_events.clone(),
            max_wait_seconds: self.max_wait_seconds.clone(),
        }
        .validate()
    }

    pub fn outbox(&self) -> OutboxOptions {
        OutboxOptions {
            keep_event: self.keep.outbox_keep_event,
            invalidate_marker: self.invalidate_marker,
        }
    }
}

/// The change stream's shape and how a run binds its consumer's checkpoint.
#[derive(Args, Clone, Debug)]
pub struct StreamArgs {
    /// What the stream watches: collection (the baseline), database, or deployment. A database
    /// or deployment stream leaves out handoff's state collections, every consumer's, and its
    /// pipeline must keep each event's namespace (ns).
    #[arg(
        long,
        env = "STREAM_SCOPE",
        default_value = "collection",
        value_name = "SCOPE"
    )]
    pub scope: String,
    /// Stages run on the change stream: a JSON file (or, starting with `[`, the JSON itself) holding
    /// an array of $match, $project, $addFields, $set, $unset, $replaceRoot, $replaceWith or
    /// $redact stages, in Extended JSON. A pipeline that changes `_id` or `operationType` is
    /// refused.
    #[arg(long, env = "PIPELINE", value_name = "FILE.json")]
    pub pipeline: Option<String>,
    /// fullDocument: updateLookup (the baseline), default, whenAvailable or required (the last
    /// two read post-images: enable changeStreamPreAndPostImages on the collection).
    #[arg(
        long,
        env = "FULL_DOCUMENT",
        default_value = "updateLookup",
        value_name = "MODE"
    )]
    pub full_document: String,
    /// fullDocumentBeforeChange: off, whenAvailable or required (pre-images: enable
    /// changeStreamPreAndPostImages on the collection).
    #[arg(
        long,
        env = "FULL_DOCUMENT_BEFORE_CHANGE",
        default_value = "off",
        value_name = "MODE"
    )]
    pub full_document_before_change: String,
    /// This run's share of the source, `I/N` (0 <= I < N <= 1024): N runs with their own
    /// consumer IDs and I = 0..N-1 hand off every event exactly once between them, all events
    /// of one document key by the same run, in order. A consumer keeps its partition for good.
    #[arg(long, env = "PARTITION", value_name = "I/N")]
    pub partition: Option<String>,
    /// Receive events over 16 MiB as fragments ($changeStreamSplitLargeEvent, MongoDB 7.0 and
    /// 6.0.9+): the fragments of one event reach the policy as one event and are committed
    /// together, one outbox record each.
    #[arg(
        long,
        env = "SPLIT_LARGE_EVENTS",
        default_value = "false",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub split_large_events: bool,
    /// Continue a consumer whose checkpoint records another stream configuration; the change,
    /// with this reason, is recorded on the checkpoint. Another partition is never accepted.
    #[arg(long, env = "ACCEPT_CONFIG_CHANGE", value_name = "REASON")]
    pub accept_config_change: Option<String>,
    /// How long the run's lease on its consumer lasts after each commit renews it, in seconds: a
    /// second run on the consumer stops at its start while the lease holds.
    #[arg(long, env = "LEASE_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..=86_400))]
    pub lease_seconds: u64,
}

/// The longest reason `--accept-config-change` takes.
const MAX_REASON: usize = 500;

/// An operator's reason (kept in the checkpoint or an audit record): 1-500 printable
/// characters, trimmed. Control characters, line and paragraph separators, zero-width
/// characters and bidirectional controls are refused: the record must read as it was written.
pub fn reason_text(flag: &str, reason: &str) -> Result<String> {
    let reason = reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON {
        return Err(HandoffError::BadInput(format!(
            "{flag} needs a reason of 1-{MAX_REASON} printable characters"
        )));
    }
    if let Some(c) = reason
        .chars()
        .find(|c| handoff::domain::text::needs_escape(*c))
    {
        return Err(HandoffError::BadInput(format!(
            "{flag} holds the character U+{:04X}: a reason takes no control, line or paragraph \
             separator, zero-width or bidirectional-control characters",
            c as u32
        )));
    }
    Ok(reason.to_string())
}

impl StreamArgs {
    /// The stream options, checked: nothing is read or written before they are.
    pub fn options(&self) -> Result<StreamOptions> {
        let bad = |what: &str, value: &str, allowed: &str| {
            HandoffError::BadInput(format!(
                "{what} {:?} is not one of {allowed}",
                handoff::domain::text::escape_untrusted(value, 40)
            ))
        };
        let scope = Scope::parse(&self.scope)
            .ok_or_else(|| bad("--scope", &self.scope, "collection, database, deployment"))?;
        let full_document = FullDocument::parse(&self.full_document).ok_or_else(|| {
            bad(
                "--full-document",
                &self.full_document,
                "updateLookup, default, whenAvailable, required",
            )
        })?;
        let before_change =
            BeforeChange::parse(&self.full_document_before_change).ok_or_else(|| {
                bad(
                    "--full-document-before-change",
                    &self.full_document_before_change,
                    "off, whenAvailable, required",
                )
            })?;
        let pipeline = match &self.pipeline {
            None => Vec::new(),
            Some(given) => {
                let text = if given.trim_start().starts_with('[') {
                    given.clone()
                } else {
                    read_pipeline(std::path::Path::new(given))?
                };
                parse_pipeline(&text)
                    .map_err(|why| HandoffError::BadInput(format!("--pipeline: {why}")))?
            }
        };
        if scope != Scope::Collection {
            check_keeps_namespace(&pipeline).map_err(|why| {
                HandoffError::BadInput(format!("--pipeline (--scope {}): {why}", scope.as_str()))
            })?;
        }
        let accept_config_change = match &self.accept_config_change {
            None => None,
            Some(reason) => Some(reason_text("--accept-config-change", reason)?),
        };
        let partition = match &self.partition {
            None => None,
            Some(text) => Partition::parse(text)
                .map_err(|why| HandoffError::BadInput(format!("--partition: {why}")))?,
        };
        Ok(StreamOptions {
            config: StreamConfig {
                scope,
                full_document,
                before_change,
                pipeline,
                partition,
                split_large_events: self.split_large_events,
            },
            accept_config_change,
            lease: Duration::from_secs(self.lease_seconds),
        })
    }
}

/// A pipeline file's text, read no further than the longest pipeline accepted.
fn read_pipeline(path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    let unreadable = |e: std::io::Error| {
        HandoffError::BadInput(format!("--pipeline: cannot read {}: {e}", path.display()))
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut text = String::new();
    file.take(MAX_PIPELINE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(unreadable)?;
    Ok(text)
}

/// Which policy runs and within which limits.
#[derive(Args, Clone, Debug)]
pub struct PolicyArgs {
    /// A policy component (.wasm) to run instead of the embedded default.
    #[arg(long, env = "HANDOFF_POLICY")]
    pub policy: Option<PathBuf>,
    /// A policy parameter, `key=value` (repeatable).
    #[arg(long = "policy-param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// Memory the policy may use, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub policy_memory_mib: u32,
    /// Guest compute allowed between two host calls, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub policy_slice_ms: u64,
    /// Wall time allowed for the whole run, in seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub run_timeout_seconds: u64,
    /// Do not read or write the compiled-artifact cache.
    #[arg(long)]
    pub no_cache: bool,
    /// How long past the run deadline the watchdog waits before it ends the process (exit 14),
    /// in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub watchdog_grace_seconds: u64,
}

impl PolicyArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            memory_bytes: self.policy_memory_mib as usize * (1 << 20),
            slice: Duration::from_millis(self.policy_slice_ms),
            run_timeout: Duration::from_secs(self.run_timeout_seconds),
        }
    }

    /// Arms the watchdog from process start: the run deadline plus the grace period, which also
    /// bounds the policy's compilation.
    pub fn arm_watchdog(&self) {
        let start = handoff::runtime::PROCESS_START
            .get()
            .copied()
            .unwrap_or_else(std::time::Instant::now);
        handoff::run::watchdog::arm(
            start + Duration::from_secs(self.run_timeout_seconds),
            Duration::from_secs(self.watchdog_grace_seconds),
        );
    }

    pub fn params(&self) -> Result<Vec<(String, String)>> {
        self.params
            .iter()
            .map(|p| {
                p.split_once('=')
                    .filter(|(k, _)| !k.is_empty())
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| {
                        HandoffError::BadInput(format!("--policy-param {p:?} must be KEY=VALUE"))
                    })
            })
            .collect()
    }

    pub fn source(&self) -> Result<PolicySource> {
        match &self.policy {
            Some(path) => PolicySource::from_file(path),
            None => Ok(PolicySource::embedded_default()),
        }
    }

    /// The engine and the loaded policy.
    pub fn load(&self) -> Result<(Runtime, Policy)> {
        let source = self.source()?;
        let cache = if self.no_cache {
            None
        } else {
            ArtifactCache::default_dir()
        };
        let (runtime, policy) = Runtime::with_policy(cache, &source)?;
        tracing::debug!(target: "handoff::startup", "engine ready");
        tracing::debug!(target: "handoff::startup", contract = %policy.contract, "policy loaded");
        Ok((runtime, policy))
    }
}

/// The consumer's policy, for the commands that hand it documents (`backfill`, `reconcile`): the
/// same policy, parameters and limits as the consumer's runs.
#[derive(Args, Clone, Debug)]
pub struct DecidingArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub keep: KeepEventArgs,
}

/// What outbox records a policy shapes keep of their event: the same for a run's changes and a
/// snapshot run's documents.
#[derive(Args, Clone, Debug)]
pub struct KeepEventArgs {
    /// Keep the raw event (`event`) in outbox records a policy shapes (true or false).
    #[arg(
        long,
        env = "OUTBOX_KEEP_EVENT",
        default_value = "true",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        action = clap::ArgAction::Set
    )]
    pub outbox_keep_event: bool,
}

/// The consumer's policy, loaded and checked for snapshot runs, with its parameters.
pub struct Deciding {
    pub runtime: Runtime,
    pub policy: Policy,
    pub params: Vec<(String, String)>,
    pub limits: Limits,
    pub outbox: OutboxOptions,
}

impl DecidingArgs {
    /// Loads the policy before anything is read: a policy that cannot decide snapshot documents
    /// is refused here.
    pub fn load(&self, command: &str) -> Result<Deciding> {
        let params = self.policy.params()?;
        let (runtime, policy) = self.policy.load()?;
        handoff::run::snapshot::Snapshots::check_contract(&policy, command)?;
        Ok(Deciding {
            runtime,
            policy,
            params,
            limits: self.policy.limits(),
            outbox: OutboxOptions {
                keep_event: self.keep.outbox_keep_event,
                invalidate_marker: false,
            },
        })
    }
}

impl Deciding {
    /// The snapshot runs of one consumer of `database.collection` on `deployment`.
    pub fn snapshots(
        &self,
        kind: handoff::session::RunKind,
        consumer: &str,
        database: &str,
        collection: &str,
        deployment: &handoff::domain::Deployment,
    ) -> handoff::run::snapshot::Snapshots<'_> {
        handoff::run::snapshot::Snapshots {
            runtime: &self.runtime,
            policy: &self.policy,
            params: self.params.clone(),
            limits: self.limits.clone(),
            outbox: self.outbox,
            consumer: handoff::domain::Consumer {
                consumer: consumer.to_string(),
                source: format!("{database}.{collection}"),
            },
            deployment: deployment.clone(),
            kind,
            database: database.to_string(),
            collection: collection.to_string(),
        }
    }
}

/// The consumer an operator command looks at: the deployment, the watched collection and the
/// consumer's collections, from the same flags and environment variables as `run`.
#[derive(Args, Clone, Debug)]
pub struct TargetArgs {
    /// The replica set's connection string (never printed or logged).
    #[arg(long, env = "MONGODB_URI", hide_env_values = true)]
    pub uri: String,
    /// Database of the watched collection and of the consumer's collections.
    #[arg(long, env = "SOURCE_DATABASE", default_value = "change_demo")]
    pub database: String,
    /// The watched collection.
    #[arg(long, env = "SOURCE_COLLECTION", default_value = "orders")]
    pub collection: String,
    /// What the consumer's stream watches, as `run --scope` says: collection, database (every
    /// collection of --database) or deployment (--database then only holds the consumer's state).
    #[arg(
        long,
        env = "STREAM_SCOPE",
        default_value = "collection",
        value_name = "SCOPE"
    )]
    pub scope: String,
    #[command(flatten)]
    pub consumer: ConsumerArgs,
}

/// Where acting commands record what they did.
#[derive(Args, Clone, Debug)]
pub struct AuditArgs {
    /// Collection of the audit records (who changed what, from what, to what, why).
    #[arg(
        long,
        env = "AUDIT_COLLECTION",
        default_value = handoff::operate::audit::DEFAULT_COLLECTION
    )]
    pub audit_collection: String,
}

/// How a reading command prints: a human view, or one JSON document for machines.
#[derive(Args, Clone, Debug)]
pub struct ViewArgs {
    /// Print one JSON document on stdout instead of the human view.
    #[arg(long)]
    pub json: bool,
}

impl TargetArgs {
    /// `--scope`, checked.
    pub fn scope(&self) -> Result<Scope> {
        Scope::parse(&self.scope).ok_or_else(|| {
            HandoffError::BadInput(format!(
                "--scope {:?} is not one of collection, database, deployment",
                handoff::domain::text::escape_untrusted(&self.scope, 40)
            ))
        })
    }

    /// Refuses a consumer of a database or deployment for a command that compares or copies
    /// one collection's documents (`what`), naming the commands that serve such a consumer.
    pub fn one_collection(&self, what: &str) -> Result<()> {
        let scope = self.scope()?;
        if scope == Scope::Collection {
            return Ok(());
        }
        let inputs = self.inputs()?;
        let flags = handoff::output::target_flags(
            &inputs.consumer_id,
            Some(&Watched {
                scope,
                database: inputs.database.clone(),
                collection: inputs.collection.clone(),
            }),
            Some(&inputs.collections()),
        );
        Err(HandoffError::BadInput(format!(
            "{what} compares or copies the documents of one collection, and this consumer streams \
             a whole {} (--scope {}): no one collection's documents describe its outbox. Look at \
             it with `handoff status {flags}`; to hand off a stretch of history again, move its \
             checkpoint back with `handoff checkpoint reset {flags} --to-time <time> --reason \
             '<why>'`",
            scope.as_str(),
            scope.as_str(),
        )))
    }

    /// The names checked as `run` checks them (nothing is read before they pass).
    pub fn inputs(&self) -> Result<Inputs> {
        RawInputs {
            database: self.database.clone(),
            collection: self.collection.clone(),
            consumer_id: self.consumer.consumer_id.clone(),
            checkpoint_collection: self.consumer.checkpoint_collection.clone(),
            outbox_collection: self.consumer.outbox_collection.clone(),
            quarantine_collection: self.consumer.quarantine_collection.clone(),
            max_events: "1".into(),
            max_wait_seconds: "1".into(),
        }
        .validate()
    }
}

impl AuditArgs {
    /// The audit collection's name, checked like the others and distinct from them.
    pub fn collection(&self, inputs: &Inputs) -> Result<String> {
        let name = &self.audit_collection;
        if !handoff::run::inputs::valid_name(name) {
            return Err(HandoffError::BadInput(
                "AUDIT_COLLECTION must contain 1-63 letters, digits, underscores or hyphens and start with a letter"
                    .into(),
            ));
        }
        if [
            &inputs.collection,
            &inputs.checkpoint_collection,
            &inputs.outbox_collection,
            &inputs.quarantine_collection,
        ]
        .contains(&name)
        {
            return Err(HandoffError::BadInput(
                "The audit collection must be distinct from the source, checkpoint, outbox and quarantine collections"
                    .into(),
            ));
        }
        Ok(name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_printable_text_that_reads_as_written() {
        assert_eq!(
            reason_text("--reason", "  history lost, INC-42 é ").unwrap(),
            "history lost, INC-42 é"
        );
        for hidden in [
            "a\u{202e}b",
            "a\u{2066}b\u{2069}",
            "a\u{200b}b",
            "a\u{200f}b",
            "a\u{feff}b",
            "a\u{2060}b",
            "a\u{2028}b",
            "a\u{2029}b",
            "a\u{85}b",
            "a\u{1b}[2Kb",
            "a\nb",
            "a\tb",
        ] {
            let error = reason_text("--reason", hidden).unwrap_err().to_string();
            assert!(
                error.starts_with("--reason holds the character U+"),
                "{error}"
            );
            // The message names the character; it does not carry it.
            assert!(
                !error.chars().any(handoff::domain::text::needs_escape),
                "{error:?}"
            );
        }
        for empty_or_long in [" ", &"x".repeat(MAX_REASON + 1)] {
            assert!(reason_text("--reason", empty_or_long).is_err());
        }
    }
}
