//! `handoff backfill`: the collection's documents handed off beside the stream.

use std::time::Duration;

use clap::Args;

use super::args::{SnapshotRunArgs, reason_text};
use crate::cli::env;
use handoff::backend::mongo::Connection;
use handoff::error::{HandoffError, Result};
use handoff::operate::backfill::{
    Backfill, DEFAULT_CHUNK_SIZE, DEFAULT_SIGNAL_COLLECTION, DEFAULT_STATE_COLLECTION, Options,
};
use handoff::run::inputs::valid_name;

#[derive(Args)]
#[command(after_help = concat!(
    "Each chunk (by _id) is read between a low and a high watermark written to the signal \
     collection and seen in the database's change stream; a stream event for a key of the chunk \
     supersedes its row. The other rows reach the consumer's policy (--policy, --policy-param, \
     as for `handoff run`; built against contract 1.3 or later) as events of operationType \
     \"snapshot\", which it hands off, shapes, skips or quarantines like any event. Its records \
     and the saved position are committed in one transaction: a killed backfill resumes from its last chunk. \
     `handoff run` keeps streaming the consumer meanwhile. A consumer without a checkpoint (or \
     with a null token) is started at the stream's current position first, with the default \
     stream configuration: run `handoff run` once before a backfill to bind another one.\n\n\
     The saved position is one document per consumer in the state collection ({_id: consumer, \
     source, last_key, chunks, rows, dropped, started_at, updated_at, done}). Each invocation \
     that commits (a start, a resume, a --restart) writes one audit record, in the transaction \
     of its first chunk.\n\n",
    "Example:\n  handoff backfill --consumer-id orders-to-outbox --reason \"new consumer\" --max-rate 2000\n\n",
    exit_codes!()
))]
pub struct BackfillArgs {
    #[command(flatten)]
    pub run: SnapshotRunArgs,
    /// Why (recorded in the audit record).
    #[arg(long, value_name = "REASON", required = true)]
    pub reason: String,
    /// Documents per chunk (per transaction).
    #[arg(long, default_value_t = DEFAULT_CHUNK_SIZE, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub chunk_size: u32,
    /// At most this many documents per second.
    #[arg(long, value_name = "DOCS_PER_SECOND", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub max_rate: Option<u64>,
    /// Collection of the low and high watermark documents.
    #[arg(long, env = env::SIGNAL_COLLECTION, default_value = DEFAULT_SIGNAL_COLLECTION)]
    pub signal_collection: String,
    /// Collection of the backfill's saved position (one document per consumer).
    #[arg(long, env = env::BACKFILL_STATE_COLLECTION, default_value = DEFAULT_STATE_COLLECTION)]
    pub state_collection: String,
    /// Start over from the first document, whatever the saved position says (audited).
    #[arg(long)]
    pub restart: bool,
    /// How long a chunk waits for its watermarks in the change stream, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub watermark_timeout_seconds: u64,
}

impl BackfillArgs {
    /// The checked options: nothing is read or written before they are.
    fn options(&self) -> Result<Options> {
        let t = &self.run.target;
        t.one_collection("backfill")?;
        // The source and the collections written here must all differ (the state may share the
        // signal collection: their documents' _ids differ in type).
        let written = [
            ("--checkpoint-collection", &t.consumer.checkpoint_collection),
            ("--outbox-collection", &t.consumer.outbox_collection),
            ("--quarantine-collection", &t.consumer.quarantine_collection),
            ("--signal-collection", &self.signal_collection),
            ("--state-collection", &self.state_collection),
            ("--audit-collection", &self.run.audit.audit_collection),
        ];
        let names = [
            ("--database", &t.database),
            ("--collection", &t.collection),
            ("--consumer-id", &t.consumer.consumer_id),
        ];
        for (flag, value) in names.into_iter().chain(written) {
            if !valid_name(value) {
                return Err(HandoffError::BadInput(format!(
                    "{flag} must contain 1-63 letters, digits, underscores or hyphens and start with a letter"
                )));
            }
        }
        for (flag, value) in written {
            if *value == t.collection {
                return Err(HandoffError::BadInput(format!(
                    "{flag} must differ from the watched collection"
                )));
            }
        }
        for (i, (a, x)) in written.iter().enumerate() {
            for (b, y) in &written[i + 1..] {
                let shared = (*a == "--signal-collection" && *b == "--state-collection")
                    || (*a == "--state-collection" && *b == "--signal-collection");
                if x == y && !shared {
                    return Err(HandoffError::BadInput(format!("{a} and {b} must differ")));
                }
            }
        }
        let reason = reason_text("--reason", &self.reason)?;
        let mut command = format!(
            "handoff backfill --database {} --collection {} --consumer-id {} --chunk-size {}",
            t.database, t.collection, t.consumer.consumer_id, self.chunk_size
        );
        if let Some(rate) = self.max_rate {
            command.push_str(&format!(" --max-rate {rate}"));
        }
        if self.restart {
            command.push_str(" --restart");
        }
        Ok(Options {
            database: t.database.clone(),
            collection: t.collection.clone(),
            consumer: t.consumer.consumer_id.clone(),
            checkpoint_collection: t.consumer.checkpoint_collection.clone(),
            outbox_collection: t.consumer.outbox_collection.clone(),
            quarantine_collection: t.consumer.quarantine_collection.clone(),
            signal_collection: self.signal_collection.clone(),
            state_collection: self.state_collection.clone(),
            audit_collection: self.run.audit.audit_collection.clone(),
            chunk_size: self.chunk_size,
            max_rate: self.max_rate.map(|r| r as f64),
            watermark_timeout: Duration::from_secs(self.watermark_timeout_seconds),
            restart: self.restart,
            reason: reason.to_string(),
            command,
        })
    }
}

pub fn run(args: BackfillArgs) -> Result<()> {
    let options = args.options()?;
    let deciding = args.run.deciding.load("backfill")?;
    let connection = Connection::connect(args.run.target.uri()?)?;
    let snapshots = deciding.snapshots(
        handoff::session::RunKind::Backfill,
        &options.consumer,
        &options.database,
        &options.collection,
        connection.deployment(),
    );
    let outcome = Backfill::new(&connection, options, &snapshots).run();
    connection.close();
    let summary = outcome?;
    if args.run.view.json {
        out!("{}", summary.to_json())
    } else {
        handoff::output::write_stdout(&summary.human())
    }
}
