//! What the benchmarks share: a recorded stream, medians, and a process's start-up read from its
//! own log.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use handoff::backend::replay::{Fixture, ReplaySource};
use handoff::domain::{Checkpoint, CheckpointStore, Consumer, Deployment, Mode};
use handoff::runtime::Limits;
use handoff::session::Session;

/// The median of the samples.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// Microseconds since the Unix epoch, on the clock `handoff` stamps its start-up log with.
fn unix_us() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as f64
}

/// (process start to first policy call, whole run), in microseconds, of `handoff` run with
/// `args` and `envs`. The start is taken by this process just before it spawns the child, so exec
/// and loading are included.
pub fn startup_us(
    bin: &str,
    args: &[&str],
    envs: &[(&str, &str)],
    cache: &Path,
    use_cache: bool,
) -> (f64, f64) {
    let spawned_unix_us = unix_us();
    let started = Instant::now();
    let mut command = Command::new(bin);
    command
        .args(args)
        .envs(envs.iter().copied())
        .env("HANDOFF_CACHE_DIR", cache)
        .env("HANDOFF_LOG", "handoff::startup=debug")
        .env("HANDOFF_LOG_FORMAT", "json");
    if !use_cache {
        command.arg("--no-cache");
    }
    let output = command.output().expect("run handoff");
    let wall = started.elapsed().as_secs_f64() * 1e6;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first_call = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["fields"]["first_policy_call_unix_us"].as_f64())
        .expect("startup figure in the log")
        - spawned_unix_us;
    (first_call, wall)
}

/// A recorded stream of `events` inserts, as `handoff replay` reads it.
pub fn fixture_text(events: u32) -> String {
    let mut text = String::from(
        "{\"$deployment\": {\"setName\": \"rs0\", \"replicaSetId\": \"6740a1b2c3d4e5f601234567\", \"source\": \"change_demo.orders\"}}\n",
    );
    for seq in 1..=events {
        text.push_str(&format!(
            "{{\"_id\": {{\"_data\": \"82{:08X}{seq:08X}2B042C0100296E5A1004AB1154ACACD849A48C61756D70D3B21F4604000004\"}}, \
             \"operationType\": \"insert\", \"clusterTime\": {{\"$timestamp\": {{\"t\": 1793527200, \"i\": {seq}}}}}, \
             \"ns\": {{\"db\": \"change_demo\", \"coll\": \"orders\"}}, \"documentKey\": {{\"_id\": {seq}}}, \
             \"fullDocument\": {{\"_id\": {seq}, \"sku\": \"SKU-{seq}\", \"qty\": 3, \"price\": {{\"$numberDecimal\": \"19.90\"}}}}}}\n",
            1_793_527_200u32 + seq / 1000
        ));
    }
    text
}

/// A session of consumer `bench` over `fixture`, its checkpoint created in `store`: what the
/// in-process measurements drive (the live benchmark runs whole processes only).
#[allow(dead_code)]
pub fn session(fixture: &Arc<Fixture>, store: Arc<dyn CheckpointStore>) -> Session {
    store
        .ensure_checkpoint(
            "bench",
            handoff::domain::checkpoint::initial(
                "bench",
                "change_demo.orders",
                "6740a1b2c3d4e5f601234567",
            ),
        )
        .expect("checkpoint");
    Session::new(
        Consumer {
            consumer: "bench".into(),
            source: "change_demo.orders".into(),
        },
        Deployment::replica_set("rs0", "6740a1b2c3d4e5f601234567"),
        Checkpoint::at(None, Mode::ResumeAfter),
        Box::new(ReplaySource::new(fixture.clone())),
        store,
        Instant::now() + Limits::default().run_timeout,
    )
}
