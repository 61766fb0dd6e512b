//! Scale-out on the engines users run: the Kestra flow that runs N partitions of one source in
//! parallel (`flows/kestra-partitions/`) and the Kubernetes StatefulSet whose ordinal is the
//! partition (`flows/kubernetes/`). Each is read as written, and the command lines it runs are run
//! against the test server: every write handed off once, each key in one partition.

use crate::support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bson::doc;
use serde_json::Value;
use support::live::*;

fn load(relative: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    let text = std::fs::read_to_string(&path).expect("the file");
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("YAML");
    serde_json::to_value(yaml).expect("JSON")
}

/// `{{ name }}` expressions of `template` replaced from `values` (spacing inside the braces as
/// written); any other expression fails the test.
fn render(template: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("}}").expect("a closed expression") + start;
        let expr = rest[start + 2..end].trim();
        let value = values
            .get(expr)
            .unwrap_or_else(|| panic!("an expression this check cannot render: {expr}"));
        out.push_str(value);
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Each key's events in one consumer, every write once; returns the consumers used.
fn check_partitioned(live: &Live, writes: usize) -> HashSet<String> {
    let outbox = live.outbox();
    assert_eq!(outbox.len(), writes, "every write once");
    let mut consumer_of: HashMap<i32, String> = HashMap::new();
    for record in &outbox {
        let consumer = record.get_str("consumer").expect("consumer").to_string();
        let key = record
            .get_document("event")
            .and_then(|e| e.get_document("documentKey"))
            .and_then(|k| k.get_i32("_id"))
            .expect("documentKey._id");
        let first = consumer_of.entry(key).or_insert_with(|| consumer.clone());
        assert_eq!(*first, consumer, "key {key} in two partitions");
    }
    consumer_of.into_values().collect()
}

/// Waits until `n` checkpoints hold their starting position.
fn consumers_started(live: &Live, n: u64) {
    let started = Instant::now();
    while live
        .wait(
            live.coll(CHECKPOINTS)
                .count_documents(doc! {"token": {"$exists": true}}),
        )
        .expect("count")
        < n
    {
        assert!(started.elapsed() < Duration::from_secs(30), "not started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_kestra_partition_flow_runs_its_partitions_in_parallel_each_write_once() {
    let flow = load("flows/kestra-partitions/mongodb-change-stream-follow-partitions.yml");
    let tasks = flow["tasks"].as_array().expect("tasks");
    let each = &tasks[0];
    assert_eq!(each["type"], "io.kestra.plugin.core.flow.ForEach");
    assert_eq!(each["concurrencyLimit"], 0, "every partition at once");
    assert_eq!(each["values"], "{{ range(0, inputs.partitions - 1) }}");
    let task = &each["tasks"][0];
    assert_eq!(task["type"], "io.kestra.plugin.scripts.shell.Commands");
    assert_eq!(
        task["taskRunner"]["type"],
        "io.kestra.plugin.core.runner.Process"
    );
    assert!(task["retry"].is_object());
    assert_eq!(task["commands"][0], "handoff run");
    let reads = support::variables_handoff_reads();
    let env = task["env"].as_object().expect("env");
    for key in env.keys() {
        assert!(
            reads.contains(key),
            "the flow passes {key}, which handoff does not read"
        );
    }

    // One execution with the inputs' defaults but a short max_duration, its partitions run as
    // the flow renders them (Pebble's range is inclusive: 0..partitions-1).
    let live = Live::start();
    let mut inputs: BTreeMap<String, String> = flow["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|input| {
            let value = match &input["defaults"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (input["id"].as_str().expect("id").to_string(), value)
        })
        .collect();
    inputs.insert("max_duration".into(), "4s".into());
    inputs.insert("database".into(), live.db.clone());
    let partitions: usize = inputs["partitions"].parse().expect("partitions");
    let runs: Vec<Child> = (0..partitions)
        .map(|index| {
            let mut values: BTreeMap<String, String> = inputs
                .iter()
                .map(|(id, value)| (format!("inputs.{id}"), value.clone()))
                .collect();
            values.insert("taskrun.value".into(), index.to_string());
            values.insert("secret('MONGODB_URI')".into(), live.uri());
            let mut command = support::handoff();
            command.arg("run");
            for (key, template) in env {
                command.env(key, render(template.as_str().expect("text"), &values));
            }
            command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn handoff")
        })
        .collect();
    consumers_started(&live, partitions as u64);
    live.insert(0..60);
    for run in runs {
        let output = run.wait_with_output().expect("output");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            support::stderr(&output)
        );
    }
    let used = check_partitioned(&live, 60);
    let expected: HashSet<String> = (0..partitions)
        .map(|i| format!("{}-{i}", inputs["consumer_prefix"]))
        .collect();
    assert_eq!(used, expected, "each partition its own consumer, all used");
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The HTTP status of `GET path` on `port`.
fn status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    reply.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn the_statefulset_runs_each_pod_as_its_partition_probed_on_its_metrics_endpoint() {
    let set = load("flows/kubernetes/handoff-statefulset.yaml");
    assert_eq!(set["kind"], "StatefulSet");
    let replicas = set["spec"]["replicas"].as_u64().expect("replicas");
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let env: BTreeMap<String, Value> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().expect("name").to_string(), e.clone()))
        .collect();
    assert_eq!(
        env["PARTITIONS"]["value"],
        replicas.to_string(),
        "one pod per partition"
    );
    assert_eq!(
        env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert!(
        env["MONGODB_URI"]["valueFrom"]["secretKeyRef"].is_object(),
        "the URI from a secret"
    );
    let port = &container["ports"][0];
    assert_eq!(port["containerPort"], 9464);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], port["name"], "{probe}");
    }
    let script = container["args"][0].as_str().expect("the pod's command");
    assert!(script.contains("--metrics-listen 0.0.0.0:9464"));

    // Each pod's command as its shell runs it (handoff on PATH, the pod's name and environment),
    // each on a port of its own here.
    let live = Live::start();
    let bin = Path::new(env!("CARGO_BIN_EXE_handoff"))
        .parent()
        .expect("bin dir");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ports = Vec::new();
    let pods: Vec<Child> = (0..replicas)
        .map(|ordinal| {
            let port = free_port();
            ports.push(port);
            let script = script.replace("0.0.0.0:9464", &format!("127.0.0.1:{port}"));
            let mut command = Command::new("/bin/sh");
            command
                .arg("-c")
                .arg(&script)
                .env_clear()
                .env("PATH", &path);
            for (name, var) in &env {
                if let Some(value) = var["value"].as_str() {
                    command.env(name, value);
                }
            }
            command
                .env("POD_NAME", format!("handoff-{ordinal}"))
                .env("MONGODB_URI", live.uri())
                .env("SOURCE_DATABASE", &live.db)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the pod's command")
        })
        .collect();
    let started = Instant::now();
    for port in &ports {
        while status(*port, "/readyz") != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "a pod never ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(status(*port, "/healthz"), Some(200));
    }
    live.insert(0..60);
    let deadline = Instant::now() + Duration::from_secs(30);
    while live.outbox_len() < 60 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // A rollout's SIGTERM ends each pod after its last commit, exit 0.
    for pod in &pods {
        support::sigterm(pod);
    }
    for pod in pods {
        let output = pod.wait_with_output().expect("output");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            support::stderr(&output)
        );
    }
    let used = check_partitioned(&live, 60);
    let expected: HashSet<String> = (0..replicas)
        .map(|i| {
            format!(
                "{}-{i}",
                env["CONSUMER_PREFIX"]["value"].as_str().expect("prefix")
            )
        })
        .collect();
    assert_eq!(used, expected);
}
