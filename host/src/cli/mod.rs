//! The `handoff` command line.
//!
//! - `run`: one bounded run against a MongoDB replica set (the main job);
//! - `replay`: one bounded run over a recorded change stream, state in an embedded store;
//! - `inspect`: the checkpoint and outbox of a state store, as Extended JSON lines;
//! - `policy`: writing, checking and testing policy components;
//! - `record`: a live change stream captured as a fixture;
//! - `deliver`: the outbox delivered to a sink through a ledger, and its dead records.
//!
//! Exit codes are those of `HandoffError::exit_code`,
//! plus 12 for a run stopped by a signal, 14 when the watchdog ends the process
//! (`handoff::run::watchdog`) and 130 / 143 when a second SIGINT / SIGTERM does.

/// The exit codes, as every command's help states them (a macro, so that help texts can
/// `concat!` it).
macro_rules! exit_codes {
    () => {
        "Exit codes:
  0    done
  1    internal error (a defect of handoff)
  2    bad input: arguments, URI, fixture, policy file (nothing written)
  3    conflict: the checkpoint moved under the run, or the state is in use (retry)
  4    mismatch: the checkpoint belongs to another source or replica set
  5    malformed checkpoint
  6    history lost: the saved token fell off the oplog; recover --reason TEXT moves the
       checkpoint and repairs the outbox in one audited command, or by hand in this order:
       status, checkpoint reset --to now --dry-run, checkpoint reset --to now, run,
       reconcile --repair, reconcile (the failed run's next_commands, ready to paste)
  7    invalid token: the saved token cannot resume with its mode (recover as for 6)
  8    stream fatal: the server ended the stream for good (recover as for 6)
  9    policy: the policy failed, broke a rule or is not a usable component
  10   unavailable: the deployment or the store cannot be reached, or stdout written (retry)
  11   authentication: the server refused the credentials
  12   stopped by SIGTERM/SIGINT after the last commit (what it committed stands)
  13   event too large: a change event or its record is over 16 MiB
  14   watchdog: the run outlived its deadline plus the grace period
  15   image missing: the stream requires a pre-/post-image MongoDB does not hold
  16   attention: a check found something to act on (status --min-margin or --min-forecast; reconcile differences; policy diff IDs changed)
  17   dead records: a delivery left records that failed for good (deliver dead list; the others went on)
  18   delivery lag: a delivery's oldest open record waited longer than status --max-delivery-lag (or deliver status --max-lag-seconds)
  130, 143  a second SIGINT / SIGTERM ended the process at once"
    };
}

/// `println!` for a command's output: a closed or full stdout is the command's failure (an
/// `unavailable` error to return with `?`), never a panic.
macro_rules! out {
    ($($arg:tt)*) => {
        handoff::output::write_stdout(&format!("{}\n", format_args!($($arg)*)))
    };
}

mod args;
mod backfill;
mod checkpoint;
mod deliver;
pub mod env;
mod inspect;
mod lease;
mod man;
mod policy;
mod reconcile;
mod record;
mod recover;
mod refused;
mod replay;
mod reported;
mod run;
mod status;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
pub use reported::{OutputArgs, run_reported};

use handoff::domain::StopSignal;
use handoff::domain::text::escape_untrusted;
use handoff::error::HandoffError;
use handoff::output::kestra::{Kestra, KestraLogs};
use handoff::output::{self, RunOutputs};
use handoff::run::FailedRun;
use handoff::run::watchdog;
use handoff::runtime::{Limits, PROCESS_START};

/// How a command ended when it did not fail.
pub enum Outcome {
    Done,
    /// A run was stopped by a signal after its last commit.
    Stopped,
}

/// Whether the command line asks for a run (`run` or `replay`), whose failures report outputs.
fn makes_a_run() -> bool {
    std::env::args_os()
        .skip(1)
        .any(|arg| arg == "run" || arg == "replay")
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

/// `handoff --version`: the package, the contract versions it runs, the engine, the build.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncontract: handoff:policy@",
    env!("HANDOFF_CONTRACT"),
    " (runs policies built for ",
    env!("HANDOFF_CONTRACT_OLDEST"),
    " up to ",
    env!("HANDOFF_CONTRACT"),
    ")\nengine:   wasmtime ",
    env!("HANDOFF_WASMTIME_VERSION"),
    "\ncommit:   ",
    env!("HANDOFF_BUILD_COMMIT"),
);

#[derive(Parser)]
#[command(
    name = "handoff",
    version,
    long_version = LONG_VERSION,
    about = "Hands MongoDB change-stream events to a durable outbox under a sandboxed policy",
    after_help = concat!(
        "Also reads [env: HANDOFF_LOG] (log filter, e.g. info) and [env: HANDOFF_CACHE_DIR] (compiled-policy cache).\n\n",
        exit_codes!()
    )
)]
struct Cli {
    /// Log format: `text` or `json` lines on stderr, or `kestra`: Kestra's log protocol lines on
    /// stdout (`::{"logs":[…]}::`), levels kept.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = env::LOG_FORMAT)]
    log_format: LogFormat,
    /// On a sharded cluster, read each shard's own oplog for the oplog window and margin
    /// (`status`, a run's figures): connects to every host the cluster's `listShards` names with
    /// the URI's user and options (the shards must know the user), only TCP hosts, never when the
    /// URI accepts invalid certificates or sends credentials without TLS. Off: the window is
    /// unknown.
    #[arg(
        long,
        global = true,
        env = env::SHARD_OPLOGS,
        default_value = "false",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    shard_oplogs: bool,
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
    /// A consumer's checkpoint, lag and oplog margin, and its outbox (read-only).
    Status(status::StatusArgs),
    /// Audited changes to a consumer's checkpoint.
    #[command(subcommand)]
    Checkpoint(checkpoint::CheckpointCommand),
    /// Audited changes to a consumer's lease.
    #[command(subcommand)]
    Lease(lease::LeaseCommand),
    /// Hands off the watched collection's existing documents beside the live stream (audited).
    Backfill(backfill::BackfillArgs),
    /// Compares the watched collection with what the outbox says each document is.
    Reconcile(reconcile::ReconcileArgs),
    /// Delivers the consumer's outbox to a sink (a MongoDB projection, a webhook), each effect
    /// recorded in a ledger; `deliver dead` lists, replays or discards dead records.
    Deliver(Box<deliver::DeliverArgs>),
    /// After lost history: moves the checkpoint to now and repairs the outbox through the policy,
    /// in one audited command (a rerun completes a stopped one).
    Recover(recover::RecoverArgs),
    /// Prints a shell completion script (e.g. `handoff completions bash > /etc/bash_completion.d/handoff`).
    #[command(after_help = concat!("Example:\n  source <(handoff completions bash)\n\n", exit_codes!()))]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Prints a command's manual page (roff), or writes every page into a folder.
    #[command(after_help = concat!(
        "Example:\n",
        "  handoff man | man -l -\n",
        "  handoff man checkpoint reset | man -l -\n",
        "  handoff man --dir /usr/local/share/man/man1\n\n",
        exit_codes!()
    ))]
    Man {
        /// The command whose page to print, e.g. `run` or `checkpoint reset` (none: handoff's own).
        command: Vec<String>,
        /// Write every page (handoff.1, handoff-run.1, handoff-checkpoint-reset.1, …) into this
        /// folder instead, creating it when missing.
        #[arg(long, conflicts_with = "command")]
        dir: Option<std::path::PathBuf>,
    },
}

/// The default log filter: warnings, and the progress of long operator commands.
const DEFAULT_LOG_FILTER: &str = "warn,handoff::progress=info";

fn init_logging(format: LogFormat) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::Filter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    type Registry = tracing_subscriber::Registry;
    type Boxed = Box<dyn Layer<Registry> + Send + Sync>;
    // `HANDOFF_LOG` takes the full filter syntax; the default is a plain list of targets, which
    // costs nothing to parse at every start.
    let filter: Box<dyn Filter<Registry> + Send + Sync> = match std::env::var(env::LOG) {
        Ok(directives) => Box::new(
            tracing_subscriber::EnvFilter::try_new(&directives)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        ),
        Err(_) => Box::new(
            DEFAULT_LOG_FILTER
                .parse::<tracing_subscriber::filter::Targets>()
                .unwrap_or_default(),
        ),
    };
    // Colours only on a terminal: a workflow engine stores the bytes as they are. A log line
    // that cannot be written (a closed or full stream) is dropped: reporting it on stderr would
    // panic when stderr is the stream that failed.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let output: Boxed = match format {
        LogFormat::Text => Box::new(fmt),
        LogFormat::Json => Box::new(fmt.json()),
        LogFormat::Kestra => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .log_internal_errors(false)
                .with_writer(std::io::stdout)
                .event_format(KestraLogs),
        ),
    };
    let _ = tracing_subscriber::registry()
        .with(output.with_filter(filter))
        .try_init();
}

/// Gives each variable's former name (see [`env::FORMER`]) to its current one when only the
/// former is set. Returns what it found, for warnings once logging is up: `(former, current,
/// adopted)`, adopted false when the current name was set too and the former is ignored.
fn adopt_former_names() -> Vec<(&'static str, &'static str, bool)> {
    let mut found = Vec::new();
    for &(former, current) in env::FORMER {
        let Some(value) = std::env::var_os(former) else {
            continue;
        };
        let adopted = std::env::var_os(current).is_none();
        if adopted {
            // SAFETY: called first in `main`, before the process starts any thread (the runtime,
            // the watchdog and the signal handlers come later), so nothing reads the environment
            // while it changes.
            unsafe { std::env::set_var(current, value) };
        }
        found.push((former, current, adopted));
    }
    found
}

pub fn main() -> ExitCode {
    let _ = PROCESS_START.set(std::time::Instant::now());
    let former_names = adopt_former_names();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            return match error.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    let _ = error.print();
                    ExitCode::SUCCESS
                }
                _ => {
                    // The parser's message quotes the values it refused: escaped and without
                    // credentials, as every other line.
                    eprintln!("{}", refused::message(&error));
                    let refused = HandoffError::BadInput(error.kind().to_string());
                    if makes_a_run() {
                        // A run refused for its arguments still reports, as any failed run does.
                        let consumer = std::env::var(env::CONSUMER_ID).unwrap_or_default();
                        // The argument's name only: its value may be anything, a secret included.
                        let argument = match error.get(clap::error::ContextKind::InvalidArg) {
                            Some(clap::error::ContextValue::String(name))
                                if name.starts_with("--") =>
                            {
                                format!(" ({})", escape_untrusted(name, 80))
                            }
                            _ => String::new(),
                        };
                        let failed = FailedRun::before_run(HandoffError::BadInput(format!(
                            "{}{argument}; see `handoff run --help`",
                            error.kind()
                        )));
                        output::emit(&Kestra, &RunOutputs::failed(&failed, &consumer));
                    }
                    // Every failure ends with its class, as the engines' alerts expect.
                    eprintln!(
                        "error[{}]: the arguments were refused (see above)",
                        refused.kind()
                    );
                    refused.to_exit_code()
                }
            };
        }
    };
    init_logging(cli.log_format);
    handoff::backend::mongo::window::read_shard_oplogs(cli.shard_oplogs);
    tracing::debug!(target: "handoff::startup", "arguments parsed");
    for (former, current, adopted) in former_names {
        if adopted {
            tracing::warn!(
                former,
                current,
                "read a variable under its former name; rename it"
            );
        } else {
            tracing::warn!(
                former,
                current,
                "ignored a variable's former name: its current name is set"
            );
        }
    }
    // A run that outlives its deadline (compilation included) plus a grace period ends here;
    // signals stop a run from the start (a second one ends the process at once).
    if matches!(
        &cli.command,
        Command::Run(_) | Command::Replay(_) | Command::Deliver(_)
    ) && let Err(error) = stop_signal()
    {
        let _ = writeln!(std::io::stderr(), "error[{}]: {error}", error.kind());
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
        Command::Status(args) => status::run(args).map(|()| Outcome::Done),
        Command::Lease(command) => lease::run(command).map(|()| Outcome::Done),
        Command::Checkpoint(command) => checkpoint::run(command).map(|()| Outcome::Done),
        Command::Backfill(args) => backfill::run(args).map(|()| Outcome::Done),
        Command::Reconcile(args) => reconcile::run(args).map(|()| Outcome::Done),
        Command::Recover(args) => recover::run(args).map(|()| Outcome::Done),
        Command::Deliver(args) => deliver::run(*args),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command().bin_name("handoff");
            command.build();
            // A closed pipe is an error to report, not a panic.
            let mut text = Vec::new();
            clap_complete::Generator::try_generate(&shell, &command, &mut text)
                .map_err(output::stdout_failed)
                .and_then(|()| output::write_stdout(&String::from_utf8_lossy(&text)))
                .map(|()| Outcome::Done)
        }
        Command::Man { command, dir } => man::run(&command, dir.as_deref()).map(|()| Outcome::Done),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Stopped) => {
            // A closed or full stderr leaves the exit code to tell (no panic).
            let _ = writeln!(
                std::io::stderr(),
                "stopped: a signal ended the run after its last commit; the next run continues from it"
            );
            ExitCode::from(handoff::error::STOPPED_EXIT_CODE)
        }
        Err(error) => {
            // Messages carry server and policy text, escaped where it entered; escaping again
            // here guarantees that no line of ours can be made to start a protocol line.
            let _ = writeln!(
                std::io::stderr(),
                "error[{}]: {}",
                error.kind(),
                escape_untrusted(&error.to_string(), 8192)
            );
            error.to_exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{Cli, env};

    /// Every environment variable an argument reads is named in [`env::ALL`], and every former
    /// name maps to a current one: a variable added elsewhere would escape the suites' clean
    /// environment and the list the README documents.
    #[test]
    fn every_variable_an_argument_reads_is_named_once() {
        fn walk(command: &clap::Command, found: &mut Vec<String>) {
            for arg in command.get_arguments() {
                if let Some(name) = arg.get_env() {
                    found.push(name.to_string_lossy().into_owned());
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, found);
            }
        }
        let mut found = Vec::new();
        walk(&Cli::command(), &mut found);
        assert!(found.len() > 20, "{found:?}");
        for name in &found {
            assert!(
                env::ALL.contains(&name.as_str()),
                "{name} is not in env::ALL"
            );
        }
        for (former, current) in env::FORMER {
            assert!(
                env::ALL.contains(current),
                "{former} maps to {current}, not in env::ALL"
            );
            assert!(!env::ALL.contains(former), "{former} is a current name too");
            assert!(current.starts_with("HANDOFF_"), "{current}");
        }
    }
}
