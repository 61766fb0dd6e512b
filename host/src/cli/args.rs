//! Arguments shared by the commands: the baseline's inputs and the policy's sandbox.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use handoff::error::{HandoffError, Result};
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
        default_value = "kestra_change_checkpoints"
    )]
    pub checkpoint_collection: String,
    /// Collection (table) of the outbox.
    #[arg(
        long,
        env = "OUTBOX_COLLECTION",
        default_value = "kestra_change_outbox"
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
    /// Keep the raw change event (`event`) in outbox records a policy shapes (true or false).
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
            keep_event: self.outbox_keep_event,
        }
    }
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
