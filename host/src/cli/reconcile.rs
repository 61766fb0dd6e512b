//! `handoff reconcile`: the source compared with the outbox.

use clap::Args;

use super::args::{CompareArgs, SnapshotRunArgs, reason_text};
use handoff::backend::mongo::Connection;
use handoff::error::{HandoffError, Result};
use handoff::operate::progress::Sink;
use handoff::operate::reconcile::{self, Options};
use handoff::operate::report::Page;

#[derive(Args)]
#[command(after_help = concat!(
    "For every document key, the outbox's latest record (by position; backfill snapshot and \
correction records count) says what the document is now. Reported:\n  \
missing   in the source, absent per the outbox\n  \
orphan    present per the outbox, not in the source\n  \
stale     in both, different (field order does not count)\n  \
held      differing, but the consumer's policy (--policy, --policy-param, as for `handoff run`; \
built against contract 1.3 or later) would quarantine or skip the document as it is now: what \
the policy produced, so not a difference\n  \
in flight changed in the stream after the consumer's checkpoint: the next run hands them off, \
so they are counted apart and never as differences (the stream is read from the checkpoint to \
the current position before the source is read and again after)\n\
Read-only unless --repair is given; the checkpoint is never touched. Keys are printed as relaxed \
Extended JSON, never whole documents.\n\n\
Examples:\n  handoff reconcile --json\n  handoff reconcile --since 2026-12-01T00:00:00Z\n  \
handoff reconcile --repair --reason \"outbox restored from backup\"\n\n\
Exit 16 means differences were found; with --repair, exit 0 means those found were handed off \
as correction records (run reconcile again to verify). Exit 3 means too many keys are in flight \
(--max-in-flight) or the collection was dropped after the checkpoint: run the consumer first.\n\n",
    exit_codes!()
))]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub run: SnapshotRunArgs,
    #[command(flatten)]
    pub compare: CompareArgs,
    /// Only keys whose latest outbox record is at or after T (a cluster time `SECONDS[.INCREMENT]`
    /// or an RFC 3339 date): those are looked up in the source (missing when the outbox says
    /// absent, stale, orphan). The rest of the source is not read, so documents never handed off
    /// at all are found only without --since.
    #[arg(long, value_name = "T")]
    pub since: Option<String>,
    /// Hand every missing, stale and orphan key's document as it is now (operation type
    /// `snapshot`, a fresh position; `fullDocument` null for an orphan) to the consumer's
    /// policy, and write the records it hands off, in transactions of 100, with an audit
    /// record. Needs --reason.
    #[arg(long, requires = "reason")]
    pub repair: bool,
    /// Why the repair is made (1-500 printable characters), kept in the audit record.
    #[arg(long, requires = "repair", value_name = "TEXT")]
    pub reason: Option<String>,
    /// Also write the report as a self-contained HTML page to this file (checked before
    /// anything is read or written: its directory must exist and be writable).
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
}

impl ReconcileArgs {
    /// The options, checked: nothing is read or written before they are.
    fn options(&self) -> Result<Options> {
        let inputs = self.run.target.inputs()?;
        self.run.target.one_collection("reconcile")?;
        let audit = self.run.audit.collection(&inputs)?;
        let since = self
            .since
            .as_deref()
            .map(reconcile::parse_since)
            .transpose()
            .map_err(|why| HandoffError::BadInput(format!("--since: {why}")))?;
        let repair = match (&self.repair, &self.reason) {
            (true, Some(reason)) => Some(reason_text("--reason", reason)?),
            (true, None) => {
                return Err(HandoffError::BadInput("--repair needs --reason".into()));
            }
            (false, _) => None,
        };
        let mut command = String::from("reconcile");
        if let Some(since) = since {
            command.push_str(&format!(" --since {}", reconcile::time_text(since)));
        }
        if repair.is_some() {
            command.push_str(" --repair");
        }
        Ok(Options {
            database: inputs.database,
            collection: inputs.collection,
            consumer: inputs.consumer_id,
            checkpoints: inputs.checkpoint_collection,
            outbox: inputs.outbox_collection,
            quarantine: inputs.quarantine_collection,
            audit,
            limit: self.compare.limit as usize,
            chunk_size: self.compare.chunk_size,
            max_in_flight: self.compare.max_in_flight as usize,
            since,
            repair,
            command,
            progress: Sink::detect(),
        })
    }
}

pub fn run(args: ReconcileArgs) -> Result<()> {
    let options = args.options()?;
    if let Some(path) = &args.html {
        Page::check_path(path)?;
    }
    let deciding = args.run.deciding.load("reconcile")?;
    let connection = Connection::connect(args.run.target.uri()?)?;
    let snapshots = deciding.snapshots(
        handoff::session::RunKind::Repair,
        &options.consumer,
        &options.database,
        &options.collection,
        connection.deployment(),
    );
    let outcome = reconcile::reconcile(&connection, &options, &snapshots);
    // The report's charts of the consumer's runs, read once the comparison is done.
    let charts = match (&outcome, &args.html) {
        (Ok(_), Some(_)) => handoff::operate::status::read_charts(
            &connection,
            &options.database,
            &options.checkpoints,
            &args.run.target.consumer.runs_collection,
            &options.consumer,
        ),
        _ => Vec::new(),
    };
    connection.close();
    let report = outcome?;
    // The HTML report is written whatever became of stdout.
    let printed = if args.run.view.json {
        out!("{}", report.to_json())
    } else {
        handoff::output::write_stdout(&report.human())
    };
    if let Some(path) = &args.html {
        report.html(charts).write(path)?;
    }
    printed?;
    let differences = report.differences();
    if differences > 0 && report.repair.is_none() {
        return Err(HandoffError::Attention(format!(
            "{differences} keys differ ({} missing, {} orphan, {} stale); \
             `handoff reconcile --repair --reason TEXT` hands off correction records",
            report.missing.count, report.orphan.count, report.stale.count
        )));
    }
    Ok(())
}
