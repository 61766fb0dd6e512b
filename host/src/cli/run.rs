//! `handoff run`: the main job against a MongoDB replica set.

use clap::Args;

use super::args::{InputArgs, PolicyArgs, StreamArgs};
use crate::cli::env;
use handoff::error::Result;
use handoff::run::Plan;
use handoff::run::backends::Mongo;
use handoff::run::plan::Follow;

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
    /// Follow the stream: commit events as they arrive and keep going; the run ends on
    /// SIGTERM/SIGINT or --max-duration after its last commit (exit 0), on an invalidation, or
    /// when it cannot prove it still holds its lease (exit 3). --max-events and
    /// --max-wait-seconds do not end it. Needs a policy built against contract 1.5 or later.
    #[arg(
        long,
        env = env::FOLLOW,
        default_value = "false",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub follow: bool,
    /// With --follow: end the run cleanly after this long (e.g. 15m, 1h, 3600), exit 0, for
    /// engines that want bounded tasks.
    #[arg(long, env = env::MAX_DURATION, value_name = "DURATION", value_parser = super::status::parse_duration)]
    pub max_duration: Option<std::time::Duration>,
}

pub fn run(args: RunArgs) -> Result<super::Outcome> {
    let follow = args.follow;
    let outcome = super::run_reported(&args.output, &args.inputs.consumer.consumer_id, || {
        let follow = match (args.follow, args.max_duration) {
            (false, Some(_)) => {
                return Err(handoff::error::HandoffError::BadInput(
                    "--max-duration bounds a run that follows the stream: add --follow".into(),
                )
                .into());
            }
            (false, None) => None,
            (true, Some(duration)) if duration.is_zero() => {
                return Err(handoff::error::HandoffError::BadInput(
                    "--max-duration must be longer than zero".into(),
                )
                .into());
            }
            (true, max_duration) => Some(Follow { max_duration }),
        };
        let plan = Plan {
            inputs: args.inputs.validate()?,
            params: args.policy.params()?,
            limits: args.policy.limits(),
            stop: super::stop_signal()?,
            outbox: args.inputs.outbox(),
            stream: args.stream.options()?,
            follow,
        };
        // The deployment is reached while the policy loads.
        let mut backends = Mongo::new(&args.uri, &plan.inputs, &plan.stream.config)
            .following(plan.follow.is_some());
        plan.run(|| args.policy.load(), &mut backends)
    })?;
    // A run that follows the stream ends by being stopped: that is a clean end.
    Ok(match outcome {
        super::Outcome::Stopped if follow => super::Outcome::Done,
        other => other,
    })
}
