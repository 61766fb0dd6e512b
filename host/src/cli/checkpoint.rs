//! `handoff checkpoint`: the audited checkpoint commands.

use clap::{ArgGroup, Args, Subcommand};

use super::args::{AuditArgs, TargetArgs, ViewArgs, reason_text};
use handoff::backend::mongo::Connection;
use handoff::domain::Mode;
use handoff::domain::position::parse_time;
use handoff::error::{HandoffError, Result};
use handoff::operate::reset::{self, To};

#[derive(Subcommand)]
pub enum CheckpointCommand {
    /// Moves a consumer's checkpoint: a compare-and-set from the checkpoint it reads, refused
    /// while a run holds the consumer, written with its audit record in one transaction.
    #[command(after_help = concat!(
        "Skipping history loses the changes in it: look first (`handoff status`, `--dry-run`), and\n",
        "reconcile after (`handoff reconcile --repair`).\n\n",
        "Example:\n",
        "  handoff checkpoint reset --consumer-id orders-to-outbox --to now --reason 'history lost, INC-42' --dry-run\n",
        "  handoff checkpoint reset --consumer-id orders-to-outbox --to-time 2026-11-30T08:00:00Z --reason 'replay the morning'\n\n",
        exit_codes!(),
    ))]
    Reset(ResetArgs),
}

#[derive(Args)]
#[command(group(ArgGroup::new("position").required(true).args(["to", "to_time", "to_token"])))]
pub struct ResetArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    audit: AuditArgs,
    #[command(flatten)]
    view: ViewArgs,
    /// `now`: the stream's current position (everything before is skipped).
    #[arg(long, value_parser = ["now"])]
    to: Option<String>,
    /// Just before this cluster time: `SECONDS[.INCREMENT]` or an RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    to_time: Option<String>,
    /// A resume token, as Extended JSON (`{"_data": "…"}`).
    #[arg(long, value_name = "JSON")]
    to_token: Option<String>,
    /// The mode to resume a `--to-token` with.
    #[arg(long, value_parser = ["resumeAfter", "startAfter"], default_value = "resumeAfter")]
    mode: String,
    /// Why the checkpoint moves (kept in the audit record).
    #[arg(long)]
    reason: Option<String>,
    /// Accept a position after the deployment's present (every event until then is skipped);
    /// refused without it.
    #[arg(long)]
    allow_future: bool,
    /// Show what would change and the gap it creates; write nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(command: CheckpointCommand) -> Result<()> {
    match command {
        CheckpointCommand::Reset(args) => reset_checkpoint(args),
    }
}

fn reset_checkpoint(args: ResetArgs) -> Result<()> {
    let inputs = args.target.inputs()?;
    let audit = args.audit.collection(&inputs)?;
    let reason = match (&args.reason, args.dry_run) {
        (Some(reason), _) => reason_text("--reason", reason)?,
        (None, true) => String::new(),
        (None, false) => {
            return Err(HandoffError::BadInput(
                "--reason is required: say why the checkpoint moves (it is kept in the audit record)"
                    .into(),
            ));
        }
    };
    let to = if args.to.is_some() {
        To::Now
    } else if let Some(time) = &args.to_time {
        To::Time(parse_time(time).ok_or_else(|| {
            HandoffError::BadInput(
                "--to-time must be SECONDS[.INCREMENT] or an RFC 3339 time (2026-11-30T08:00:00Z)"
                    .into(),
            )
        })?)
    } else {
        let text = args.to_token.as_deref().unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|_| HandoffError::BadInput("--to-token must be a JSON document".into()))?;
        let token = match bson::Bson::try_from(value) {
            Ok(bson::Bson::Document(token)) => token,
            _ => {
                return Err(HandoffError::BadInput(
                    "--to-token must be an Extended JSON document".into(),
                ));
            }
        };
        let mode = Mode::parse(&args.mode).ok_or_else(|| {
            HandoffError::BadInput("--mode must be resumeAfter or startAfter".into())
        })?;
        To::Token(token, mode)
    };
    let target = args.target.moved(&inputs, &audit)?;
    let connection = Connection::connect(args.target.uri()?)?;
    let done = (|| {
        let ahead = if args.allow_future {
            reset::Ahead::Allow
        } else {
            reset::Ahead::Refuse
        };
        let plan = reset::plan(&connection, &target, to, ahead)?;
        if !args.dry_run {
            connection
                .register_state(&inputs.database, &[&inputs.checkpoint_collection, &audit])?;
            reset::apply(&connection, &target, &plan, &reason)?;
        }
        Ok::<_, HandoffError>(plan)
    })();
    connection.close();
    let plan = done?;
    if args.view.json {
        let mut value = plan.to_json();
        value["applied"] = serde_json::json!(!args.dry_run);
        out!("{value}")?;
    } else {
        for (label, value) in plan.rows() {
            out!("{label:<10} {value}")?;
        }
        out!(
            "{:<10} {}",
            "result",
            if args.dry_run && plan.refusal().is_some() {
                "dry run: nothing written; the reset would be refused now (see refused)"
            } else if args.dry_run {
                "dry run: nothing written"
            } else {
                "checkpoint moved; audit record written"
            }
        )?;
    }
    Ok(())
}
