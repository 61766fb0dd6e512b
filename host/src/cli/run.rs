//! `handoff run`: the main job against a MongoDB replica set.

use clap::Args;

use super::args::{InputArgs, PolicyArgs, StreamArgs};
use crate::cli::env;
use handoff::error::Result;
use handoff::run::Plan;
use handoff::run::backends::Mongo;

#[derive(Args)]
#[command(after_help = concat!(
    "Example:\n",
    "  MONGODB_URI='mongodb://db1,db2,db3/?replicaSet=rs0' handoff run \\\n",
    "      --database shop --collection orders --consumer-id orders-to-outbox \\\n",
    "      --log-format kestra --outputs-file outputs.json\n\n",
    "Outputs (stdout, and --outputs-file): status, events_handed_off, last_event_id, consumer_id,\n",
    "events_skipped, events_quarantined, duplicates_suppressed, policy_sha256; on failure status\n",
    "FAILED with error_class, exit_code and guidance. A record already stored for the same event\n",
    "(a checkpoint moved back) is not written again and counts in duplicates_suppressed.\n\n",
    exit_codes!(),
))]
pub struct RunArgs {
    /// The replica set's connection string (never printed or logged).
    #[arg(long, env = env::MONGODB_URI, hide_env_values = true)]
    pub uri: String,
    #[command(flatten)]
    pub inputs: InputArgs,
    #[command(flatten)]
    pub stream: StreamArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub output: super::OutputArgs,
}

pub fn run(args: RunArgs) -> Result<super::Outcome> {
    super::run_reported(&args.output, &args.inputs.consumer.consumer_id, || {
        let plan = Plan {
            inputs: args.inputs.validate()?,
            params: args.policy.params()?,
            limits: args.policy.limits(),
            stop: super::stop_signal()?,
            outbox: args.inputs.outbox(),
            stream: args.stream.options()?,
        };
        // The deployment is reached while the policy loads.
        let mut backends = Mongo::new(&args.uri, &plan.inputs, &plan.stream.config);
        plan.run(|| args.policy.load(), &mut backends)
    })
}
