//! `handoff inspect --state PATH`: the checkpoint, then every outbox record, then every
//! quarantine record, each in commit order, as relaxed Extended JSON, one object per line.

use std::path::PathBuf;
use std::time::Duration;

use bson::Bson;
use clap::Args;

use handoff::backend::redb_store::RedbStore;
use handoff::domain::{CheckpointStore, Collections};
use handoff::error::{HandoffError, Result};
use handoff::run::inputs::valid_name;

use super::args::ConsumerArgs;
use crate::cli::env;

#[derive(Args)]
#[command(after_help = concat!(
    "Example:\n  handoff inspect --state /tmp/demo.redb | head -1   # the checkpoint\n\n",
    exit_codes!(),
))]
pub struct InspectArgs {
    /// The embedded state store.
    #[arg(long)]
    pub state: PathBuf,
    #[command(flatten)]
    pub consumer: ConsumerArgs,
}

pub fn run(args: InspectArgs) -> Result<()> {
    let c = args.consumer;
    for (key, value) in [
        (env::CONSUMER_ID, &c.consumer_id),
        (env::CHECKPOINT_COLLECTION, &c.checkpoint_collection),
        (env::OUTBOX_COLLECTION, &c.outbox_collection),
        (env::QUARANTINE_COLLECTION, &c.quarantine_collection),
    ] {
        if !valid_name(value) {
            return Err(HandoffError::BadInput(format!(
                "{key} must contain 1-63 letters, digits, underscores or hyphens and start with a letter"
            )));
        }
    }
    if !args.state.exists() {
        return Err(HandoffError::BadInput(format!(
            "no state store at {}",
            args.state.display()
        )));
    }
    let collections = Collections {
        checkpoints: c.checkpoint_collection.clone(),
        outbox: c.outbox_collection,
        quarantine: c.quarantine_collection,
    };
    let store = RedbStore::open(&args.state, &collections, Duration::from_secs(10))?;
    let dump = store
        .dump(&c.consumer_id)
        .map_err(|e| HandoffError::Unavailable(e.to_string()))?;
    // A consumer the store knows nothing of is a typo, not an empty listing.
    if dump.checkpoint.is_none() && dump.outbox.is_empty() && dump.quarantine.is_empty() {
        let known = store.consumers(1000)?;
        let hint = handoff::domain::text::known_names_hint(
            &c.consumer_id,
            &known,
            &c.checkpoint_collection,
        );
        return Err(HandoffError::BadInput(format!(
            "no consumer {} in {}{hint}",
            c.consumer_id,
            args.state.display()
        )));
    }
    // Written in pieces, so that a reader that has gone (`| head -1`) ends the listing early.
    let mut text = String::new();
    for doc in dump
        .checkpoint
        .into_iter()
        .chain(dump.outbox)
        .chain(dump.quarantine)
    {
        text.push_str(&Bson::Document(doc).into_relaxed_extjson().to_string());
        text.push('\n');
        if text.len() >= 64 * 1024 {
            handoff::output::write_stdout(&text)?;
            text.clear();
            if handoff::output::reader_gone() {
                return Ok(());
            }
        }
    }
    handoff::output::write_stdout(&text)
}
