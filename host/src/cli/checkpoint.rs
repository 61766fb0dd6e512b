//! `handoff checkpoint`: the audited checkpoint commands.

use clap::Subcommand;

use super::args::{AuditArgs, TargetArgs};
use handoff::error::{HandoffError, Result};

#[derive(Subcommand)]
pub enum CheckpointCommand {
    /// Moves a consumer's checkpoint (audited compare-and-set).
    Reset {
        #[command(flatten)]
        target: TargetArgs,
        #[command(flatten)]
        audit: AuditArgs,
    },
}

pub fn run(_command: CheckpointCommand) -> Result<()> {
    Err(HandoffError::BadInput(
        "checkpoint reset is not available in this build".into(),
    ))
}
