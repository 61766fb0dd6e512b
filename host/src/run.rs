//! One run, end to end: the deployment's identity, the checkpoint created and checked, then the
//! policy driving the session. Backend-agnostic: the CLI picks the source and the store.

use std::sync::Arc;
use std::time::Instant;

use crate::backend::{ChangeSource, CheckpointStore, CommitError, Consumer};
use crate::checkpoint;
use crate::error::{HandoffError, Result};
use crate::inputs::Inputs;
use crate::runtime::session::{Session, Summary};
use crate::runtime::{Limits, Policy, Runtime, Sandbox, Settings, StopSignal};

/// Everything a run needs besides its backends.
pub struct Job<'a> {
    pub runtime: &'a Runtime,
    pub policy: &'a Policy,
    pub inputs: &'a Inputs,
    pub params: Vec<(String, String)>,
    pub limits: Limits,
    /// Raised to end the run after its in-flight commit.
    pub stop: StopSignal,
}

impl Job<'_> {
    pub fn settings(&self) -> Settings {
        Settings {
            max_events: self.inputs.max_events,
            max_wait_ms: u64::from(self.inputs.max_wait_seconds) * 1000,
            params: self.params.clone(),
        }
    }

    /// Runs the policy once against `source` and `store`.
    pub fn execute(
        &self,
        mut source: Box<dyn ChangeSource>,
        store: Arc<dyn CheckpointStore>,
    ) -> Result<Summary> {
        let started = Instant::now();
        crate::runtime::watchdog::extend(started + self.limits.run_timeout);
        let sandbox = Sandbox {
            virtual_time: source.virtual_time(),
            stop: self.stop.clone(),
        };
        let deployment = source.deployment()?;
        let consumer = Consumer {
            consumer: self.inputs.consumer_id.clone(),
            source: self.inputs.source(),
        };
        let stored = store
            .ensure_checkpoint(
                &consumer.consumer,
                checkpoint::initial(
                    &consumer.consumer,
                    &consumer.source,
                    &deployment.replica_set_id,
                ),
            )
            .map_err(|e| match e {
                CommitError::Unavailable(m) => HandoffError::Unavailable(m),
                other => HandoffError::Unavailable(other.to_string()),
            })?;
        let loaded = checkpoint::validate(&stored, &consumer.source, &deployment.replica_set_id)?;
        tracing::info!(
            consumer = %consumer.consumer,
            source = %consumer.source,
            policy_sha256 = %self.policy.sha256,
            resume = loaded.token.as_ref().map_or("now", |_| loaded.mode.as_str()),
            "run starting"
        );
        let session = Session::new(
            consumer,
            deployment,
            loaded,
            source,
            store,
            Some(started + self.limits.run_timeout),
        )
        .with_stop(self.stop.clone())
        .with_max_events(self.inputs.max_events);
        let summary = self.runtime.run_in(
            self.policy,
            session,
            &self.settings(),
            &self.limits,
            &sandbox,
        )?;
        tracing::info!(
            status = summary.status.as_str(),
            events_handed_off = summary.committed.handed_off,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "run finished"
        );
        Ok(summary)
    }
}
