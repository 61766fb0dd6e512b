//! `handoff record --out FILE.jsonl`: a live change stream captured as a policy test fixture.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::args::InputArgs;
use crate::cli::env;
use handoff::backend::mongo::{Connection, MongoSource};
use handoff::domain::StreamConfig;
use handoff::error::Result;
use handoff::kit::record::{Recording, check_redactions, record};

#[derive(Args)]
#[command(after_help = concat!(
    "Example:\n  MONGODB_URI='mongodb://db1/?replicaSet=rs0' handoff record --out cases/busy/stream.jsonl \\\n",
    "      --collection orders --redact fullDocument.email --max-events 100\n\n",
    exit_codes!(),
))]
pub struct RecordArgs {
    /// Where to write the recording (JSON Lines, the fixture format).
    #[arg(long)]
    pub out: PathBuf,
    /// The replica set's connection string (never printed or logged).
    #[arg(long, env = env::MONGODB_URI, hide_env_values = true)]
    pub uri: String,
    /// A field path to replace with "<redacted>" in every event (repeatable), e.g. fullDocument.email.
    #[arg(long)]
    pub redact: Vec<String>,
    #[command(flatten)]
    pub inputs: InputArgs,
}

pub fn run(args: RecordArgs) -> Result<()> {
    let inputs = args.inputs.validate()?;
    check_redactions(&args.redact)?;
    let connection = Connection::connect(&args.uri)?;
    let recording = Recording {
        database: &inputs.database,
        collection: &inputs.collection,
        max_events: inputs.max_events,
        max_wait: Duration::from_secs(u64::from(inputs.max_wait_seconds)),
        redact: &args.redact,
    };
    let mut source = MongoSource::new(
        connection.clone(),
        &inputs.database,
        &inputs.collection,
        &inputs.collections(),
        &StreamConfig::default(),
    );
    let recorded = record(&mut source, &recording, &args.out);
    drop(source);
    connection.close();
    let count = recorded?;
    let _ = writeln!(
        std::io::stderr(),
        "recorded {count} event(s) into {}",
        args.out.display()
    );
    Ok(())
}
