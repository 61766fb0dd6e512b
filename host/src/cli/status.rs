//! `handoff status`: a consumer's position, lag and oplog margin.

use clap::Args;

use super::args::{TargetArgs, ViewArgs};
use handoff::error::{HandoffError, Result};

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub view: ViewArgs,
}

pub fn run(_args: StatusArgs) -> Result<()> {
    Err(HandoffError::BadInput(
        "status is not available in this build".into(),
    ))
}
