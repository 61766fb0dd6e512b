//! `handoff policy …`: writing, checking and testing policy components.

use std::path::PathBuf;

use clap::Subcommand;

use handoff::error::{HandoffError, Result};
use handoff::kit::cases::Case;
use handoff::kit::{check, scaffold};
use handoff::runtime::{PolicySource, Runtime};

/// The watchdog's grace period past each case run's deadline under `policy test`.
pub const TEST_WATCHDOG_GRACE_SECONDS: u64 = 30;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Creates a policy crate NAME (Rust, wit-bindgen, wasm32-wasip2) that builds and passes its
    /// own tests and cases as generated.
    New {
        /// The crate's name (lowercase letters, digits, '-' or '_').
        name: String,
        /// Where to create it.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Inspects a policy file: component or not, contract version, imports, size, SHA-256.
    /// Exits 9 when this host would refuse it.
    Check {
        /// The `.wasm` file.
        file: PathBuf,
    },
    /// Runs a policy over test cases (each a recorded stream and expected results) on fresh
    /// stores; prints a diff for each mismatch and exits non-zero if any.
    Test {
        /// The policy to test (default: the embedded default policy).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// A directory of cases (or one case directory).
        cases: PathBuf,
        /// Write the results as the cases' expectations.
        #[arg(long)]
        update: bool,
    },
    /// Writes the embedded default policy component to FILE (e.g. to upload as a namespace file).
    ExportDefault {
        /// Where to write the `.wasm` file.
        file: PathBuf,
    },
}

pub fn run(command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::New { name, dir } => {
            let root = scaffold::scaffold(&dir, &name)?;
            // The sample case's expectations come from the embedded default, which the template
            // reproduces.
            let case_dir = root.join("cases/sample");
            std::fs::write(
                case_dir.join("case.json"),
                "{\n  \"description\": \"inserts, an update and a delete, then idle; a second run finds nothing new\",\n  \"runs\": 2\n}\n",
            )
            .map_err(|e| HandoffError::BadInput(format!("cannot write the sample case: {e}")))?;
            let runtime = Runtime::new(None)?;
            let policy = runtime.load(&PolicySource::embedded_default())?;
            let mut case = Case::load(&case_dir)?;
            let outcome = case.run(&runtime, &policy)?;
            case.update(&outcome.actual)?;
            println!("created {}", root.display());
            Ok(())
        }
        PolicyCommand::Check { file } => {
            let source = PolicySource::from_file(&file)?;
            let report = check::check(&source)?;
            for line in &report.lines {
                println!("{line}");
            }
            match report.refusal {
                None => {
                    println!("verdict:   this host runs it");
                    Ok(())
                }
                Some(refusal) => {
                    println!("verdict:   refused");
                    Err(refusal)
                }
            }
        }
        PolicyCommand::Test {
            policy,
            cases,
            update,
        } => {
            let source = match &policy {
                Some(path) => PolicySource::from_file(path)?,
                None => PolicySource::embedded_default(),
            };
            let runtime = Runtime::new(handoff::runtime::cache::ArtifactCache::default_dir())?;
            let policy = runtime.load(&source)?;
            println!("policy {} ({})", source.origin, &source.sha256[..16]);
            let (mut passed, mut failed) = (0, 0);
            for mut case in Case::discover(&cases)? {
                let outcome = case.run(&runtime, &policy)?;
                match (&outcome.diff, update) {
                    (None, _) => {
                        passed += 1;
                        println!("ok       {}", outcome.name);
                    }
                    (Some(_), true) => {
                        case.update(&outcome.actual)?;
                        passed += 1;
                        println!("updated  {}", outcome.name);
                    }
                    (Some(diff), false) => {
                        failed += 1;
                        let why = if outcome.had_expectations {
                            ""
                        } else {
                            " (no expectations yet: run with --update)"
                        };
                        println!("FAILED   {}{why}\n{diff}", outcome.name);
                    }
                }
            }
            println!("{passed} passed, {failed} failed");
            if failed > 0 {
                return Err(HandoffError::Policy(format!(
                    "{failed} case(s) did not match their expectations"
                )));
            }
            Ok(())
        }
        PolicyCommand::ExportDefault { file } => {
            let source = PolicySource::embedded_default();
            if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    HandoffError::BadInput(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            std::fs::write(&file, &source.bytes).map_err(|e| {
                HandoffError::BadInput(format!("cannot write {}: {e}", file.display()))
            })?;
            println!("{}  {}", source.sha256, file.display());
            Ok(())
        }
    }
}
