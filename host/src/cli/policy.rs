//! `handoff policy …`: working with policy components.

use std::path::PathBuf;

use clap::Subcommand;

use crate::error::{HandoffError, Result};
use crate::runtime::PolicySource;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Writes the embedded default policy component to FILE (e.g. to upload as a namespace file).
    ExportDefault {
        /// Where to write the `.wasm` file.
        file: PathBuf,
    },
}

pub fn run(command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::ExportDefault { file } => {
            let source = PolicySource::embedded_default();
            if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    HandoffError::BadInput(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            std::fs::write(&file, &source.bytes).map_err(|e| {
                HandoffError::BadInput(format!("cannot write {}: {e}", file.display()))
            })?;
            println!("{}  {}", source.sha256, file.display());
            Ok(())
        }
    }
}
