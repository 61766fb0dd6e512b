//! `handoff record --out FILE.jsonl`: a live change stream captured as a policy test fixture;
//! `handoff record --case DIR`: captured as a complete policy test case.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::args::InputArgs;
use crate::cli::env;
use handoff::backend::mongo::{Connection, MongoSource};
use handoff::domain::StreamConfig;
use handoff::error::{HandoffError, Result};
use handoff::kit::cases::Case;
use handoff::kit::record::{Recording, record};
use handoff::kit::redact;
use handoff::runtime::cache::ArtifactCache;
use handoff::runtime::{PolicySource, Runtime};

#[derive(Args)]
#[command(after_help = concat!(
    "Example:\n  MONGODB_URI='mongodb://db1/?replicaSet=rs0' handoff record --case cases/busy \\\n",
    "      --collection orders --redact email --max-events 100\n",
    "  handoff policy test cases/\n",
    "  MONGODB_URI='mongodb://db1/?replicaSet=rs0' handoff record --out busy.jsonl --collection orders\n",
    "  handoff replay busy.jsonl --state /tmp/busy.redb\n\n",
    exit_codes!(),
))]
#[command(group(clap::ArgGroup::new("into").required(true).args(["out", "case"])))]
pub struct RecordArgs {
    /// Where to write the recording (JSON Lines, the fixture format).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Record into a new test case folder: its stream.jsonl, and a case.json whose expectations
    /// are what the policy (--policy, default: the embedded default) does with the recording.
    #[arg(long, value_name = "DIR")]
    pub case: Option<PathBuf>,
    /// With --case: the policy whose results become the case's expectations.
    #[arg(long, requires = "case")]
    pub policy: Option<PathBuf>,
    /// The replica set's connection string (never printed or logged).
    #[arg(long, env = env::MONGODB_URI, hide_env_values = true)]
    pub uri: String,
    /// A field of the watched documents to replace with "<redacted>" wherever an event carries
    /// it: full document, pre-image, document key and an update's changed fields (dotted and
    /// array paths too). Repeatable; e.g. email, profile.email, items.email or fullDocument.email.
    #[arg(long)]
    pub redact: Vec<String>,
    #[command(flatten)]
    pub inputs: InputArgs,
}

pub fn run(args: RecordArgs) -> Result<()> {
    let inputs = args.inputs.validate()?;
    let redactions = redact::parse_all(&args.redact)?;
    // The policy is loaded before anything is recorded: a bad one wastes no traffic.
    let policy = match &args.case {
        Some(dir) => {
            if dir.join("case.json").exists() {
                return Err(HandoffError::BadInput(format!(
                    "{} holds a case already: choose a new case folder",
                    dir.display()
                )));
            }
            let source = match &args.policy {
                Some(path) => PolicySource::from_file(path)?,
                None => PolicySource::embedded_default(),
            };
            let runtime = Runtime::new(ArtifactCache::default_dir())?;
            let loaded = runtime.load(&source)?;
            Some((runtime, loaded, source.origin))
        }
        None => None,
    };
    let Some(out) =
        (args.out.clone()).or_else(|| args.case.as_ref().map(|d| d.join("stream.jsonl")))
    else {
        return Err(HandoffError::BadInput(
            "record needs --out FILE or --case DIR".into(),
        ));
    };
    let connection = Connection::connect(&args.uri)?;
    let recording = Recording {
        database: &inputs.database,
        collection: &inputs.collection,
        max_events: inputs.max_events,
        max_wait: Duration::from_secs(u64::from(inputs.max_wait_seconds)),
        redact: &redactions,
    };
    let mut source = MongoSource::new(
        connection.clone(),
        &inputs.database,
        &inputs.collection,
        &inputs.collections(),
        &StreamConfig::default(),
    );
    let recorded = record(&mut source, &recording, &out);
    drop(source);
    connection.close();
    let count = recorded?;
    let _ = writeln!(
        std::io::stderr(),
        "recorded {count} event(s) into {}",
        out.display()
    );
    if let (Some(dir), Some((runtime, policy, origin))) = (&args.case, policy) {
        let description = format!(
            "{count} event(s) recorded from {}.{}, expectations from {origin}",
            inputs.database, inputs.collection
        );
        // A case that cannot be completed leaves no half of it behind.
        if let Err(error) = Case::create(dir, &description, &runtime, &policy) {
            let _ = std::fs::remove_file(dir.join("case.json"));
            let _ = std::fs::remove_file(&out);
            return Err(error);
        }
        let _ = writeln!(
            std::io::stderr(),
            "wrote the case {} (run `handoff policy test {}`)",
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}
