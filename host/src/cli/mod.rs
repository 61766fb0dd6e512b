//! The `handoff` command line.
//!
//! - `run`: one bounded run against a MongoDB replica set (the main job);
//! - `replay`: one bounded run over a recorded change stream, state in an embedded store;
//! - `inspect`: the checkpoint and outbox of a state store, as Extended JSON lines;
//! - `policy`: working with policy components.
//!
//! Exit codes are those of [`HandoffError::exit_code`](crate::error::HandoffError::exit_code).

mod args;
mod inspect;
mod policy;
mod replay;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::HandoffError;
use crate::inputs::Inputs;
use crate::output::kestra;
use crate::runtime::Policy;
use crate::runtime::session::Summary;

/// Prints the task protocol lines of a successful run.
fn emit(summary: &Summary, policy: &Policy, inputs: &Inputs, started: std::time::Instant) {
    println!(
        "{}",
        kestra::outputs_line(
            summary,
            &[("policy_sha256", serde_json::json!(policy.sha256))]
        )
    );
    println!(
        "{}",
        kestra::metrics_line(
            summary,
            started.elapsed(),
            &[("consumer", &inputs.consumer_id)]
        )
    );
}

#[derive(Parser)]
#[command(
    name = "handoff",
    version,
    about = "Hands MongoDB change-stream events to a durable outbox under a sandboxed policy",
    after_help = "Also reads [env: HANDOFF_LOG] (log filter, e.g. info) and [env: HANDOFF_CACHE_DIR] (compiled-policy cache)."
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "HANDOFF_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// One bounded run against a MongoDB replica set (`MONGODB_URI`): the main job.
    Run(run::RunArgs),
    /// One bounded run over a recorded change stream (JSON Lines fixture).
    Replay(replay::ReplayArgs),
    /// Prints the checkpoint and every outbox record of a state store, one JSON object per line.
    Inspect(inspect::InspectArgs),
    /// Policy components: export the default.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HANDOFF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

pub fn main() -> ExitCode {
    let _ = crate::runtime::PROCESS_START.set(std::time::Instant::now());
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return match error.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(HandoffError::BadInput(String::new()).exit_code()),
            };
        }
    };
    init_logging(cli.log_format);
    tracing::debug!(target: "handoff::startup", "arguments parsed");
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Policy(command) => policy::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error[{}]: {error}", error.kind());
            error.to_exit_code()
        }
    }
}
