//! A run's plan and the run itself: the policy loads while the backends get ready, the deadline
//! is fixed once, the checkpoint is created and checked, then the policy drives the session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backends::Backends;
use super::held::Held;
use super::inputs::Inputs;
use handoff_domain::checkpoint::{self, Binding};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::forecast::{self, Forecast};
use handoff_domain::lease::DEFAULT_LEASE;
use handoff_domain::position::Position;
use handoff_domain::{
    ChangeSource, CheckpointStore, CommitError, Consumer, Lease, StopSignal, StreamConfig,
};

use handoff_runtime::{Limits, Policy, Runtime, Settings};
use handoff_session::{Failed, OutboxOptions, RunSummary, Session};

/// Everything a run is given besides its policy and backends.
#[derive(Clone, Debug)]
pub struct Plan {
    pub inputs: Inputs,
    pub params: Vec<(String, String)>,
    pub limits: Limits,
    /// Raised to end the run after its in-flight commit.
    pub stop: StopSignal,
    /// What the outbox keeps of a policy-shaped record's event.
    pub outbox: OutboxOptions,
    /// The stream's shape and how the run binds its checkpoint.
    pub stream: StreamOptions,
    /// The run follows the stream until it is stopped (`--follow`), and for at most this long
    /// when given (`--max-duration`).
    pub follow: Option<Follow>,
    /// Who watches the run live (`--metrics-listen`).
    pub live: Live,
}

/// Who watches a run live, if anyone (the metrics endpoint).
#[derive(Clone, Default)]
pub struct Live(pub Option<Arc<dyn handoff_session::Observer>>);

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Live(watched)"
        } else {
            "Live(none)"
        })
    }
}

/// How a run that follows the stream ends: a signal, its lease lost, an invalidation, or
/// `max_duration` (a clean end, as a signal's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Follow {
    pub max_duration: Option<Duration>,
}

/// The first contract whose policies can follow the stream (`follows`).
pub const FOLLOW_CONTRACT: handoff_runtime::policy::Version = handoff_runtime::policy::Version {
    major: 1,
    minor: 5,
    patch: 0,
};

/// How long a run that follows the stream without `--max-duration` may last: it ends by a
/// signal, this only keeps every deadline finite.
pub const FOLLOW_FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The stream's shape and how a run binds the checkpoint to it.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamOptions {
    pub config: StreamConfig,
    /// The operator's reason to continue a consumer whose checkpoint records another
    /// configuration.
    pub accept_config_change: Option<String>,
    /// How long the run's lease lasts after each renewal.
    pub lease: Duration,
}

impl Default for StreamOptions {
    /// The baseline's stream, a lease of [`DEFAULT_LEASE`].
    fn default() -> Self {
        StreamOptions {
            config: StreamConfig::default(),
            accept_config_change: None,
            lease: DEFAULT_LEASE,
        }
    }
}

/// A run that ended without failing (a stopped run included: its commits stand).
#[derive(Clone, Debug)]
pub struct Finished {
    pub summary: RunSummary,
    pub policy_sha256: String,
    /// From the start of the command to the end of the run.
    pub duration: Duration,
    /// Where the consumer stands at the end (lag, margin), when the backend can tell.
    pub position: Option<Position>,
    /// When the checkpoint would fall off the oplog, from the run history and the position.
    pub forecast: Option<Forecast>,
}

/// A run that failed: its failure, what it committed before (which stands), and the policy
/// that ran, once it was loaded.
#[derive(Debug)]
pub struct FailedRun {
    pub failed: Box<Failed>,
    pub policy_sha256: Option<String>,
    /// From the start of the command to the failure.
    pub duration: Duration,
    /// Where the consumer stands after the failure (the evidence), when the backend can tell.
    pub position: Option<Box<Position>>,
    /// When the checkpoint would fall off the oplog, as for a finished run.
    pub forecast: Option<Box<Forecast>>,
    /// What the consumer watches, once the inputs were valid.
    pub source: Option<Box<handoff_domain::config::Watched>>,
    /// The consumer's collections, once the inputs were valid.
    pub collections: Option<Box<handoff_domain::Collections>>,
}

impl FailedRun {
    /// A failure before the run could begin (its inputs refused, say): nothing was committed.
    pub fn before_run(error: HandoffError) -> FailedRun {
        FailedRun {
            failed: Box::new(Failed::before_commits(error)),
            policy_sha256: None,
            duration: handoff_runtime::PROCESS_START
                .get()
                .map_or(Duration::ZERO, Instant::elapsed),
            position: None,
            forecast: None,
            source: None,
            collections: None,
        }
    }
}

impl From<HandoffError> for FailedRun {
    fn from(error: HandoffError) -> FailedRun {
        FailedRun::before_run(error)
    }
}

/// The moment a run begins: its deadline, counted from now, which the watchdog then honours.
pub fn begin(limits: &Limits) -> Instant {
    let deadline = Instant::now() + limits.run_timeout;
    super::watchdog::extend(deadline);
    deadline
}

impl Follow {
    /// The deadline of a run that follows the stream: its `max_duration` and the usual run
    /// timeout after it (for its last commit), or practically none. `--max-duration` itself
    /// stops the run cleanly through `stop`.
    fn begin(&self, limits: &Limits, stop: &StopSignal) -> Instant {
        let now = Instant::now();
        let deadline = match self.max_duration {
            Some(duration) => {
                let stop = stop.clone();
                let spawned = std::thread::Builder::new()
                    .name("max-duration".into())
                    .spawn(move || {
                        std::thread::sleep(duration);
                        tracing::info!(
                            "--max-duration reached; the run ends after its last commit"
                        );
                        stop.request();
                    });
                if let Err(error) = spawned {
                    tracing::warn!(%error, "the --max-duration timer could not start");
                }
                now + duration + limits.run_timeout
            }
            None => now + FOLLOW_FOREVER,
        };
        super::watchdog::extend(deadline);
        deadline
    }
}

impl Plan {
    /// The settings the policy receives.
    pub fn settings(&self) -> Settings {
        Settings {
            max_events: self.inputs.max_events,
            max_wait_ms: u64::from(self.inputs.max_wait_seconds) * 1000,
            params: self.params.clone(),
        }
    }

    /// Runs once: `load` (the engine and the policy) while `backends` get ready, then the
    /// policy over the backends' source and store. The backends are closed whatever the outcome.
    pub fn run(
        &self,
        load: impl FnOnce() -> Result<(Runtime, Policy)>,
        backends: &mut dyn Backends,
    ) -> Result<Finished, FailedRun> {
        let started = handoff_runtime::PROCESS_START
            .get()
            .copied()
            .unwrap_or_else(Instant::now);
        let (loaded, prepared) = std::thread::scope(|scope| {
            let preparing = scope.spawn(|| backends.prepare());
            (load(), preparing.join())
        });
        let mut policy_sha256 = None;
        let mut held = None;
        let executed = (|| -> Result<(RunSummary, String), Failed> {
            prepared.map_err(|_| {
                HandoffError::Internal(anyhow::anyhow!("preparing the backends panicked"))
            })??;
            let (runtime, policy) = loaded?;
            policy_sha256 = Some(policy.sha256.clone());
            // Before the backends open: a refused parameter leaves no state behind.
            runtime.check_params(&policy, &self.params)?;
            if self.follow.is_some() && policy.contract < FOLLOW_CONTRACT {
                return Err(HandoffError::BadInput(format!(
                    "--follow needs a policy built against contract {FOLLOW_CONTRACT} or later; \
                     this one was built against {}: rebuild it on a current SDK, or run without \
                     --follow",
                    policy.contract
                ))
                .into());
            }
            let deadline = match &self.follow {
                Some(follow) => follow.begin(&self.limits, &self.stop),
                None => begin(&self.limits),
            };
            let (source, store) = backends.open(deadline)?;
            let summary =
                self.execute_holding(&runtime, &policy, source, store, deadline, &mut held)?;
            Ok((summary, policy.sha256.clone()))
        })();
        // The figures are read unless the deployment could not be reached or refused us: then
        // reading them would only wait.
        let position = match &executed {
            Err(failed)
                if matches!(
                    failed.error,
                    HandoffError::Unavailable(_)
                        | HandoffError::Authentication(_)
                        | HandoffError::BadInput(_)
                ) =>
            {
                None
            }
            _ => backends.position(&self.inputs.consumer_id),
        };
        let record = held.as_ref().map(|held| {
            held.record(
                executed.as_ref().map(|(summary, _)| summary),
                position.as_ref(),
            )
        });
        // The forecast counts this run too: the next gap starts now.
        let forecast = position.as_ref().map(|p| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let mut history = backends.history().to_vec();
            history.extend(record.clone());
            forecast::forecast(&history, p, now)
        });
        // The lease is given back once the figures are read, with the run's record.
        if let Some(held) = held {
            held.release(record.as_ref());
        }
        backends.close();
        // The run's duration includes closing its backends.
        let duration = started.elapsed();
        match executed {
            Ok((summary, policy_sha256)) => Ok(Finished {
                summary,
                policy_sha256,
                duration,
                position,
                forecast,
            }),
            Err(failed) => Err(FailedRun {
                failed: Box::new(failed),
                policy_sha256,
                duration,
                position: position.map(Box::new),
                forecast: forecast.map(Box::new),
                source: Some(Box::new(handoff_domain::config::Watched {
                    scope: self.stream.config.scope,
                    database: self.inputs.database.clone(),
                    collection: self.inputs.collection.clone(),
                })),
                collections: Some(Box::new(self.inputs.collections())),
            }),
        }
    }

    /// Runs the policy once against `source` and `store`, until `deadline` at the latest, and
    /// gives the lease back.
    pub fn execute(
        &self,
        runtime: &Runtime,
        policy: &Policy,
        source: Box<dyn ChangeSource>,
        store: Arc<dyn CheckpointStore>,
        deadline: Instant,
    ) -> Result<RunSummary, Failed> {
        let mut held = None;
        let ran = self.execute_holding(runtime, policy, source, store, deadline, &mut held);
        if let Some(held) = held {
            held.release(None);
        }
        ran
    }

    /// As [`Plan::execute`], leaving the lease held in `held` once claimed.
    fn execute_holding(
        &self,
        runtime: &Runtime,
        policy: &Policy,
        mut source: Box<dyn ChangeSource>,
        store: Arc<dyn CheckpointStore>,
        deadline: Instant,
        held: &mut Option<Held>,
    ) -> Result<RunSummary, Failed> {
        let started = Instant::now();
        let started_at = bson::DateTime::now();
        let deployment = source.deployment()?;
        let config = &self.stream.config;
        let consumer = Consumer {
            consumer: self.inputs.consumer_id.clone(),
            source: config.source(&self.inputs.database, &self.inputs.collection),
        };
        let store_failure = |e: CommitError| match e {
            CommitError::Unavailable(m) => HandoffError::Unavailable(m),
            CommitError::Unauthorized(m) => HandoffError::unauthorized(&m),
            other => HandoffError::Unavailable(other.to_string()),
        };
        let stored = store
            .ensure_checkpoint(
                &consumer.consumer,
                checkpoint::initial_bound(
                    &consumer.consumer,
                    &consumer.source,
                    deployment.pin(),
                    config,
                ),
            )
            .map_err(store_failure)?;
        let loaded = checkpoint::validate(&stored, &consumer.source, deployment.pin())?;
        let lease = Lease::new(self.stream.lease);
        let claim = checkpoint::claim(
            &loaded,
            &Binding {
                config,
                accept_change: self.stream.accept_config_change.as_deref(),
                lease: &lease,
                now: bson::DateTime::now(),
            },
        )?;
        store
            .claim(&consumer.consumer, &claim)
            .map_err(|e| match e {
                CommitError::Conflict => HandoffError::Conflict(
                    "Another run took this consumer's checkpoint while this one started; retry \
                     from the current token"
                        .into(),
                ),
                other => store_failure(other),
            })?;
        if let Some(change) = &claim.change {
            tracing::warn!(
                consumer = %consumer.consumer,
                from = change.get_str("from").unwrap_or_default(),
                to = change.get_str("to").unwrap_or_default(),
                "stream configuration change accepted and recorded"
            );
        }
        tracing::info!(
            consumer = %consumer.consumer,
            source = %consumer.source,
            policy_sha256 = %policy.sha256,
            config_digest = %config.digest(),
            resume = loaded.token.as_ref().map_or("now", |_| loaded.mode.as_str()),
            "run starting"
        );
        let name = consumer.consumer.clone();
        let watched = consumer.source.clone();
        let session = Session::new(
            consumer,
            deployment,
            loaded,
            source,
            store.clone(),
            deadline,
        )
        .with_stop(self.stop.clone())
        .with_max_events(self.inputs.max_events)
        .with_follow(self.follow.is_some())
        .with_observer(self.live.0.clone())
        .with_outbox_options(self.outbox)
        .with_split_events(config.split_large_events)
        .with_lease(lease.clone())
        .with_policy(checkpoint::PolicyBinding::new(&policy.sha256, &self.params));
        *held = Some(Held {
            store: store.clone(),
            consumer: name,
            source: watched,
            owner: lease.owner.clone(),
            run: claim.run,
            moves: claim.moves,
            started_at,
            follow: self.follow.is_some(),
        });
        let summary = runtime.run(policy, session, &self.settings(), &self.limits)?;
        tracing::info!(
            status = summary.status.as_str(),
            events_handed_off = summary.committed.handed_off,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "run finished"
        );
        Ok(summary)
    }
}
