//! The test server's suites, one module each, in one test binary (one build and link instead of
//! one per suite). Run one alone with `cargo test -p mongo-sim --test all crud::`.

mod common;

mod admin;
mod bad_input;
mod bulk_write;
mod change_stream_images;
mod change_stream_pipeline;
mod change_stream_split;
mod change_streams;
mod command;
mod crud;
mod expanded_events;
mod failpoints;
mod layering;
mod oplog_window;
mod sharded;
mod snapshot_reads;
mod transactions;
mod wire;
