//! `handoff replay FIXTURE --state PATH`: one bounded run over a recorded change stream.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use super::args::{InputArgs, PolicyArgs};
use crate::backend::redb_store::RedbStore;
use crate::backend::replay::ReplaySource;
use crate::error::{HandoffError, Result};
use crate::fixture::Fixture;
use crate::run::Job;

#[derive(Args)]
pub struct ReplayArgs {
    /// The recorded change stream (JSON Lines of Extended JSON).
    pub fixture: PathBuf,
    /// The embedded state store holding the checkpoint and outbox (created if missing).
    #[arg(long)]
    pub state: PathBuf,
    /// How long to wait for another run holding the state store, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub state_lock_timeout_ms: u64,
    #[command(flatten)]
    pub inputs: InputArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

pub fn run(args: ReplayArgs) -> Result<super::Outcome> {
    let started = Instant::now();
    let inputs = args.inputs.validate()?;
    let params = args.policy.params()?;
    let fixture = Fixture::read(&args.fixture)?;
    if let Some(recorded) = &fixture.deployment
        && recorded.source != inputs.source()
    {
        return Err(HandoffError::BadInput(format!(
            "the fixture was recorded from {} but the inputs watch {}",
            recorded.source,
            inputs.source()
        )));
    }
    let collections = inputs.collections();
    let open_store = || {
        RedbStore::open(
            &args.state,
            &collections,
            Duration::from_millis(args.state_lock_timeout_ms),
        )
    };
    // An existing store is opened while the policy loads; a new one is created only once the
    // policy is known to be usable, so that a refused policy leaves nothing behind.
    let (loaded, opened) = std::thread::scope(|scope| {
        let opening = args.state.exists().then(|| scope.spawn(open_store));
        (args.policy.load(), opening.map(|handle| handle.join()))
    });
    let (runtime, policy) = loaded?;
    let store = match opened {
        Some(Ok(store)) => store?,
        Some(Err(_)) => {
            return Err(HandoffError::Internal(anyhow::anyhow!(
                "opening the state store panicked"
            )));
        }
        None => {
            if let Some(parent) = args.state.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| {
                    HandoffError::BadInput(format!(
                        "cannot create the folder of the state store {}: {e}",
                        parent.display()
                    ))
                })?;
            }
            open_store()?
        }
    };
    let job = Job {
        runtime: &runtime,
        policy: &policy,
        inputs: &inputs,
        params,
        limits: args.policy.limits(),
        stop: super::stop_signal()?,
    };
    let summary = job.execute(
        Box::new(ReplaySource::new(Arc::new(fixture))),
        Arc::new(store),
    )?;
    super::emit(&summary, &policy, &inputs, started);
    Ok(super::Outcome::of(&summary))
}
