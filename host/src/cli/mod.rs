//! The `handoff` command line.
//!
//! - `run`: one bounded run against a MongoDB replica set (the main job);
//! - `replay`: one bounded run over a recorded change stream, state in an embedded store;
//! - `inspect`: the checkpoint and outbox of a state store, as Extended JSON lines;
//! - `policy`: writing, checking and testing policy components;
//! - `record`: a live change stream captured as a fixture.
//!
//! Exit codes are those of `HandoffError::exit_code`,
//! plus 12 for a run stopped by a signal, 14 when the watchdog ends the process
//! (`handoff::run::watchdog`) and 130 / 143 when a second SIGINT / SIGTERM does.

mod args;
mod inspect;
mod policy;
mod record;
mod replay;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use handoff::domain::StopSignal;
use handoff::domain::text::escape_untrusted;
use handoff::error::HandoffError;
use handoff::output::file::OutputsFile;
use handoff::output::kestra::{Kestra, KestraLogs};
use handoff::output::{self, RunOutputs};
use handoff::run::watchdog;
use handoff::run::{FailedRun, Finished};
use handoff::runtime::{Limits, PROCESS_START};

/// How a command ended when it did not fail.
pub enum Outcome {
    Done,
    /// A run was stopped by a signal after its last commit.
    Stopped,
}

/// Where a run's outputs go besides stdout.
#[derive(clap::Args, Clone, Debug)]
pub struct OutputArgs {
    /// Also write the run's outputs as one JSON object to this file, atomically, on success and
    /// on failure (for engines that read a file: Argo Workflows, Airflow, GitHub Actions).
    #[arg(long, env = "HANDOFF_OUTPUTS_FILE", value_name = "PATH")]
    pub outputs_file: Option<std::path::PathBuf>,
}

/// Runs a command that makes a run and reports it: the outputs of a finished run (also of a
/// stopped one: its commits stand), or of a failed one (its class, exit code, what it committed
/// and what to do next), on stdout and in the outputs file, before the process exits.
fn run_reported(
    output: &OutputArgs,
    consumer_id: &str,
    body: impl FnOnce() -> Result<Finished, FailedRun>,
) -> handoff::error::Result<Outcome> {
    let consumer_id = escape_untrusted(consumer_id, 64);
    let file = match output
        .outputs_file
        .as_deref()
        .map(OutputsFile::new)
        .transpose()
    {
        Ok(file) => file,
        Err(error) => {
            let failed = FailedRun::before_run(error);
            output::emit(&Kestra, &RunOutputs::failed(&failed, &consumer_id));
            return Err(failed.failed.error);
        }
    };
    match body() {
        Ok(finished) => {
            let outputs = RunOutputs::of(&finished);
            output::emit(&Kestra, &outputs);
            if let Some(file) = &file {
                file.write(&outputs)?;
            }
            Ok(if finished.summary.stopped {
                Outcome::Stopped
            } else {
                Outcome::Done
            })
        }
        Err(failed) => {
            let outputs = RunOutputs::failed(&failed, &consumer_id);
            output::emit(&Kestra, &outputs);
            if let Some(file) = &file
                && let Err(error) = file.write(&outputs)
            {
                tracing::error!(%error, "the outputs of the failed run could not be written");
            }
            Err(failed.failed.error)
        }
    }
}

/// The process's stop flag, raised by SIGTERM and SIGINT (registered once, at the first call; a
/// second signal then ends the process at once).
fn stop_signal() -> handoff::error::Result<StopSignal> {
    static STOP: std::sync::OnceLock<StopSignal> = std::sync::OnceLock::new();
    if let Some(stop) = STOP.get() {
        return Ok(stop.clone());
    }
    let stop = StopSignal::on_signals().map_err(|e| HandoffError::Internal(e.into()))?;
    Ok(STOP.get_or_init(|| stop).clone())
}

#[derive(Parser)]
#[command(
    name = "handoff",
    version,
    about = "Hands MongoDB change-stream events to a durable outbox under a sandboxed policy",
    after_help = "Also reads [env: HANDOFF_LOG] (log filter, e.g. info) and [env: HANDOFF_CACHE_DIR] (compiled-policy cache)."
)]
struct Cli {
    /// Log format: `text` or `json` lines on stderr, or `kestra`: Kestra's log protocol lines on
    /// stdout (`::{"logs":[…]}::`), levels kept.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "HANDOFF_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
    Kestra,
}

#[derive(Subcommand)]
enum Command {
    /// One bounded run against a MongoDB replica set (`MONGODB_URI`): the main job.
    Run(run::RunArgs),
    /// One bounded run over a recorded change stream (JSON Lines fixture).
    Replay(replay::ReplayArgs),
    /// Prints the checkpoint and every outbox record of a state store, one JSON object per line.
    Inspect(inspect::InspectArgs),
    /// Policy components: scaffold, check, test against cases, export the default.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Captures a live change stream into a fixture (policy test cases from real traffic).
    Record(record::RecordArgs),
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HANDOFF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only on a terminal: a workflow engine stores the bytes as they are.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Kestra => builder
            .with_ansi(false)
            .with_writer(std::io::stdout)
            .event_format(KestraLogs)
            .try_init(),
    };
}

pub fn main() -> ExitCode {
    let _ = PROCESS_START.set(std::time::Instant::now());
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
    // A run that outlives its deadline (compilation included) plus a grace period ends here;
    // signals stop a run from the start (a second one ends the process at once).
    if matches!(&cli.command, Command::Run(_) | Command::Replay(_))
        && let Err(error) = stop_signal()
    {
        eprintln!("error[{}]: {error}", error.kind());
        return error.to_exit_code();
    }
    match &cli.command {
        Command::Run(args) => args.policy.arm_watchdog(),
        Command::Replay(args) => args.policy.arm_watchdog(),
        Command::Policy(policy::PolicyCommand::Test { .. }) => {
            let start = PROCESS_START
                .get()
                .copied()
                .unwrap_or_else(std::time::Instant::now);
            watchdog::arm(
                start + Limits::default().run_timeout,
                std::time::Duration::from_secs(policy::TEST_WATCHDOG_GRACE_SECONDS),
            );
        }
        _ => {}
    }
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Inspect(args) => inspect::run(args).map(|()| Outcome::Done),
        Command::Policy(command) => policy::run(command).map(|()| Outcome::Done),
        Command::Record(args) => record::run(args).map(|()| Outcome::Done),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Stopped) => {
            eprintln!(
                "stopped: a signal ended the run after its last commit; the next run continues from it"
            );
            ExitCode::from(handoff::error::STOPPED_EXIT_CODE)
        }
        Err(error) => {
            // Messages carry server and policy text, escaped where it entered; escaping again
            // here guarantees that no line of ours can be made to start a protocol line.
            eprintln!(
                "error[{}]: {}",
                error.kind(),
                escape_untrusted(&error.to_string(), 8192)
            );
            error.to_exit_code()
        }
    }
}
