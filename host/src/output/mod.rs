//! What a run prints for the workflow engine.
//!
//! - `kestra`: the task protocol lines (`::{"outputs": …}::`, `::{"metrics": …}::`);
//! - `text`: untrusted text (policy messages, server errors) made safe to print.

pub mod kestra;
pub mod text;
