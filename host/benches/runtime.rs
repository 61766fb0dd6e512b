//! `cargo bench -p handoff --bench runtime`
//!
//! Prints, measured in one run:
//! - cold start: process start to the policy's first host call, with and without the artifact cache;
//! - per-event cost of the default policy through the component boundary vs the same decision logic
//!   called natively, over the same session and in-memory store (the ratio is the boundary's cost);
//! - replay throughput in events/s, in process (memory and embedded store) and through the binary.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use handoff::backend::memory::MemoryStore;
use handoff::backend::redb_store::RedbStore;
use handoff::backend::replay::Fixture;
use handoff::domain::{CheckpointStore, Collections, Mode, Start};
use handoff::runtime::{Limits, PolicySource, Runtime, Settings};
use handoff::session::{self, Session};
use handoff_default_policy as native;

mod support;
use support::{fixture_text, median, session, startup_us};

const EVENTS: u32 = 20_000;

/// The guest's decision logic driven natively over the same session.
struct NativeHost<'a>(&'a mut Session);

fn stream_error(e: session::Refusal) -> native::StreamError {
    native::StreamError::Rejected(format!("{e:?}"))
}

fn commit_error(e: session::Refusal) -> native::CommitError {
    native::CommitError::Rejected(format!("{e:?}"))
}

fn mode_to_host(mode: native::Mode) -> Mode {
    match mode {
        native::Mode::ResumeAfter => Mode::ResumeAfter,
        native::Mode::StartAfter => Mode::StartAfter,
    }
}

impl native::Host for NativeHost<'_> {
    fn deployment(&mut self) -> native::Deployment {
        native::Deployment {
            consumer: self.0.consumer().consumer.clone(),
            source: self.0.consumer().source.clone(),
            replica_set_id: self.0.deployment().id.clone(),
        }
    }
    fn load_checkpoint(&mut self) -> native::Checkpoint {
        let (token, mode) = self.0.checkpoint();
        native::Checkpoint {
            token,
            mode: match mode {
                Mode::ResumeAfter => native::Mode::ResumeAfter,
                Mode::StartAfter => native::Mode::StartAfter,
            },
        }
    }
    fn open(&mut self, start: native::Start) -> Result<(), native::StreamError> {
        let start = match start {
            native::Start::Now => Start::Now,
            native::Start::ResumeAfter(t) => Start::ResumeAfter(t),
            native::Start::StartAfter(t) => Start::StartAfter(t),
        };
        self.0.open_stream(start).map_err(stream_error)
    }
    fn next(&mut self) -> Result<Option<native::Event>, native::StreamError> {
        self.0
            .next_event()
            .map(|e| {
                e.map(|e| native::Event {
                    token: e.token,
                    operation_type: e.operation_type,
                    namespace: e.namespace,
                    cluster_time: e.cluster_time,
                })
            })
            .map_err(stream_error)
    }
    fn watermark(&mut self) -> Option<String> {
        self.0.watermark()
    }
    fn field(&mut self, token: &str, path: &str) -> Option<String> {
        self.0.field(token, path)
    }
    fn commit(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: native::Mode,
        id: Option<&str>,
    ) -> Result<(), native::CommitError> {
        self.0
            .commit(expected, next, mode_to_host(mode), id)
            .map_err(commit_error)
    }
    fn commit_batch(
        &mut self,
        expected: Option<&str>,
        next: &str,
        mode: native::Mode,
        decisions: Vec<native::Decision>,
    ) -> Result<(), native::CommitError> {
        let decisions = decisions
            .into_iter()
            .map(|d| match d {
                native::Decision::HandOff(id) => session::Decision::HandOff(id),
                native::Decision::Skip(reason) => session::Decision::Skip(reason),
                native::Decision::Quarantine { id, reason } => {
                    session::Decision::Quarantine { id, reason }
                }
                native::Decision::Record(r) => {
                    session::Decision::HandOffRecord(Box::new(session::Shaped {
                        id: r.id,
                        event_type: r.event_type,
                        schema_version: r.schema_version,
                        aggregate_id: r.aggregate_id,
                        aggregate_version: r.aggregate_version,
                        payload: r.payload,
                    }))
                }
            })
            .collect();
        self.0
            .commit_batch(expected, next, mode_to_host(mode), decisions)
            .map_err(commit_error)
    }
    fn advance_watermark(
        &mut self,
        expected: Option<&str>,
        next: &str,
    ) -> Result<(), native::CommitError> {
        self.0
            .advance_watermark(expected, next)
            .map_err(commit_error)
    }
    fn now_ms(&mut self) -> u64 {
        self.0.now_ms()
    }
    fn log(&mut self, _level: native::Level, _message: &str, _fields: &[(&str, &str)]) {}
}

fn per_event(elapsed: Duration, events: u32) -> f64 {
    elapsed.as_secs_f64() * 1e6 / f64::from(events)
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = env!("CARGO_BIN_EXE_handoff");

    // Cold start.
    let small = dir.path().join("small.jsonl");
    std::fs::write(&small, fixture_text(1)).expect("fixture");
    let cache = dir.path().join("cache");
    let exec_us = median(
        (0..10)
            .map(|_| {
                let t = Instant::now();
                Command::new(bin)
                    .arg("--version")
                    .output()
                    .expect("version");
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect(),
    );
    let cold = |use_cache: bool, reuse_state: bool| {
        let samples: Vec<(f64, f64)> = (0..7)
            .map(|i| {
                let name = if reuse_state {
                    "start-shared.redb".to_string()
                } else {
                    format!("start-{use_cache}-{i}.redb")
                };
                let state = dir.path().join(name);
                startup_us(
                    bin,
                    &[
                        "replay",
                        small.to_str().unwrap(),
                        "--state",
                        state.to_str().unwrap(),
                        "--max-wait-seconds",
                        "1",
                    ],
                    &[],
                    &cache,
                    use_cache,
                )
            })
            .collect();
        (
            median(samples.iter().map(|s| s.0).collect()),
            median(samples.iter().map(|s| s.1).collect()),
        )
    };
    let (uncached, uncached_wall) = cold(false, false);
    let _prime = cold(true, false);
    let (cached_new, cached_new_wall) = cold(true, false);
    let (cached, cached_wall) = cold(true, true);
    println!("cold start (process start to first policy call, median of 7):");
    println!(
        "  the binary alone (--version, whole run):  {:>9.0} us",
        exec_us
    );
    println!(
        "  without artifact cache (Cranelift runs):  {:>9.0} us to first call, {:>9.0} us whole run",
        uncached, uncached_wall
    );
    println!(
        "  with cache, new consumer (state created): {:>9.0} us to first call, {:>9.0} us whole run",
        cached_new, cached_new_wall
    );
    println!(
        "  with cache, existing consumer (warm):     {:>9.0} us to first call, {:>9.0} us whole run",
        cached, cached_wall
    );
    println!(
        "  warm start (goal < 5000 us):              {:>9.0} us",
        cached
    );
    println!(
        "  cache speed-up:                           {:>9.1}x",
        uncached / cached
    );

    // Boundary vs native over the same session and store.
    let fixture = Arc::new(Fixture::parse(&fixture_text(EVENTS)).expect("fixture"));
    let runtime = Runtime::new(None).expect("runtime");
    let policy = runtime
        .load(&PolicySource::embedded_default())
        .expect("policy");
    let settings = Settings {
        max_events: EVENTS,
        max_wait_ms: 1000,
        params: vec![],
    };
    let mut component_us = Vec::new();
    let mut native_us = Vec::new();
    for _ in 0..5 {
        // Each store outlives its timed run, so freeing 20,000 records is timed in neither path.
        let store = Arc::new(MemoryStore::new());
        let s = session(&fixture, store.clone());
        let t = Instant::now();
        let summary = runtime
            .run(&policy, s, &settings, &Limits::default())
            .expect("component run");
        component_us.push(per_event(t.elapsed(), EVENTS));
        assert_eq!(summary.committed.handed_off, EVENTS);
        assert_eq!(
            store.dump("bench").expect("dump").outbox.len(),
            EVENTS as usize
        );

        let store = Arc::new(MemoryStore::new());
        let mut s = session(&fixture, store.clone());
        let t = Instant::now();
        let report = native::run(
            &mut NativeHost(&mut s),
            &native::Settings {
                max_events: EVENTS,
                max_wait_ms: 1000,
                params: vec![],
            },
        )
        .expect("native run");
        native_us.push(per_event(t.elapsed(), EVENTS));
        assert_eq!(report.events_handed_off, EVENTS);
        drop(s);
        assert_eq!(
            store.dump("bench").expect("dump").outbox.len(),
            EVENTS as usize
        );
    }
    let (component, natively) = (median(component_us), median(native_us));
    println!("per-event cost, {EVENTS} events, in-memory store (median of 5):");
    println!("  through the component boundary:           {component:>9.2} us/event");
    println!("  same decision logic called natively:      {natively:>9.2} us/event");
    println!(
        "  ratio component / native:                 {:>9.2}x  (goal < 2x)",
        component / natively
    );

    // Replay throughput.
    let redb_events = 2_000;
    let redb_fixture = Arc::new(Fixture::parse(&fixture_text(redb_events)).expect("fixture"));
    let state = dir.path().join("throughput.redb");
    let collections = Collections {
        checkpoints: "cp".into(),
        outbox: "ob".into(),
        quarantine: "qb".into(),
    };
    let store = RedbStore::open(&state, &collections, Duration::from_secs(1)).expect("store");
    let s = session(&redb_fixture, Arc::new(store));
    let t = Instant::now();
    runtime
        .run(
            &policy,
            s,
            &Settings {
                max_events: redb_events,
                max_wait_ms: 1000,
                params: vec![],
            },
            &Limits::default(),
        )
        .expect("redb run");
    let redb_rate = f64::from(redb_events) / t.elapsed().as_secs_f64();
    let big = dir.path().join("big.jsonl");
    std::fs::write(&big, fixture_text(500)).expect("fixture");
    let t = Instant::now();
    let out = Command::new(bin)
        .args([
            "replay",
            big.to_str().unwrap(),
            "--state",
            dir.path().join("cli.redb").to_str().unwrap(),
            "--max-events",
            "500",
        ])
        .env("HANDOFF_CACHE_DIR", &cache)
        .output()
        .expect("replay");
    assert!(out.status.success());
    let cli_rate = 500.0 / t.elapsed().as_secs_f64();
    println!("replay throughput:");
    println!(
        "  in process, in-memory store:              {:>9.0} events/s",
        1e6 / component
    );
    println!("  in process, embedded store (fsync each):  {redb_rate:>9.0} events/s");
    println!(
        "  `handoff replay`, 500 events per run:     {cli_rate:>9.0} events/s (whole process)"
    );
}
