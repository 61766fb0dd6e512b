//! Every end-to-end suite of the `handoff` host, one module each, in one test binary: the suites
//! share one build and one link of wasmtime and the driver instead of one each. Run one suite
//! alone with `cargo test -p handoff --test integration integration_backfill::`, one test with
//! its name.

mod layering;
mod support;

mod integration_backfill;
mod integration_bad_input;
mod integration_cache;
mod integration_cli;
mod integration_contention;
mod integration_crash;
mod integration_delivery;
mod integration_delivery_embedded;
mod integration_docs;
mod integration_engine_airflow;
mod integration_engine_argo;
mod integration_engine_github;
mod integration_faults;
mod integration_flows;
mod integration_follow;
mod integration_forgery;
mod integration_fresh_consumer;
mod integration_fuzz_decisions;
mod integration_guarantees;
mod integration_history;
mod integration_hostile;
mod integration_kit;
mod integration_lease;
mod integration_mongo;
mod integration_operate;
mod integration_operator_io;
mod integration_outbox_records;
mod integration_partitions;
mod integration_policies;
mod integration_policy_diff;
mod integration_races;
mod integration_reconcile;
mod integration_recover;
mod integration_replay;
mod integration_reports;
mod integration_sandbox;
mod integration_scale_out;
mod integration_sharded;
mod integration_split_events;
mod integration_stop;
mod integration_stream_options;
mod integration_transactions;
mod integration_wide_scopes;
mod integration_write_paths;

/// Every `tests/integration_*.rs` is a module above: a suite left out would never run.
#[test]
fn every_suite_is_a_module_of_this_binary() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests");
    let main = std::fs::read_to_string(tests.join("main.rs")).expect("tests/main.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&tests)
        .expect("the tests folder")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".rs")
            && stem.starts_with("integration_")
            && !main.lines().any(|l| l == format!("mod {stem};"))
        {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "suites that are not modules of tests/main.rs: {missing:?}"
    );
}
