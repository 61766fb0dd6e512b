//! Which policy runs, within which limits, and what shapes the records it decides.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::cli::env;
use handoff::domain::StopSignal;
use handoff::domain::effect::{DefaultEffects, EffectPolicy};
use handoff::domain::text::escape_untrusted;
use handoff::error::{HandoffError, Result};
use handoff::runtime::cache::ArtifactCache;
use handoff::runtime::effects::PolicyEffects;
use handoff::runtime::{Limits, Policy, PolicySource, Runtime};
use handoff::session::OutboxOptions;

/// Which policy runs and within which limits.
#[derive(Args, Clone, Debug)]
pub struct PolicyArgs {
    /// A policy component (.wasm) to run instead of the embedded default.
    #[arg(long, env = env::POLICY)]
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
        parse_params(&self.params)
    }

    pub fn source(&self) -> Result<PolicySource> {
        match &self.policy {
            Some(path) => PolicySource::from_file(path),
            None => Ok(PolicySource::embedded_default()),
        }
    }

    /// The engine and the loaded policy.
    pub fn load(&self) -> Result<(Runtime, Policy)> {
        load_source(&self.source()?, self.no_cache)
    }
}

/// The engine and the policy `source`, through the artifact cache unless `no_cache`.
fn load_source(source: &PolicySource, no_cache: bool) -> Result<(Runtime, Policy)> {
    let cache = if no_cache {
        None
    } else {
        ArtifactCache::default_dir()
    };
    let (runtime, policy) = Runtime::with_policy(cache, source)?;
    tracing::debug!(target: "handoff::startup", "engine ready");
    tracing::debug!(target: "handoff::startup", contract = %policy.contract, "policy loaded");
    Ok((runtime, policy))
}

/// The effects `policy` decides (its `delivery` export), or the default's for a policy without
/// one.
fn effects_of(
    runtime: &Runtime,
    policy: &Policy,
    limits: &Limits,
    stop: &StopSignal,
) -> Result<Box<dyn EffectPolicy>> {
    Ok(
        match PolicyEffects::load(runtime.engine(), policy, limits, stop)? {
            Some(effects) => Box::new(effects),
            None => {
                tracing::warn!(
                    policy = %escape_untrusted(&policy.origin, 200),
                    "the policy does not decide a delivery's effects (built before contract \
                     1.6 or without `delivery`): the default's apply"
                );
                Box::new(DefaultEffects)
            }
        },
    )
}

/// The policy that decides a delivery's effects (contract 1.6), within which limits.
#[derive(Args, Clone, Debug)]
pub struct EffectsArgs {
    /// A policy component (.wasm) whose `delivery` export decides each record's effect and what
    /// a failed attempt is; without one (or for a policy built before contract 1.6), the
    /// default's effects.
    #[arg(long, env = env::POLICY)]
    pub policy: Option<PathBuf>,
    /// Memory the policy may use, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub policy_memory_mib: u32,
    /// Guest compute allowed for one answer, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub policy_slice_ms: u64,
    /// Do not read or write the compiled-artifact cache.
    #[arg(long)]
    pub no_cache: bool,
}

/// Who decides a delivery's effects, loaded.
pub struct Effects {
    /// Kept for its engine's epoch ticker, which bounds the policy's answers.
    _runtime: Option<Runtime>,
    pub decides: Box<dyn EffectPolicy>,
}

impl EffectsArgs {
    /// The policy's effects, or the default's: a policy that cannot be loaded or started is
    /// refused here, before anything is read or delivered.
    pub fn load(&self, stop: &StopSignal) -> Result<Effects> {
        let Some(path) = &self.policy else {
            return Ok(Effects {
                _runtime: None,
                decides: Box::new(DefaultEffects),
            });
        };
        let (runtime, policy) = load_source(&PolicySource::from_file(path)?, self.no_cache)?;
        let limits = Limits {
            memory_bytes: self.policy_memory_mib as usize * (1 << 20),
            slice: Duration::from_millis(self.policy_slice_ms),
            ..Limits::default()
        };
        let decides = effects_of(&runtime, &policy, &limits, stop)?;
        Ok(Effects {
            _runtime: Some(runtime),
            decides,
        })
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
        env = env::OUTBOX_KEEP_EVENT,
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
        // Before anything is read or written, as for a run.
        runtime.check_params(&policy, &params)?;
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
    /// The effects this policy decides for a delivery (its `delivery` export, or the
    /// default's).
    pub fn effects(&self, stop: &StopSignal) -> Result<Box<dyn EffectPolicy>> {
        effects_of(&self.runtime, &self.policy, &self.limits, stop)
    }

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

/// `--policy-param KEY=VALUE`s, each split at its first `=` (a key is never empty).
pub fn parse_params(given: &[String]) -> Result<Vec<(String, String)>> {
    given
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
