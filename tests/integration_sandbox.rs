//! The sandbox's bounds beyond computing: waits a policy starts in host code (sleep, poll), the
//! signals and the watchdog that end a run whatever it does, clocks and random sources that follow
//! a replay, and one memory cap over every memory and table of a policy.

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use support::live::*;
use support::*;

/// The longest any run here may take before the test kills it and fails: "does not hang".
const HANG: Duration = Duration::from_secs(60);

/// Waits for a child, killing it (and failing) after [`HANG`]; returns its output.
fn finish(mut child: Child) -> Output {
    let started = Instant::now();
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if started.elapsed() > HANG => {
                let _ = child.kill();
                let output = child.wait_with_output().expect("output");
                panic!(
                    "the process still ran after {HANG:?}; stderr: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn signal(child: &Child, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Reads the child's stderr until a line contains `needle`; the rest is drained in the background
/// and returned by the handle.
fn wait_for_log(child: &mut Child, needle: &str) -> std::thread::JoinHandle<String> {
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + HANG;
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("read stderr") == 0 {
            panic!("the process ended before logging {needle:?}: {seen}");
        }
        seen.push_str(&line);
        if line.contains(needle) {
            break;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in {seen}");
    }
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
        seen + &rest
    })
}

const WAITING_POLICIES: [&str; 2] = [
    handoff_test_policies::SLEEP_FOREVER,
    handoff_test_policies::POLL_FOREVER,
];

/// A live run of a policy that waits in WASI: ended by its slice, and by the run deadline, each
/// with exit 9 and nothing written.
#[test]
fn a_policy_waiting_in_wasi_is_stopped_by_its_slice_and_by_the_run_deadline() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..3);
    let before = live.position();
    for policy in WAITING_POLICIES {
        let started = Instant::now();
        let output = finish(live.spawn(&["--policy", policy, "--policy-slice-ms", "500"]));
        fails(
            &output,
            9,
            "the policy waited (wasi:io/poll) past its compute slice of 500 ms without calling the host",
        );
        assert!(started.elapsed() < Duration::from_secs(30));
        let output = finish(live.spawn(&[
            "--policy",
            policy,
            "--policy-slice-ms",
            "600000",
            "--run-timeout-seconds",
            "3",
        ]));
        fails(&output, 9, "the policy exceeded the run deadline of 3 s");
        assert_eq!(live.position(), before);
        assert_eq!(live.outbox_len(), 0);
    }
    // The deployment is healthy: the default policy hands the three events off.
    assert_eq!(ok(&live.run(&[]))["events_handed_off"], 3);
}

/// SIGTERM stops a waiting policy like any other run: exit 12 within seconds, outputs for what
/// was committed (nothing), the checkpoint untouched.
#[test]
fn sigterm_stops_a_policy_waiting_in_wasi() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..3);
    let before = live.position();
    for policy in WAITING_POLICIES {
        let mut child = live
            .command()
            .args(["--policy", policy, "--policy-slice-ms", "600000"])
            .env("HANDOFF_LOG", "handoff=info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let stderr = wait_for_log(&mut child, "run starting");
        std::thread::sleep(Duration::from_millis(500));
        let sent = Instant::now();
        signal(&child, "TERM");
        let output = finish(child);
        let stderr = stderr.join().expect("stderr");
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "stopping took {:?}",
            sent.elapsed()
        );
        assert_eq!(output.status.code(), Some(12), "{stderr}");
        let outputs = outputs(&output);
        assert_eq!(outputs["stopped"], true);
        assert_eq!(outputs["status"], "IDLE");
        assert_eq!(outputs["events_handed_off"], 0);
        assert_eq!(live.position(), before);
    }
}

/// Under a replay a sleep does not wait: the virtual clock moves, and the time slept counts
/// against the slice, so a policy sleeping for hours fails at once.
#[test]
fn a_policy_sleeping_under_replay_fails_at_once_on_the_virtual_clock() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "three.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert"), batch_end(1)],
    );
    let child = handoff()
        .arg("replay")
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .args(["--policy", handoff_test_policies::SLEEP_FOREVER])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = finish(child);
    fails(
        &output,
        9,
        "the policy waited (wasi:io/poll) past its compute slice of 2000 ms",
    );
}

/// A component whose compilation takes many seconds: one function of `n` dependent operations.
fn slow_to_compile(s: &Scratch, n: usize) -> std::path::PathBuf {
    let mut body = String::with_capacity(n * 40);
    for i in 0..n {
        body.push_str(&format!(
            "local.get 0 i32.const {i} i32.add local.tee 1 local.get 1 i32.mul local.set 0\n"
        ));
    }
    let text = format!(
        "(component (core module (func (export \"f\") (param i32) (result i32) (local i32)\n{body} local.get 0)))"
    );
    let bytes = wat::parse_str(&text).expect("valid component text");
    let path = s.path("slow.wasm");
    std::fs::write(&path, bytes).expect("write component");
    path
}

const SLOW_OPS: usize = 400_000;

/// The watchdog ends a process that outlives its run deadline plus the grace period, compilation
/// included: exit 14 with a clear error.
#[test]
fn the_watchdog_ends_a_run_that_outlives_its_deadline() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "one.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert"), batch_end(1)],
    );
    let slow = slow_to_compile(&s, SLOW_OPS);
    let started = Instant::now();
    let child = handoff()
        .arg("replay")
        .arg(&fixture)
        .arg("--state")
        .arg(s.state())
        .arg("--policy")
        .arg(&slow)
        .args([
            "--no-cache",
            "--run-timeout-seconds",
            "1",
            "--watchdog-grace-seconds",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = finish(child);
    // The watchdog knows nothing of what was committed: it reports no outputs.
    refused(
        &output,
        14,
        "error[watchdog]: the run did not end within its deadline plus the 1 s grace period",
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    // Nothing was written: the state store is created only once the policy is usable.
    assert!(!s.state().exists());
}

/// A second SIGTERM or SIGINT ends the process at once (128 + the signal), even while the first
/// one waits for the work under way (here, a long compilation) to end.
#[test]
fn a_second_signal_ends_the_process_at_once() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "one.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert"), batch_end(1)],
    );
    let slow = slow_to_compile(&s, SLOW_OPS);
    for (name, code) in [("TERM", 143), ("INT", 130)] {
        let mut child = handoff()
            .arg("replay")
            .arg(&fixture)
            .arg("--state")
            .arg(s.state())
            .arg("--policy")
            .arg(&slow)
            .arg("--no-cache")
            .env("HANDOFF_LOG", "handoff::startup=debug")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let stderr = wait_for_log(&mut child, "engine built");
        std::thread::sleep(Duration::from_millis(300));
        signal(&child, name);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the first signal must not end the process"
        );
        let sent = Instant::now();
        signal(&child, name);
        let output = finish(child);
        let stderr = stderr.join().expect("stderr");
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "ending took {:?}",
            sent.elapsed()
        );
        assert_eq!(output.status.code(), Some(code), "{stderr}");
    }
}

/// Under a replay the policy's wall clock, monotonic clock and random sources follow the
/// recording: two replays of the same fixture on fresh states give the same outbox IDs, the wall
/// clock reads the first event's `clusterTime`, and a 1.5 s sleep moves the monotonic clock by 1.5 s
/// exactly.
#[test]
fn clocks_and_random_follow_the_replay() {
    let lines = [
        deployment(REPLICA_SET_ID),
        event(1, "insert"),
        event(2, "update"),
        event(3, "delete"),
        batch_end(3),
    ];
    let ids: Vec<Vec<String>> = (0..2)
        .map(|_| {
            let s = Scratch::new();
            let fixture = s.fixture("three.jsonl", &lines);
            let out = ok(&replay(
                &fixture,
                &s.state(),
                &["--policy", handoff_test_policies::CLOCKS_AND_RANDOM],
            ));
            assert_eq!(out["events_handed_off"], 3);
            outbox_ids(&inspect(&s.state()).1)
        })
        .collect();
    assert_eq!(ids[0], ids[1]);
    // `event(1, …)` has clusterTime 1_793_527_200 (2026-11-01T10:00:00Z), the virtual epoch.
    let epoch = lines[1]["clusterTime"]["$timestamp"]["t"].as_u64().unwrap();
    for (n, id) in ids[0].iter().enumerate() {
        let prefix = format!("w{epoch}.0-m1500000000-r");
        assert!(id.starts_with(&prefix), "{id} does not start with {prefix}");
        assert!(id.ends_with(&format!("-{n}")), "{id}");
    }
    // The random parts are drawn, not constant.
    let random: std::collections::HashSet<&str> = ids[0]
        .iter()
        .map(|id| &id[id.find("-r").unwrap()..])
        .collect();
    assert_eq!(random.len(), 3);
}

/// The canonical-ABI core module of a policy component whose `run` grows memories 1..=n by
/// `pages` 64 KiB pages each (trapping if a growth is refused quietly) and tables 0..t by
/// `elements` each, then reports IDLE.
fn multi_memory_policy(
    s: &Scratch,
    name: &str,
    memories: usize,
    pages: u32,
    tables: usize,
    elements: u32,
) -> std::path::PathBuf {
    let mut decls = String::new();
    let mut grow = String::new();
    for m in 1..=memories {
        decls.push_str(&format!("(memory $m{m} 0)\n"));
        grow.push_str(&format!(
            "(if (i32.eq (memory.grow $m{m} (i32.const {pages})) (i32.const -1)) (then unreachable))\n\
             (i32.store8 $m{m} (i32.const {last}) (i32.const 1))\n",
            last = pages * 65536 - 1
        ));
    }
    for t in 0..tables {
        decls.push_str(&format!("(table $t{t} 0 funcref)\n"));
        grow.push_str(&format!(
            "(if (i32.eq (table.grow $t{t} (ref.null func) (i32.const {elements})) (i32.const -1)) (then unreachable))\n"
        ));
    }
    let wit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/policy.wit");
    let contract = std::fs::read_to_string(&wit).expect("the contract");
    // The contract's current version, from its package line.
    let version = contract
        .lines()
        .find_map(|l| l.trim().strip_prefix("package handoff:policy@"))
        .and_then(|v| v.strip_suffix(';'))
        .expect("the package line");
    let text = format!(
        r#"(module
  (memory (export "memory") 1)
  {decls}
  (global $bump (mut i32) (i32.const 1024))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (i32.and (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
                           (i32.sub (i32.const 0) (local.get 2))))
    (global.set $bump (i32.add (local.get $p) (local.get 3)))
    (if (i32.gt_u (global.get $bump) (i32.mul (memory.size) (i32.const 65536)))
      (then (if (i32.eq (memory.grow (i32.add (i32.shr_u (global.get $bump) (i32.const 16)) (i32.const 1)))
                        (i32.const -1))
              (then unreachable))))
    (local.get $p))
  (func (export "handoff:policy/policy@{version}#run") (param i32 i64 i32 i32) (result i32)
    {grow}
    ;; result<report, string>: ok, status idle, 0 events, empty last-event-id
    (i32.store8 (i32.const 16) (i32.const 0))
    (i32.store8 (i32.const 20) (i32.const 0))
    (i32.store (i32.const 24) (i32.const 0))
    (i32.store (i32.const 28) (i32.const 0))
    (i32.store (i32.const 32) (i32.const 0))
    (i32.const 16))
)"#
    );
    let mut module = wat::parse_str(&text).expect("valid module text");
    let mut resolve = wit_parser::Resolve::default();
    let package = resolve.push_file(&wit).expect("the contract parses");
    let world = resolve
        .select_world(&[package], Some("handoff-policy"))
        .expect("the policy world");
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
        true,
    )
    .expect("embed the contract");
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .expect("a core module")
        .validate(true)
        .encode()
        .expect("a component");
    let path = s.path(name);
    std::fs::write(&path, component).expect("write component");
    path
}

fn idle_fixture(s: &Scratch) -> std::path::PathBuf {
    s.fixture("idle.jsonl", &[deployment(REPLICA_SET_ID), batch_end(0)])
}

/// Replays an idle stream with `policy` under a memory cap of `mib` MiB, compiling it afresh.
fn under_cap(policy: &std::path::Path, mib: &str) -> std::process::Output {
    let s = Scratch::new();
    handoff()
        .arg("replay")
        .arg(idle_fixture(&s))
        .arg("--state")
        .arg(s.state())
        .args([
            "--policy",
            policy.to_str().unwrap(),
            "--no-cache",
            "--policy-memory-mib",
            mib,
        ])
        .env("HANDOFF_LOG", "handoff::policy=info")
        .output()
        .unwrap()
}

/// Three memories of 30 MiB each: each under the 64 MiB cap, together over it. The cap holds
/// for the policy as a whole.
#[test]
fn the_memory_cap_counts_every_memory_of_a_policy() {
    let s = Scratch::new();
    let policy = multi_memory_policy(&s, "three-memories.wasm", 3, 480, 0, 0);
    fails(
        &under_cap(&policy, "64"),
        9,
        "the policy exceeded its memory cap",
    );
    // With room for all three, the same component runs to its IDLE report, and the log says
    // what it grew to (what an operator sizes the cap by).
    let output = under_cap(&policy, "128");
    let out = ok(&output);
    assert_eq!(out["status"], "IDLE");
    let used = policy_memory(&output);
    assert!((90 << 20..=128 << 20).contains(&used), "{used}");
}

/// The `memory_bytes` a run logs for its policy (`handoff::policy`, info).
fn policy_memory(output: &std::process::Output) -> u64 {
    let err = stderr(output);
    let line = err
        .lines()
        .find(|l| l.contains("policy memory"))
        .unwrap_or_else(|| panic!("no policy memory line in: {err}"));
    let at = line.find("memory_bytes=").expect("memory_bytes") + "memory_bytes=".len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a number")
}

/// Tables count against the same cap: 30 tables of 90,000 references (about 21 MiB) with a
/// 16 MiB cap, each table within the per-table bound.
#[test]
fn the_memory_cap_counts_tables_too() {
    let s = Scratch::new();
    let policy = multi_memory_policy(&s, "tables.wasm", 0, 0, 30, 90_000);
    fails(
        &under_cap(&policy, "16"),
        9,
        "the policy exceeded its memory cap",
    );
    let out = ok(&under_cap(&policy, "64"));
    assert_eq!(out["status"], "IDLE");
}

/// A `policy test` case of a policy that reads the clocks and random sources passes against the
/// expectations it recorded: its results depend on the case alone.
#[test]
fn a_policy_test_case_reading_clocks_and_random_is_reproducible() {
    let s = Scratch::new();
    let case = s.path("cases/clocks");
    std::fs::create_dir_all(&case).unwrap();
    let lines = [
        deployment(REPLICA_SET_ID),
        event(1, "insert"),
        event(2, "update"),
        batch_end(2),
    ];
    s.fixture("cases/clocks/stream.jsonl", &lines);
    std::fs::write(case.join("case.json"), "{\"runs\": 2}").unwrap();
    let policy_test = |update: bool| {
        let mut command = handoff();
        command
            .args([
                "policy",
                "test",
                "--policy",
                handoff_test_policies::CLOCKS_AND_RANDOM,
            ])
            .arg(s.path("cases"));
        if update {
            command.args(["--update", "--yes"]);
        }
        command.output().expect("policy test")
    };
    let recorded = policy_test(true);
    assert_eq!(recorded.status.code(), Some(0), "{}", stderr(&recorded));
    let expected = std::fs::read_to_string(case.join("case.json")).unwrap();
    assert!(
        expected.contains("w1793527200.0-m1500000000-r"),
        "{expected}"
    );
    for _ in 0..2 {
        let again = policy_test(false);
        let stdout = String::from_utf8_lossy(&again.stdout);
        assert_eq!(again.status.code(), Some(0), "{stdout}{}", stderr(&again));
        assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
    }
}
