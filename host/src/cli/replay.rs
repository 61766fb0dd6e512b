//! `handoff replay FIXTURE --state PATH`: one bounded run over a recorded change stream.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::args::{InputArgs, PolicyArgs};
use handoff::backend::replay::Fixture;
use handoff::error::Result;
use handoff::run::backends::Replay;
use handoff::run::{Plan, StreamOptions};

#[derive(Args)]
#[command(after_help = concat!(
    "Example:\n",
    "  handoff replay tests/fixtures/demo.jsonl --state /tmp/demo.redb\n",
    "  handoff inspect --state /tmp/demo.redb\n\n",
    "Outputs as `handoff run` (see `handoff run --help`).\n\n",
    exit_codes!(),
))]
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
    #[command(flatten)]
    pub output: super::OutputArgs,
}

pub fn run(mut args: ReplayArgs) -> Result<super::Outcome> {
    let consumer_id = args.inputs.consumer.consumer_id.clone();
    let output = args.output.clone();
    super::run_reported(&output, &consumer_id, || {
        let fixture = Fixture::read(&args.fixture)?;
        if let Some(deployment) = &fixture.deployment {
            args.inputs.default_source(&deployment.source);
        }
        let inputs = args.inputs.validate()?;
        let params = args.policy.params()?;
        let mut backends = Replay::new(
            fixture,
            args.state.clone(),
            Duration::from_millis(args.state_lock_timeout_ms),
            &inputs,
        )?;
        let plan = Plan {
            inputs,
            params,
            limits: args.policy.limits(),
            stop: super::stop_signal()?,
            outbox: args.inputs.outbox(),
            stream: StreamOptions::default(),
            follow: None,
            live: Default::default(),
        };
        plan.run(|| args.policy.load(), &mut backends)
    })
}
