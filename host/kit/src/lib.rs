//! The policy authors' kit: fixture-driven policy tests (`cases`), compatibility checks (`check`),
//! project scaffolds per language (`scaffold`, `lang`), builds (`build`) and live-stream recording
//! (`record`), and policy diffs: two policies' decisions over the same events (`diff`).

pub mod build;
pub mod cases;
pub mod check;
pub mod diff;
pub mod junit;
pub mod lang;
pub mod record;
pub mod redact;
pub mod report;
pub mod scaffold;
