//! `cargo bench -p handoff --bench live`
//!
//! handoff and the baseline task it replaces (`tests/mongo-sim/python/baseline_task.py`, PyMongo in
//! the PyMongo suites' virtual environment, created here when missing), taking turns on one test
//! server over the same events, each a whole process from its own checkpoint:
//! - per-event transactions: the default policy against the baseline;
//! - batched: the batching policy at 100 events per transaction, against the baseline and against
//!   the limit, a plain loop on the official driver (this program, run again as a child) reading the
//!   same stream and committing the same documents in the same transactions with no policy;
//! - a typical scheduled run of 10 new events;
//! - warm start (process start to the policy's first host call, cached artifact, existing consumer)
//!   of `handoff replay`, as the goal defines it: with no server in it, on the machine's CPUs (and,
//!   printed beside it, on the one CPU of the runs); and of `handoff run` against the test server;
//! - the peak memory of a 500-event run beside the baseline's.
//!
//! Every run is checked: its outbox holds exactly the events it was given. Figures are medians over
//! rounds in which the contenders take turns in a rotating order.
//!
//! The test server and every contender share one CPU (this process pins itself to CPU 0 before it
//! starts the server; threads and children inherit it). On a small virtual machine, waking a
//! process on another CPU costs tens to hundreds of microseconds and varies severalfold from one
//! run to the next, which would bury the figures; on one CPU they repeat. `-- --spread` leaves the
//! scheduler free instead. Only the warm start of `handoff replay`, which talks to no server, is
//! also measured with the main thread let onto every CPU (the server's threads stay pinned).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bson::{Document, doc};
use mongo_sim::{Config, ServerHandle};
use mongodb::{Client, Collection};

#[path = "live/cpu.rs"]
mod cpu;
#[path = "live/raw_loop.rs"]
mod raw_loop;
mod support;
use cpu::{online_cpus, pin_to_first_cpu, set_affinity};
use support::{fixture_text, median, startup_us};

/// Events per throughput run, as a busy scheduled run sees them.
const EVENTS: u32 = 500;
/// Events per typical scheduled run.
const TYPICAL: u32 = 10;
/// Events per transaction in the batched runs.
const BATCH: u32 = 100;
/// Rounds of the 500-event runs: a multiple of the five contenders, so that each runs as often
/// in each place of the rotating order (later places find a longer history on the server).
/// Medians of 5 moved by several points from one benchmark run to the next; of 15, less.
const ROUNDS: usize = 15;
/// Rounds of the typical runs, a multiple of their three contenders.
const TYPICAL_ROUNDS: usize = 15;
/// Starts measured per start-up figure (after one that fills the artifact cache).
const STARTS: usize = 15;
const CHECKPOINTS: &str = "checkpoints";
/// Set in the environment of this program's child that runs the plain driver loop.
const RAW_LOOP: &str = "HANDOFF_BENCH_RAW_LOOP";
/// Set in the environment of this program's child that runs and measures one run.
const MEASURE: &str = "HANDOFF_BENCH_MEASURE";
/// How the measuring child's line of figures begins.
const MEASURED: &str = "handoff-bench-measured";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    /// The Python task, one event per transaction.
    Baseline,
    /// `handoff run` with the default (embedded) policy.
    Handoff,
    /// `handoff run` with the batching policy at `BATCH` per transaction.
    HandoffBatched,
    /// The plain driver loop at one event per transaction.
    RawPerEvent,
    /// The plain driver loop at `BATCH` events per transaction.
    RawBatched,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Baseline => "baseline",
            Contender::Handoff => "handoff",
            Contender::HandoffBatched => "handoff-batched",
            Contender::RawPerEvent => "raw-per-event",
            Contender::RawBatched => "raw-batched",
        }
    }
}

/// One whole-process run: wall time from spawn to exit, and the child's peak resident set.
struct Measured {
    wall: Duration,
    max_rss_kib: u64,
}

struct Bench {
    uri: String,
    server: ServerHandle,
    client: Client,
    rt: tokio::runtime::Runtime,
    python: PathBuf,
    baseline: PathBuf,
    handoff: &'static str,
    batching: &'static str,
    cache: tempfile::TempDir,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// The PyMongo suites' virtual environment, created as the test command creates it.
fn python() -> PathBuf {
    let dir = workspace().join("tests/mongo-sim/python");
    let venv = dir.join(".venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        eprintln!("creating {} for the baseline task", venv.display());
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "python3 -m venv failed: the baseline task needs Python 3"
        );
    }
    let ok = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(dir.join("requirements.txt"))
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "installing PyMongo for the baseline task failed");
    python
}

/// Runs `command` to its end, measuring its wall time and peak resident set, through a small
/// child of this program (see [`measuring_child`]): a process's peak resident set starts at its
/// parent's (exec keeps the larger of the old and the new address space's), and this process
/// holds the test server and all its data.
fn measure(command: &Command) -> (Measured, String, String) {
    let mut spawner = Command::new(std::env::current_exe().expect("this program"));
    spawner
        .env(MEASURE, "1")
        .arg(command.get_program())
        .args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => spawner.env(name, value),
            None => spawner.env_remove(name),
        };
    }
    let output = spawner.output().expect("spawn the measuring child");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    // The measuring child's figures come last, after the run's own output (which may not end
    // its last line).
    let (line, figures): (usize, Vec<u64>) = match stderr.rfind(MEASURED) {
        Some(at) => (
            at,
            stderr[at + MEASURED.len()..]
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect(),
        ),
        None => (stderr.len(), Vec::new()),
    };
    assert!(
        output.status.success() && figures.len() == 3,
        "the measuring child failed:\n{stdout}\n{stderr}"
    );
    stderr.truncate(line);
    let (status, wall_ns, max_rss_kib) = (figures[0], figures[1], figures[2]);
    assert_eq!(status, 0, "a run failed:\n{stdout}\n{stderr}");
    (
        Measured {
            wall: Duration::from_nanos(wall_ns),
            max_rss_kib,
        },
        stdout,
        stderr,
    )
}

/// The measuring child: runs its arguments as a command with its own standard streams, then
/// writes `MEASURED <exit code> <wall ns> <peak resident set KiB>` as the last line on stderr
/// (an exit code of 256 + the signal for a run a signal ended). The run starts from this small
/// process, so its peak resident set is its own (at least this process's, which is printed as
/// the floor).
fn measuring_child() -> ! {
    let mut args = std::env::args_os().skip(1);
    let program = args.next().expect("a program to measure");
    let mut command = Command::new(program);
    command.args(args).env_remove(MEASURE);
    let started = Instant::now();
    let child = command.spawn().expect("spawn");
    let mut status = 0;
    // SAFETY: rusage is plain data the kernel fills; the pid is this process's own child, which
    // is waited for here and nowhere else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    assert_eq!(waited, pid, "wait4 failed");
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        256 + libc::WTERMSIG(status)
    };
    eprintln!("{MEASURED} {code} {} {}", wall.as_nanos(), usage.ru_maxrss);
    std::process::exit(0)
}

impl Bench {
    fn start() -> Bench {
        let python = python();
        let server = ServerHandle::start_blocking(Config::default()).expect("test server");
        let uri = server.uri();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt
            .block_on(Client::with_uri_str(&uri))
            .expect("driver client");
        Bench {
            uri,
            server,
            client,
            rt,
            python,
            baseline: workspace().join("tests/mongo-sim/python/baseline_task.py"),
            handoff: env!("CARGO_BIN_EXE_handoff"),
            batching: handoff_test_policies::BATCHING,
            cache: tempfile::tempdir().expect("cache dir"),
        }
    }

    /// A database with `orders` and one checkpoint per contender at the stream's current
    /// position, then `events` inserts into `orders`.
    fn prepare(&self, db: &str, contenders: &[Contender], events: u32) {
        self.rt.block_on(async {
            let db = self.client.database(db);
            let orders = db.collection::<Document>("orders");
            let mut stream = orders
                .watch()
                .max_await_time(Duration::from_millis(10))
                .await
                .expect("watch");
            let _ = stream.next_if_any().await.expect("empty batch");
            let token = stream
                .resume_token()
                .expect("a resume token on an idle stream");
            let token = bson::serialize_to_bson(&token).expect("token");
            let source = format!("{}.orders", db.name());
            let replica_set_id = self.server.replica_set_id().to_hex();
            for contender in contenders {
                db.collection::<Document>(CHECKPOINTS)
                    .insert_one(doc! {
                        "_id": contender.name(),
                        "source": &source,
                        "replicaSetId": &replica_set_id,
                        "token": token.clone(),
                        "mode": "resumeAfter",
                    })
                    .await
                    .expect("checkpoint");
            }
            let docs = (0..events).map(|i| {
                doc! {
                    "_id": i64::from(i),
                    "customer": format!("customer-{}", i % 97),
                    "status": "placed",
                    "total": f64::from(i) * 1.25,
                    "items": [{ "sku": format!("sku-{}", i % 13), "quantity": 1 + i % 4 }],
                }
            });
            if events > 0 {
                orders.insert_many(docs).await.expect("inserts");
            }
        });
    }

    fn command(&self, contender: Contender, db: &str, events: u32) -> Command {
        let outbox = format!("outbox_{}", contender.name());
        match contender {
            Contender::Baseline => {
                let mut c = Command::new(&self.python);
                c.arg(&self.baseline).args([
                    self.uri.as_str(),
                    db,
                    "orders",
                    contender.name(),
                    CHECKPOINTS,
                    &outbox,
                    &events.to_string(),
                    "1",
                ]);
                c
            }
            Contender::Handoff | Contender::HandoffBatched => {
                let mut c = Command::new(self.handoff);
                c.arg("run")
                    .env("MONGODB_URI", &self.uri)
                    .env("SOURCE_DATABASE", db)
                    .env("SOURCE_COLLECTION", "orders")
                    .env("CONSUMER_ID", contender.name())
                    .env("CHECKPOINT_COLLECTION", CHECKPOINTS)
                    .env("OUTBOX_COLLECTION", &outbox)
                    .env("MAX_EVENTS", events.to_string())
                    .env("MAX_WAIT_SECONDS", "1")
                    .env("HANDOFF_CACHE_DIR", self.cache.path());
                if contender == Contender::HandoffBatched {
                    c.args(["--policy", self.batching])
                        .args(["--policy-param", &format!("batch_size={BATCH}")]);
                }
                c
            }
            Contender::RawPerEvent | Contender::RawBatched => {
                let batch = if contender == Contender::RawBatched {
                    BATCH
                } else {
                    1
                };
                let mut c = Command::new(std::env::current_exe().expect("this program"));
                c.env(RAW_LOOP, "1")
                    .env("MONGODB_URI", &self.uri)
                    .env("SOURCE_DATABASE", db)
                    .env("CONSUMER_ID", contender.name())
                    .env("OUTBOX_COLLECTION", &outbox)
                    .env("MAX_EVENTS", events.to_string())
                    .env("BATCH_SIZE", batch.to_string());
                c
            }
        }
    }

    /// One run of `contender` over the `events` prepared in `db`, checked.
    fn run(&self, contender: Contender, db: &str, events: u32) -> Measured {
        let (measured, stdout, _) = measure(&self.command(contender, db, events));
        let stored = self.rt.block_on(async {
            let outbox: Collection<Document> = self
                .client
                .database(db)
                .collection(&format!("outbox_{}", contender.name()));
            outbox.count_documents(doc! {}).await.expect("count")
        });
        assert_eq!(
            stored,
            u64::from(events),
            "{} stored {stored} records for {events} events:\n{stdout}",
            contender.name()
        );
        measured
    }

    /// Rounds of runs over fresh events, contenders in a rotating order; per contender the
    /// wall times and peak resident sets.
    fn rounds(
        &self,
        label: &str,
        contenders: &[Contender],
        events: u32,
        rounds: usize,
    ) -> Vec<(Vec<f64>, Vec<f64>)> {
        let mut results = vec![(Vec::new(), Vec::new()); contenders.len()];
        for round in 0..rounds {
            let db = format!("bench_{label}_{round}");
            self.prepare(&db, contenders, events);
            for k in 0..contenders.len() {
                let i = (k + round) % contenders.len();
                let m = self.run(contenders[i], &db, events);
                results[i].0.push(m.wall.as_secs_f64());
                results[i].1.push(m.max_rss_kib as f64);
            }
        }
        results
    }

    /// Warm start as the goal defines it: process start to the policy's first host call, cached
    /// artifact, existing consumer, no network (`handoff replay` of one recorded event; median
    /// of [`STARTS`] after one that fills the cache), on the CPUs this thread may use.
    fn replay_warm_start(&self) -> f64 {
        let dir = tempfile::tempdir().expect("tempdir");
        let fixture = dir.path().join("one.jsonl");
        std::fs::write(&fixture, fixture_text(1)).expect("fixture");
        let state = dir.path().join("state.redb");
        let args = [
            "replay",
            fixture.to_str().expect("path"),
            "--state",
            state.to_str().expect("path"),
            "--max-wait-seconds",
            "1",
        ];
        let samples: Vec<f64> = (0..=STARTS)
            .map(|_| startup_us(self.handoff, &args, &[], self.cache.path(), true).0)
            .skip(1)
            .collect();
        median(samples)
    }

    /// Start of `handoff run` on the test server: process start to the first policy call, cached
    /// artifact, existing consumer, connection, deployment checks and checkpoint read included,
    /// nothing to hand off (median of [`STARTS`]).
    fn live_start(&self) -> (f64, f64) {
        let db = "bench_warm";
        self.prepare(db, &[Contender::Handoff], 0);
        let envs = [
            ("MONGODB_URI", self.uri.as_str()),
            ("SOURCE_DATABASE", db),
            ("CONSUMER_ID", Contender::Handoff.name()),
            ("CHECKPOINT_COLLECTION", CHECKPOINTS),
            ("MAX_EVENTS", "1"),
            ("MAX_WAIT_SECONDS", "1"),
        ];
        let samples: Vec<(f64, f64)> = (0..=STARTS)
            .map(|_| startup_us(self.handoff, &["run"], &envs, self.cache.path(), true))
            .skip(1)
            .collect();
        (
            median(samples.iter().map(|s| s.0).collect()),
            median(samples.iter().map(|s| s.1).collect()),
        )
    }
}

fn main() {
    if std::env::var_os(MEASURE).is_some() {
        measuring_child();
    }
    if std::env::var_os(RAW_LOOP).is_some() {
        raw_loop::raw_loop();
        return;
    }
    // cargo passes `--bench`; `--spread` is this benchmark's only option.
    let spread = std::env::args().any(|a| a == "--spread");
    if !spread {
        pin_to_first_cpu();
    }
    let bench = Bench::start();
    println!(
        "live throughput on one test server, {EVENTS} events per run, whole processes, \
         medians of {ROUNDS} rounds taking turns, {}",
        if spread {
            "server and contenders on any CPU"
        } else {
            "server and contenders on one CPU"
        }
    );

    use Contender::*;
    let busy = [Baseline, Handoff, HandoffBatched, RawPerEvent, RawBatched];
    assert_eq!(ROUNDS % busy.len(), 0, "each contender in each place");
    let results = bench.rounds("busy", &busy, EVENTS, ROUNDS);
    let rate = |i: usize| f64::from(EVENTS) / median(results[i].0.clone());
    let rss = |i: usize| median(results[i].1.clone()) / 1024.0;
    let (baseline, per_event, batched, raw_one, raw_batched) =
        (rate(0), rate(1), rate(2), rate(3), rate(4));
    println!("  baseline task (PyMongo, one transaction per event): {baseline:>8.0} events/s");
    println!("  handoff, default policy (one per event):            {per_event:>8.0} events/s");
    println!("  plain driver loop, one per event (limit):           {raw_one:>8.0} events/s");
    println!("  handoff, batching policy ({BATCH} per transaction):     {batched:>8.0} events/s");
    println!(
        "  plain driver loop, {BATCH} per transaction (limit):     {raw_batched:>8.0} events/s"
    );

    let typical = bench.rounds(
        "typical",
        &[Baseline, Handoff, RawPerEvent],
        TYPICAL,
        TYPICAL_ROUNDS,
    );
    let typical_ms = |i: usize| median(typical[i].0.clone()) * 1000.0;
    let (typical_baseline, typical_handoff, typical_raw) =
        (typical_ms(0), typical_ms(1), typical_ms(2));
    println!(
        "typical scheduled run, {TYPICAL} new events, whole process (median of {TYPICAL_ROUNDS}):"
    );
    println!(
        "  baseline task: {typical_baseline:.1} ms, handoff: {typical_handoff:.1} ms, \
         plain driver loop: {typical_raw:.1} ms"
    );

    // The warm start has no server in it: its goal is read on the machine's CPUs, where the
    // policy loads while the state store opens; on one CPU, that overlap is lost.
    let warm_one = bench.replay_warm_start();
    let warm = if spread {
        warm_one
    } else {
        set_affinity(online_cpus());
        let free = bench.replay_warm_start();
        pin_to_first_cpu();
        free
    };
    let (live_start, live_wall) = bench.live_start();
    println!(
        "start-up, process start to the policy's first host call (median of {STARTS}, cached \
         artifact, existing consumer):"
    );
    if spread {
        println!("  `handoff replay` (no network):                     {warm:>8.0} us");
    } else {
        println!(
            "  `handoff replay` (no network), on {} CPUs:           {warm:>8.0} us \
             (on the benchmark's one CPU: {warm_one:.0} us)",
            online_cpus()
        );
    }
    println!(
        "  `handoff run` (connection, checks, checkpoint), one CPU: {live_start:>8.0} us \
         (whole idle run {:.0} ms)",
        live_wall / 1000.0
    );
    // A run's peak includes what its measuring parent held when it started the run: the floor.
    let floor = measure(&Command::new("true")).0.max_rss_kib as f64 / 1024.0;
    println!(
        "peak resident set of a {EVENTS}-event run: baseline {:.1} MiB, handoff {:.1} MiB, \
         handoff batched {:.1} MiB, plain loop {:.1} MiB (floor: {floor:.1} MiB, what `true` \
         shows started the same way)",
        rss(0),
        rss(1),
        rss(2),
        rss(3)
    );

    println!("goals:");
    let goal = |name: &str, figure: f64, target: f64, unit: &str| {
        let verdict = if figure >= target { "met" } else { "NOT met" };
        println!("  {name:<58} {figure:>7.2}{unit}  (goal >= {target}{unit}: {verdict})");
    };
    goal(
        "per-event transactions vs baseline",
        per_event / baseline,
        5.0,
        "x",
    );
    goal("batched vs baseline", batched / baseline, 20.0, "x");
    goal(
        "batched vs plain driver loop (share of the limit)",
        batched / raw_batched * 100.0,
        80.0,
        "%",
    );
    goal(
        "typical run of 10 events vs baseline",
        typical_baseline / typical_handoff,
        100.0,
        "x",
    );
    println!("limits (the plain driver loop against the baseline, for reference):");
    println!(
        "  one transaction per event: {:.2}x, {BATCH} per transaction: {:.2}x, \
         typical run: {:.1}x",
        raw_one / baseline,
        raw_batched / baseline,
        typical_baseline / typical_raw
    );
    println!(
        "  handoff per event reaches {:.0}% of the plain loop's one-per-event rate",
        per_event / raw_one * 100.0
    );
    let verdict = if warm <= 5000.0 { "met" } else { "NOT met" };
    println!(
        "  {:<58} {:>7.2}ms  (goal <= 5ms: {verdict})",
        "warm start (`handoff replay`)",
        warm / 1000.0
    );
}
