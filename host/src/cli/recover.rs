//! `handoff recover`: after lost history, the checkpoint moved to now and the outbox repaired
//! through the policy, in one audited command.

use clap::Args;

use super::args::{CompareArgs, SnapshotRunArgs, reason_text};
use handoff::backend::mongo::Connection;
use handoff::domain::config::Scope;
use handoff::error::{HandoffError, Result};
use handoff::operate::progress::Sink;
use handoff::operate::reconcile;
use handoff::operate::recover::{self, Options};
use handoff::output::shell_word;

#[derive(Args)]
#[command(after_help = concat!(
    "For a consumer whose runs fail with history lost (exit 6), an invalid token (7) or a fatal \
stream (8). In one command, what `handoff checkpoint reset --to now` then `handoff reconcile \
--repair` do by hand:\n  \
1. the stream is resumed from the checkpoint as a run would: a consumer it still resumes, with \
no recovery in progress, has nothing to recover (exit 2, nothing written);\n  \
2. the checkpoint moves to the stream's current position (a compare-and-set, refused while a run \
holds the lease) and records the recovery (`recovering`: when, why, the lost window), with an \
audit record, in one transaction;\n  \
3. the collection is compared with the outbox from there on, and every document the outbox no \
longer describes is handed to the consumer's policy (--policy, --policy-param, as for `handoff \
run`) and its records written, as `reconcile --repair` does (keys changed after the new position \
are in flight: the next run hands them off);\n  \
4. the recovery's record is cleared, with an audit record of what was repaired.\n\
A recovery stopped between 2 and 4 (killed, or a failure) stays recorded: `handoff status` shows \
it, and `handoff recover` again completes the repair without moving the checkpoint again. A \
repair whose own writes outran the oplog fails with exit 6, the recovery still recorded: run \
again, it moves the checkpoint again and repairs what changed since. \
Consumers of a partition, a pipeline or a wider --scope are refused (reconcile cannot compare \
them), naming the commands that serve them. --dry-run shows the lost window and the move (for a \
recovery in progress, what its repair would write) and writes nothing.\n\n\
Example:\n  handoff recover --consumer-id orders-to-outbox --reason \"INC-42: oplog too small\" --dry-run\n  \
handoff recover --consumer-id orders-to-outbox --reason \"INC-42: oplog too small\"\n  \
handoff run --consumer-id orders-to-outbox\n\n",
    exit_codes!()
))]
pub struct RecoverArgs {
    #[command(flatten)]
    pub run: SnapshotRunArgs,
    /// Why (1-500 printable characters), kept in the checkpoint's record of the recovery and in
    /// the audit records. Required unless --dry-run.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Show what would be done; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub compare: CompareArgs,
}

impl RecoverArgs {
    /// The options, checked: nothing is read or written before they are.
    fn options(&self) -> Result<Options> {
        let target = &self.run.target;
        let inputs = target.inputs()?;
        let scope = target.scope()?;
        let flags = target.flags(&inputs, scope);
        if scope != Scope::Collection {
            return Err(HandoffError::BadInput(format!(
                "recover repairs the documents of one collection as reconcile does, and this \
                 consumer streams a whole {} (--scope {}): {}",
                scope.as_str(),
                scope.as_str(),
                recover::by_hand(&flags)
            )));
        }
        let audit = self.run.audit.collection(&inputs)?;
        let reason = match (&self.reason, self.dry_run) {
            (Some(reason), _) => reason_text("--reason", reason)?,
            (None, true) => String::new(),
            (None, false) => {
                return Err(HandoffError::BadInput(
                    "--reason is required: say why the consumer is recovered (it is kept in the \
                     checkpoint and the audit records)"
                        .into(),
                ));
            }
        };
        // After a dry run, the recovery itself; after a recovery, the consumer's next run.
        let mut next = if self.dry_run {
            let why = if reason.is_empty() { "<why>" } else { &reason };
            format!("handoff recover {flags} --reason {}", shell_word(why))
        } else {
            format!("handoff run {flags}")
        };
        let policy = &self.run.deciding.policy;
        if let Some(path) = &policy.policy {
            next.push_str(&format!(
                " --policy {}",
                shell_word(&path.display().to_string())
            ));
        }
        // The parameters' values are not printed: give them as this command was given them.
        for param in &policy.params {
            let key = param.split_once('=').map_or(param.as_str(), |(key, _)| key);
            next.push_str(&format!(
                " --policy-param {}",
                shell_word(&format!("{key}=<value>"))
            ));
        }
        Ok(Options {
            reconcile: reconcile::Options {
                database: inputs.database.clone(),
                collection: inputs.collection.clone(),
                consumer: inputs.consumer_id.clone(),
                checkpoints: inputs.checkpoint_collection.clone(),
                outbox: inputs.outbox_collection.clone(),
                quarantine: inputs.quarantine_collection.clone(),
                audit,
                limit: self.compare.limit as usize,
                chunk_size: self.compare.chunk_size,
                max_in_flight: self.compare.max_in_flight as usize,
                since: None,
                repair: (!self.dry_run).then(|| reason.clone()),
                command: format!("recover --consumer-id {}: the repair", inputs.consumer_id),
                progress: Sink::detect(),
            },
            reason,
            dry_run: self.dry_run,
            flags,
            next,
        })
    }
}

pub fn run(args: RecoverArgs) -> Result<()> {
    let options = args.options()?;
    let deciding = args.run.deciding.load("recover")?;
    let connection = Connection::connect(args.run.target.uri()?)?;
    let o = &options.reconcile;
    let snapshots = deciding.snapshots(
        handoff::session::RunKind::Repair,
        &o.consumer,
        &o.database,
        &o.collection,
        connection.deployment(),
    );
    let outcome = recover::recover(&connection, &options, &snapshots);
    connection.close();
    let recovery = outcome?;
    if args.run.view.json {
        out!("{}", recovery.to_json())
    } else {
        handoff::output::write_stdout(&recovery.human())
    }
}
