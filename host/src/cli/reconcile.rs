//! `handoff reconcile`: the source compared with the outbox.

use clap::Args;

use super::args::{AuditArgs, TargetArgs, ViewArgs};
use handoff::error::{HandoffError, Result};

#[derive(Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub audit: AuditArgs,
    #[command(flatten)]
    pub view: ViewArgs,
}

pub fn run(_args: ReconcileArgs) -> Result<()> {
    Err(HandoffError::BadInput(
        "reconcile is not available in this build".into(),
    ))
}
