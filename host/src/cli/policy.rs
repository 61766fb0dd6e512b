//! `handoff policy …`: writing, checking and testing policy components.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Subcommand;

use handoff::error::{HandoffError, Result};
use handoff::kit::cases::{Case, Filter};
use handoff::kit::lang::Lang;
use handoff::kit::report::{CaseResult, TestSummary, Verdict};
use handoff::kit::{build, check, scaffold};
use handoff::runtime::cache::{ArtifactCache, Lookup};
use handoff::runtime::policy::SHIPPED;
use handoff::runtime::{PolicySource, Runtime};

mod diff;

/// The watchdog's grace period past each case run's deadline under `policy test`.
pub const TEST_WATCHDOG_GRACE_SECONDS: u64 = 30;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Creates a policy project NAME in Rust, Python or JavaScript that builds and passes its own
    /// tests and cases as generated.
    #[command(after_help = concat!("Example:\n  handoff policy new shop-policy --lang python && cd shop-policy && handoff policy build\n\n", exit_codes!()))]
    New {
        /// The project's name (lowercase letters, digits, '-' or '_').
        name: String,
        /// Where to create it.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The policy's language: rust, python or javascript.
        #[arg(long, default_value = "rust")]
        lang: Lang,
    },
    /// Builds the policy project in DIR with its language's toolchain (cargo, componentize-py,
    /// componentize-js), then checks the component like `policy check`.
    #[command(after_help = concat!("Example:\n  handoff policy build --watch\n\n", exit_codes!()))]
    Build {
        /// The project directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Build again whenever a source file changes (until interrupted).
        #[arg(long)]
        watch: bool,
    },
    /// Inspects a policy file: component or not, contract version, imports, size, SHA-256.
    /// Exits 9 when this host would refuse it. With --against, then diffs it with the policy
    /// deployed now over the shipped sample stream (as `policy diff`).
    #[command(after_help = concat!("Example:\n  handoff policy check target/wasm32-wasip2/release/shop_policy.wasm --against deployed.wasm\n\n", exit_codes!()))]
    Check {
        /// The `.wasm` file.
        file: PathBuf,
        /// The policy deployed now: diff FILE with it after the check; exits 16 when an event
        /// would change its ID.
        #[arg(long, value_name = "CURRENT")]
        against: Option<PathBuf>,
        /// With --against: exit 0 even when events change their IDs.
        #[arg(long, requires = "against")]
        allow_id_change: bool,
    },
    /// Runs two policies over the same events (a recorded stream, a folder of cases, or a
    /// consumer's outbox) and tells per event what the new one decides otherwise: records added
    /// or removed, IDs changed (a re-delivery risk: exits 16), shapes or decisions changed.
    Diff(Box<diff::DiffArgs>),
    /// Runs a policy over test cases (each a recorded stream and expected results) on fresh
    /// stores; prints a diff for each mismatch and exits non-zero if any.
    #[command(after_help = concat!("Example:\n  handoff policy test --policy shop_policy.wasm cases/\n\n", exit_codes!()))]
    Test {
        /// The policy to test (default: the embedded default policy).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// A directory of cases (or one case directory).
        cases: PathBuf,
        /// Only the cases whose name contains PATTERN, or matches it as a glob when it has `*`,
        /// `?` or `[`.
        #[arg(long, value_name = "PATTERN")]
        filter: Option<String>,
        /// human (diffs), json (one document) or junit (XML for CI systems), on stdout.
        #[arg(long, default_value = "human")]
        format: TestFormat,
        /// For each case whose results differ, show the diff and ask whether to write the results
        /// as its expectations.
        #[arg(long)]
        update: bool,
        /// With --update: write every differing case without asking (needed without a terminal).
        #[arg(long, requires = "update")]
        yes: bool,
    },
    /// Compiles a policy (default: the embedded default policy) into the artifact cache
    /// (`HANDOFF_CACHE_DIR`), so that runs load it instead of compiling it: e.g. once when an image
    /// is built. Fails when the cache folder cannot hold it.
    #[command(after_help = concat!("Example:\n  HANDOFF_CACHE_DIR=/var/cache/handoff handoff policy precompile\n\n", exit_codes!()))]
    Precompile {
        /// The `.wasm` file (default: the embedded default policy).
        file: Option<PathBuf>,
    },
    /// Writes a shipped policy component to FILE (e.g. to upload as a namespace file): default,
    /// batching, quarantine or domain-events; `--list` shows what each does.
    #[command(after_help = concat!("Example:\n  handoff policy export batching handoff/policy.wasm\n\n", exit_codes!()))]
    Export {
        /// The shipped policy: default, batching, quarantine or domain-events.
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// Where to write the `.wasm` file.
        #[arg(required_unless_present = "list")]
        file: Option<PathBuf>,
        /// List the shipped policies with their digests.
        #[arg(long, conflicts_with_all = ["name", "file"])]
        list: bool,
    },
    /// Writes the embedded default policy component to FILE (`policy export default FILE`).
    #[command(after_help = concat!("Example:\n  handoff policy export-default handoff/policy.wasm\n\n", exit_codes!()))]
    ExportDefault {
        /// Where to write the `.wasm` file.
        file: PathBuf,
    },
}

pub fn run(command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::New { name, dir, lang } => {
            let root = scaffold::scaffold(&dir, &name, lang)?;
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
            out!("created {}", root.display())?;
            Ok(())
        }
        PolicyCommand::Check {
            file,
            against: None,
            ..
        } => check_file(&file),
        PolicyCommand::Check {
            file,
            against: Some(current),
            allow_id_change,
        } => {
            let current = diff::policy_file(&current)?;
            check_file(&file)?;
            let source = PolicySource::from_file(&file)?;
            let report = diff::compare(
                &current,
                &source,
                &[handoff::kit::diff::sample_case()?],
                &[],
                "the shipped sample stream",
            )?;
            out!("diff against {}:", current.origin)?;
            diff::print(&report, TestFormat::Human, allow_id_change)
        }
        PolicyCommand::Diff(args) => diff::run(*args),
        PolicyCommand::Build { dir, watch } => {
            let once = || build::build(&dir).and_then(|wasm| check_file(&wasm));
            if !watch {
                return once();
            }
            loop {
                let seen = build::sources(&dir);
                if let Err(e) = once() {
                    let _ = writeln!(std::io::stderr(), "error: {e}");
                }
                out!("watching {} for changes (Ctrl-C to stop)", dir.display())?;
                while build::sources(&dir) == seen {
                    std::thread::sleep(build::WATCH_EVERY);
                }
            }
        }
        PolicyCommand::Test {
            policy,
            cases,
            filter,
            format,
            update,
            yes,
        } => test(policy, &cases, filter.as_deref(), format, update, yes),
        PolicyCommand::Precompile { file } => {
            let source = match &file {
                Some(path) => PolicySource::from_file(path)?,
                None => PolicySource::embedded_default(),
            };
            let dir = ArtifactCache::default_dir().ok_or_else(|| {
                HandoffError::BadInput(
                    "no cache folder: set HANDOFF_CACHE_DIR (or HOME or XDG_CACHE_HOME)".into(),
                )
            })?;
            // Loading compiles the policy, checks it against the contract and stores it.
            let runtime = Runtime::new(Some(dir))?;
            runtime.load(&source)?;
            // Only an artifact the next run will load counts.
            let cache = runtime.cache().ok_or_else(|| {
                HandoffError::Internal(anyhow::anyhow!("the runtime has no artifact cache"))
            })?;
            match cache.load(runtime.engine(), &source.sha256) {
                Lookup::Hit(_) => {
                    out!(
                        "{}  {}",
                        source.sha256,
                        cache.artifact_path(&source.sha256).display()
                    )
                }
                Lookup::Miss | Lookup::Refused => Err(HandoffError::BadInput(format!(
                    "the cache folder {} cannot hold the compiled policy (see the warning above): \
                     it must be a folder of this user's, not a symlink, writable by no one else",
                    cache.dir().display()
                ))),
            }
        }
        PolicyCommand::Export { list: true, .. } => {
            for shipped in SHIPPED {
                let source = PolicySource::shipped(shipped.name)?;
                out!(
                    "{:<13} {}  {}",
                    shipped.name,
                    source.sha256,
                    shipped.summary
                )?;
            }
            Ok(())
        }
        PolicyCommand::Export {
            name: Some(name),
            file: Some(file),
            ..
        } => export(&PolicySource::shipped(&name)?, &file),
        PolicyCommand::Export { .. } => Err(HandoffError::BadInput(
            "policy export needs NAME and FILE, or --list".into(),
        )),
        PolicyCommand::ExportDefault { file } => export(&PolicySource::embedded_default(), &file),
    }
}

/// Writes a shipped policy's bytes to `file`, creating its folder.
fn export(source: &PolicySource, file: &std::path::Path) -> Result<()> {
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| HandoffError::BadInput(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(file, &source.bytes)
        .map_err(|e| HandoffError::BadInput(format!("cannot write {}: {e}", file.display())))?;
    out!("{}  {}", source.sha256, file.display())
}

/// Prints what `policy check` finds in `file`; the refusal, if any, is the error.
fn check_file(file: &std::path::Path) -> Result<()> {
    let source = PolicySource::from_file(file)?;
    let report = check::check(&source)?;
    for line in &report.lines {
        out!("{line}")?;
    }
    match report.refusal {
        None => out!("verdict:   this host runs it"),
        Some(refusal) => {
            out!("verdict:   refused")?;
            Err(refusal)
        }
    }
}

/// How `policy test` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TestFormat {
    Human,
    Json,
    Junit,
}

/// Asks on the terminal whether to accept a case's new results.
fn confirm(case: &str) -> Result<bool> {
    let _ = write!(
        std::io::stderr(),
        "write these results as the expectations of {case}? [y/N] "
    );
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| HandoffError::BadInput(format!("cannot read the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "Yes"))
}

fn test(
    policy: Option<PathBuf>,
    cases: &std::path::Path,
    filter: Option<&str>,
    format: TestFormat,
    update: bool,
    yes: bool,
) -> Result<()> {
    use std::io::IsTerminal;
    if update && !yes && !std::io::stdin().is_terminal() {
        return Err(HandoffError::BadInput(
            "--update shows each difference and asks before writing; without a terminal to ask, add --yes"
                .into(),
        ));
    }
    let selected = Filter::parse(filter)?;
    let found = Case::discover(cases)?;
    let total = found.len();
    let chosen: Vec<Case> = found
        .into_iter()
        .filter(|c| selected.matches(&c.name))
        .collect();
    if chosen.is_empty() {
        return Err(HandoffError::BadInput(format!(
            "no case in {} matches --filter {:?} (of {total})",
            cases.display(),
            filter.unwrap_or_default()
        )));
    }
    let source = match &policy {
        Some(path) => PolicySource::from_file(path)?,
        None => PolicySource::embedded_default(),
    };
    let runtime = Runtime::new(ArtifactCache::default_dir())?;
    let loaded = runtime.load(&source)?;
    let human = format == TestFormat::Human;
    if human {
        out!("policy {} ({})", source.origin, &source.sha256[..16])?;
    }
    // Human output prints a line per case already; the machine formats keep stdout clean, so
    // their progress goes to stderr (a terminal line, or structured log lines).
    let progress = handoff::operate::progress::Progress::to(
        "policy test",
        Some(chosen.len() as u64),
        if human {
            handoff::operate::progress::Sink::Hidden
        } else {
            handoff::operate::progress::Sink::detect()
        },
    );
    let mut summary = TestSummary {
        policy: source.origin.clone(),
        policy_sha256: source.sha256.clone(),
        cases: Vec::new(),
    };
    for mut case in chosen {
        let started = std::time::Instant::now();
        let outcome = case.run(&runtime, &loaded)?;
        let seconds = started.elapsed().as_secs_f64();
        let verdict = match outcome.diff {
            None => Verdict::Passed,
            Some(diff) if update => {
                // The diff is shown before the question, whatever the format.
                let _ = writeln!(std::io::stderr(), "{} differs:\n{diff}", outcome.name);
                if yes || confirm(&outcome.name)? {
                    case.update(&outcome.actual)?;
                    Verdict::Updated { diff }
                } else {
                    Verdict::Declined { diff }
                }
            }
            Some(diff) => Verdict::Failed {
                diff,
                had_expectations: outcome.had_expectations,
            },
        };
        if human {
            match &verdict {
                Verdict::Passed => out!("ok       {}", outcome.name)?,
                Verdict::Updated { .. } => out!("updated  {}", outcome.name)?,
                Verdict::Declined { .. } => out!(
                    "FAILED   {} (update declined: nothing written)",
                    outcome.name
                )?,
                Verdict::Failed {
                    diff,
                    had_expectations,
                } => {
                    let why = if *had_expectations {
                        ""
                    } else {
                        " (no expectations yet: run with --update)"
                    };
                    out!("FAILED   {}{why}\n{diff}", outcome.name)?;
                }
            }
        }
        summary.cases.push(CaseResult {
            name: outcome.name,
            verdict,
            seconds,
        });
        progress.add(1);
    }
    progress.finish();
    match format {
        TestFormat::Human => out!("{} passed, {} failed", summary.passed(), summary.failed())?,
        TestFormat::Json => out!("{}", summary.json())?,
        TestFormat::Junit => handoff::output::write_stdout(&summary.junit()?)?,
    }
    let failed = summary.failed();
    if failed > 0 {
        return Err(HandoffError::Policy(format!(
            "{failed} case(s) did not match their expectations"
        )));
    }
    Ok(())
}
