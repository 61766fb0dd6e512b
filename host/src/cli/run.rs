//! `handoff run`: the main job against a MongoDB replica set.

use clap::Args;

use super::args::{InputArgs, PolicyArgs, StreamArgs};
use crate::cli::env;
use handoff::error::Result;
use handoff::run::Plan;
use handoff::run::backends::Mongo;
use std::sync::Arc;

use handoff::backend::mongo::{Connection, Pool, window};
use handoff::output::live::{self, LiveMetrics};
use handoff::run::plan::{Follow, Live};

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
    /// Serve the run's metrics while it runs (counters, lag, checkpoint age, oplog margin, the
    /// write-to-commit latency histogram) in the OpenMetrics format at /metrics, with /healthz
    /// and /readyz: PORT (on 127.0.0.1) or HOST:PORT. Off by default.
    #[arg(long, env = env::METRICS_LISTEN, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

/// How often the live figures (lag, oplog margin) are read beside a run that serves metrics.
const FIGURES_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the run's live metrics at `address` and reads its consumer's figures beside it.
fn serve_metrics(address: &str, uri: &str, consumer: &str) -> Result<Arc<LiveMetrics>> {
    let address = live::listen_address(address)?;
    let metrics = LiveMetrics::new(consumer);
    live::serve(address, metrics.clone())?;
    let (uri, watched) = (uri.to_string(), metrics.clone());
    let spawned = std::thread::Builder::new()
        .name("figures".into())
        .spawn(move || {
            let Ok(connection) = Connection::connect_with(&uri, Pool::Single) else {
                return;
            };
            loop {
                let token = watched.checkpoint_token();
                let position = connection.block_on(window::position(&connection, token.as_ref()));
                watched.set_position(&position);
                std::thread::sleep(FIGURES_EVERY);
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "the live figures will not be read");
    }
    Ok(metrics)
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
        let inputs = args.inputs.validate()?;
        // Bound before anything is read or written: a bad or busy address refuses the run.
        let metrics = match &args.metrics_listen {
            Some(address) => Some(serve_metrics(address, &args.uri, &inputs.consumer_id)?),
            None => None,
        };
        let plan = Plan {
            inputs,
            params: args.policy.params()?,
            limits: args.policy.limits(),
            stop: super::stop_signal()?,
            outbox: args.inputs.outbox(),
            stream: args.stream.options()?,
            follow,
            live: Live(
                metrics
                    .clone()
                    .map(|m| m as Arc<dyn handoff::session::Observer>),
            ),
        };
        // The deployment is reached while the policy loads.
        let mut backends = Mongo::new(&args.uri, &plan.inputs, &plan.stream.config)
            .following(plan.follow.is_some());
        let ran = plan.run(|| args.policy.load(), &mut backends);
        if let Some(metrics) = &metrics {
            metrics.ended();
        }
        ran
    })?;
    // A run that follows the stream ends by being stopped: that is a clean end.
    Ok(match outcome {
        super::Outcome::Stopped if follow => super::Outcome::Done,
        other => other,
    })
}
