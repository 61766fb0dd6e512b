//! `handoff backfill`: the collection's documents handed off beside the stream.

use clap::Args;

use super::args::{AuditArgs, TargetArgs, ViewArgs};
use handoff::error::{HandoffError, Result};

#[derive(Args)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub audit: AuditArgs,
    #[command(flatten)]
    pub view: ViewArgs,
}

pub fn run(_args: BackfillArgs) -> Result<()> {
    Err(HandoffError::BadInput(
        "backfill is not available in this build".into(),
    ))
}
