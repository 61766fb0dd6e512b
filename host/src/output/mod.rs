//! What a run prints for the workflow engine.

pub mod kestra;
