//! The outputs as one JSON object in a file (`--outputs-file`), for engines that read a file:
//! written to a temporary file in the same folder, flushed to disk, then renamed over the path,
//! so a reader sees the previous file or the whole new one, never a part.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::RunOutputs;
use handoff_domain::error::{HandoffError, Result};

/// Where the outputs file goes.
#[derive(Clone, Debug)]
pub struct OutputsFile {
    path: PathBuf,
}

impl OutputsFile {
    /// Checks, before the run, that the file can be written where asked: its folder exists and
    /// it is not a folder itself. The outputs of an earlier run at that path are removed, so that
    /// an engine never reads them as this run's if this one ends without writing (killed, say).
    pub fn new(path: &Path) -> Result<OutputsFile> {
        let bad = |what: &str| {
            HandoffError::BadInput(format!("--outputs-file {}: {what}", path.display()))
        };
        if path.as_os_str().is_empty() {
            return Err(bad("an empty path"));
        }
        if path.is_dir() {
            return Err(bad("is a folder"));
        }
        let folder = folder_of(path);
        if !folder.is_dir() {
            return Err(bad("its folder does not exist"));
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(bad(&format!("the previous outputs cannot be removed: {e}"))),
        }
        Ok(OutputsFile {
            path: path.to_path_buf(),
        })
    }

    /// Writes the outputs atomically.
    pub fn write(&self, outputs: &RunOutputs) -> Result<()> {
        let text = serde_json::to_vec_pretty(&outputs.to_json())
            .map_err(|e| HandoffError::Internal(e.into()))?;
        let failed = |e: std::io::Error| {
            HandoffError::Internal(anyhow::anyhow!(
                "cannot write the outputs file {}: {e}",
                self.path.display()
            ))
        };
        let mut temp = tempfile::NamedTempFile::new_in(folder_of(&self.path)).map_err(failed)?;
        temp.write_all(&text).map_err(failed)?;
        temp.write_all(b"\n").map_err(failed)?;
        temp.as_file().sync_all().map_err(failed)?;
        temp.persist(&self.path).map_err(|e| failed(e.error))?;
        Ok(())
    }
}

fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outputs() -> RunOutputs {
        RunOutputs {
            outputs: vec![("status", json!("IDLE")), ("events_handed_off", json!(0))],
            metrics: vec![],
            tags: vec![],
        }
    }

    #[test]
    fn the_file_holds_the_outputs_and_replaces_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outputs.json");
        std::fs::write(&path, "old").unwrap();
        let file = OutputsFile::new(&path).unwrap();
        // An earlier run's outputs are gone as soon as this run starts.
        assert!(!path.exists());
        file.write(&outputs()).unwrap();
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(written, json!({"status": "IDLE", "events_handed_off": 0}));
        // Nothing else is left in the folder.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_path_that_cannot_be_written_is_refused_before_the_run() {
        let dir = tempfile::tempdir().unwrap();
        for path in [
            dir.path().to_path_buf(),
            dir.path().join("missing/outputs.json"),
            PathBuf::new(),
        ] {
            let error = OutputsFile::new(&path).unwrap_err();
            assert!(matches!(error, HandoffError::BadInput(_)), "{error}");
        }
    }
}
