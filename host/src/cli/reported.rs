//! How a command that makes a run reports it: its outputs on stdout and in the outputs file,
//! whether it finished, stopped or failed.

use handoff::domain::text::escape_name;
use handoff::output::file::OutputsFile;
use handoff::output::kestra::Kestra;
use handoff::output::{self, RunOutputs};
use handoff::run::{FailedRun, Finished};

use super::{Outcome, env};

/// Where a run's outputs go besides stdout.
#[derive(clap::Args, Clone, Debug)]
pub struct OutputArgs {
    /// Also write the run's outputs as one JSON object to this file, atomically, on success and
    /// on failure (for engines that read a file: Argo Workflows, Airflow, GitHub Actions).
    #[arg(long, env = env::OUTPUTS_FILE, value_name = "PATH")]
    pub outputs_file: Option<std::path::PathBuf>,
}

/// Runs a command that makes a run and reports it: the outputs of a finished run (also of a
/// stopped one: its commits stand), or of a failed one (its class, exit code, what it committed
/// and what to do next), on stdout and in the outputs file, before the process exits.
pub fn run_reported(
    output: &OutputArgs,
    consumer_id: &str,
    body: impl FnOnce() -> Result<Finished, FailedRun>,
) -> handoff::error::Result<Outcome> {
    let consumer_id = escape_name(consumer_id, 64);
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
            // The outputs file is written whatever became of stdout.
            let printed = output::try_emit(&Kestra, &outputs);
            if let Some(file) = &file {
                file.write(&outputs)?;
            }
            printed?;
            Ok(if finished.summary.stopped {
                Outcome::Stopped
            } else {
                Outcome::Done
            })
        }
        Err(failed) => {
            let outputs = RunOutputs::failed(&failed, &consumer_id);
            // The run's own failure is the one to report, whatever became of stdout.
            if let Err(error) = output::try_emit(&Kestra, &outputs) {
                tracing::error!(%error, "the outputs of the failed run could not be printed");
            }
            if let Some(file) = &file
                && let Err(error) = file.write(&outputs)
            {
                tracing::error!(%error, "the outputs of the failed run could not be written");
            }
            // The error line carries the evidence too (a log collector may keep only stderr).
            let evidence = output::Evidence::of(
                &failed.failed.error,
                failed.position.as_deref(),
                &consumer_id,
                failed.source.as_deref(),
                failed.collections.as_deref(),
            );
            let error = failed.failed.error;
            Err(match evidence {
                Some(evidence) => error.with_detail(&evidence.summary()),
                None => error,
            })
        }
    }
}
