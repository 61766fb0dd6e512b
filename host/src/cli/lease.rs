//! `handoff lease`: the audited lease commands.

use clap::{Args, Subcommand};

use super::args::{AuditArgs, TargetArgs, ViewArgs, reason_text};
use handoff::backend::mongo::Connection;
use handoff::error::Result;
use handoff::operate::lease;

#[derive(Subcommand)]
pub enum LeaseCommand {
    /// Gives back the lease a run that died left on its consumer, so that the next run or a reset
    /// need not wait for it to run out: a compare-and-set from the lease it reads, written with
    /// its audit record in one transaction. A run that is in fact alive loses its next commit
    /// (exit 3), never an event.
    #[command(after_help = concat!(
        "Look first: `handoff status` shows the lease's owner and end.\n\n",
        "Example:\n",
        "  handoff lease release --consumer-id orders-to-outbox --owner 'handoff@worker-3:4242:18c0.0' \\\n",
        "      --reason 'worker-3 was lost with its pod'\n\n",
        exit_codes!(),
    ))]
    Release(ReleaseArgs),
}

#[derive(Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    audit: AuditArgs,
    #[command(flatten)]
    view: ViewArgs,
    /// Release the lease only if this owner holds it (as `handoff status` shows it).
    #[arg(long)]
    owner: Option<String>,
    /// Why the lease is released (kept in the audit record).
    #[arg(long)]
    reason: String,
}

pub fn run(command: LeaseCommand) -> Result<()> {
    let LeaseCommand::Release(args) = command;
    let inputs = args.target.inputs()?;
    let audit = args.audit.collection(&inputs)?;
    let reason = reason_text("--reason", &args.reason)?;
    let target = args.target.moved(&inputs, &audit)?;
    let connection = Connection::connect(args.target.uri()?)?;
    let released = connection
        .register_state(&inputs.database, &[&inputs.checkpoint_collection, &audit])
        .and_then(|()| lease::release(&connection, &target, args.owner.as_deref(), &reason));
    connection.close();
    let released = released?;
    if args.view.json {
        out!("{}", released.to_json())
    } else {
        handoff::output::write_stdout(&released.human())
    }
}
