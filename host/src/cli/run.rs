//! `handoff run`: the main job against a MongoDB replica set.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;

use super::args::{InputArgs, PolicyArgs};
use crate::backend::mongo::{Connection, MongoSource, MongoStore};
use crate::error::{HandoffError, Result};
use crate::run::Job;

#[derive(Args)]
pub struct RunArgs {
    /// The replica set's connection string (never printed or logged).
    #[arg(long, env = "MONGODB_URI", hide_env_values = true)]
    pub uri: String,
    #[command(flatten)]
    pub inputs: InputArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

pub fn run(args: RunArgs) -> Result<super::Outcome> {
    let started = Instant::now();
    let inputs = args.inputs.validate()?;
    let params = args.policy.params()?;
    // The deployment is reached while the policy loads.
    let (loaded, connected) = std::thread::scope(|scope| {
        let connecting = scope.spawn(|| Connection::connect(&args.uri));
        (args.policy.load(), connecting.join())
    });
    let connection = connected
        .map_err(|_| HandoffError::Internal(anyhow::anyhow!("connecting to MongoDB panicked")))??;
    let limits = args.policy.limits();
    connection.limit_to(started + limits.run_timeout);
    let executed: Result<_> = (|| {
        let (runtime, policy) = loaded?;
        let source = MongoSource::new(connection.clone(), &inputs.database, &inputs.collection);
        let store = MongoStore::new(connection.clone(), &inputs.database, &inputs.collections());
        let job = Job {
            runtime: &runtime,
            policy: &policy,
            inputs: &inputs,
            params,
            limits,
            stop: super::stop_signal()?,
        };
        let summary = job.execute(Box::new(source), Arc::new(store))?;
        Ok((summary, policy))
    })();
    // The stream and the store are dropped with the job; then the connection ends its sessions
    // on the server, whatever the outcome, so no transaction outlives the run.
    connection.close();
    let (summary, policy) = executed?;
    super::emit(&summary, &policy, &inputs, started);
    Ok(super::Outcome::of(&summary))
}
