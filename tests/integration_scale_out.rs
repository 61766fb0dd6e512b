//! Scale-out on the engines users run: partitions (`--partition I/N`) as the unit of parallelism.
//!
//! `flows/kestra-partitions/` follows N partitions of one source from one Kestra flow (a
//! `ForEach` over the partitions, all at once); `flows/kubernetes/` runs them as a StatefulSet
//! whose pod ordinal is the partition index. Each is read as its engine reads it, then its
//! command lines run as the engine would run them, against the test server, under writes and
//! kills: every write handed off once across the partitions, each key's events by one partition,
//! in order.

use crate::support;
use crate::support::engines;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::kestra::{Capture, for_each_values, kestra_parse};
use support::live::Live;
use support::{Rng, http, partitions};

const KEYS: i32 = 24;
const UPDATES: i32 = 120;

/// The default policy written where `dir/relative` says.
fn export_default_policy(dir: &Path, relative: &str) {
    let path = dir.join(relative);
    std::fs::create_dir_all(path.parent().expect("a folder")).expect("the policy's folder");
    let export = support::handoff()
        .args(["policy", "export-default"])
        .arg(&path)
        .output()
        .expect("handoff policy export-default");
    assert!(export.status.success(), "{}", support::stderr(&export));
}

/// SIGKILL for a process and every process it started, as a worker's crash ends them.
fn kill_tree(pid: u32) {
    for child in std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
    {
        kill_tree(child.parse().expect("a pid"));
    }
    engines::send_signal(pid, "KILL");
}

/// One partition's capture task of the Kestra flow, as its worker runs it.
struct Partition {
    consumer: String,
    child: Child,
}

#[test]
fn the_kestra_partition_flow_follows_every_partition_at_once_and_hands_each_write_off_once() {
    let seed = support::seed("HANDOFF_SCALE_SEED");
    eprintln!("HANDOFF_SCALE_SEED={seed}");
    let mut rng = Rng::new(seed ^ 0x0f10);
    let (_, flow) =
        engines::load_yaml("kestra-partitions/mongodb-change-stream-follow-partitions.yml");
    // One execution at a time: the next one waits for the previous to end.
    assert_eq!(flow["concurrency"]["limit"], 1);
    assert_eq!(flow["concurrency"]["behavior"], "QUEUE");
    let mut inputs = BTreeMap::new();
    for input in flow["inputs"].as_array().expect("inputs") {
        let id = input["id"].as_str().expect("an input id");
        assert!(
            input["description"].as_str().is_some_and(|d| d.len() > 10),
            "{id} is described"
        );
        let value = match &input["defaults"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        inputs.insert(id.to_string(), value);
    }
    let tasks = flow["tasks"].as_array().expect("tasks");
    let for_each = tasks
        .iter()
        .find(|t| t["type"] == "io.kestra.plugin.core.flow.ForEach")
        .expect("a ForEach over the partitions");
    // Every partition at once: 0 is no limit.
    assert_eq!(for_each["concurrencyLimit"], 0);
    let values = for_each_values(for_each["values"].as_str().expect("values"), &inputs);
    let count: usize = inputs["partitions"].parse().expect("partitions");
    assert_eq!(
        values,
        (0..count).map(|i| i.to_string()).collect::<Vec<_>>(),
        "one value per partition"
    );
    let task = &for_each["tasks"][0];
    assert_eq!(task["id"], "follow_partition");
    let reads = support::variables_handoff_reads();
    for key in task["env"].as_object().expect("env").keys() {
        assert!(
            reads.contains(key),
            "the task passes {key}, which handoff does not read"
        );
    }
    // Its retry waits out a killed run's lease.
    assert_eq!(task["retry"]["type"], "constant");
    let retry_wait = task["retry"]["interval"]
        .as_str()
        .expect("a retry interval");
    let minutes: u64 = retry_wait
        .strip_prefix("PT")
        .and_then(|m| m.strip_suffix('M'))
        .and_then(|m| m.parse().ok())
        .expect("a wait in minutes");
    assert!(minutes * 60 >= engines::default_lease_seconds());
    // The permanent-failure check reads this partition's outputs.
    let fail = &for_each["tasks"][1];
    assert_eq!(fail["type"], "io.kestra.plugin.core.execution.Fail");
    assert_eq!(
        fail["condition"],
        "{{ outputs.follow_partition[taskrun.value].vars.status == 'FAILED' }}"
    );

    // The first execution, shortened: the partitions follow for 8 s under writes, and a worker
    // crash kills one partition's task (its shell and handoff), which Kestra runs again.
    let live = Live::for_kills();
    let uri = live.uri();
    inputs.insert("max_duration".into(), "8s".into());
    let workdir = tempfile::tempdir().expect("a working directory");
    export_default_policy(
        workdir.path(),
        task["env"]["HANDOFF_POLICY"]
            .as_str()
            .expect("HANDOFF_POLICY"),
    );
    let path = engines::path_with(&engines::handoff_dir());
    let start = |inputs: &BTreeMap<String, String>, value: &str| -> Partition {
        let capture = Capture {
            task,
            inputs: inputs.clone(),
            value: Some(value.to_string()),
        };
        Partition {
            consumer: format!("{}-{value}-of-{count}", inputs["consumer_id"]),
            child: capture.spawn(&uri, workdir.path(), &path),
        }
    };
    let mut running: Vec<Partition> = values.iter().map(|v| start(&inputs, v)).collect();
    let consumers: Vec<String> = running.iter().map(|p| p.consumer.clone()).collect();
    partitions::started(&live, &consumers);
    let writer =
        live.background(async move |_, db| partitions::write_keys(db, KEYS, UPDATES, seed).await);
    std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));
    let crashed = rng.below(count as u64) as usize;
    kill_tree(running[crashed].child.id());
    let _ = running[crashed].child.wait();
    // The retry waits out the lease (a minute); here the lease ends now.
    partitions::expire_lease_of(&live, &consumers[crashed]);
    running[crashed] = start(&inputs, &values[crashed]);
    let expected = writer.join().expect("writer");

    // Each task ends by itself at max_duration with exit 0 and handoff's outputs, which the
    // permanent-failure check reads: none fails the execution.
    for partition in running {
        let output = partition.child.wait_with_output().expect("the task ends");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}: {stderr}",
            partition.consumer
        );
        let kestra = kestra_parse(&stdout, &stderr);
        assert_eq!(
            kestra.vars["consumer_id"], partition.consumer,
            "{:?}",
            kestra.vars
        );
        assert_ne!(kestra.vars["status"], "FAILED", "{:?}", kestra.vars);
        assert!(kestra.vars["events_handed_off"].is_u64());
    }
    partitions::check_partitioned(&live.outbox(), expected, count, seed);

    // Writes between two executions wait in the oplog; the next execution hands them off.
    live.insert(1000..1040);
    inputs.insert("max_duration".into(), "3s".into());
    let next: Vec<Partition> = values.iter().map(|v| start(&inputs, v)).collect();
    for partition in next {
        let output = partition.child.wait_with_output().expect("the task ends");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    assert_eq!(
        live.outbox_len(),
        expected + 40,
        "the next execution's writes once"
    );
    eprintln!(
        "{count} partitions, {expected} writes and a crashed task run again, then 40 writes between \
         executions: every write once, each key in one partition, in order"
    );
}

/// The StatefulSet and its Service, from the manifest.
fn manifest() -> (Value, Value) {
    let text =
        std::fs::read_to_string(engines::root().join("flows/kubernetes/handoff-statefulset.yaml"))
            .expect("the manifest");
    let mut set = None;
    let mut service = None;
    for document in text.split("\n---\n") {
        let yaml: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(document).expect("a YAML document");
        let value = serde_json::to_value(yaml).expect("JSON");
        match value["kind"].as_str() {
            Some("StatefulSet") => set = Some(value),
            Some("Service") => service = Some(value),
            other => panic!("a kind the manifest should not hold: {other:?}"),
        }
    }
    (set.expect("a StatefulSet"), service.expect("a Service"))
}

/// A pod of the StatefulSet, as its kubelet runs its container: the command, the env resolved
/// (`fieldRef` `metadata.name`, the secret), the metrics address on a port of its own (each pod
/// has its own network namespace; here they share the host's).
struct Pod {
    name: String,
    port: u16,
    child: Child,
}

fn start_pod(container: &Value, name: &str, uri: &str) -> Pod {
    let port = http::free_port();
    let mut argv: Vec<String> = container["command"]
        .as_array()
        .expect("command")
        .iter()
        .chain(container["args"].as_array().expect("args"))
        .map(|a| a.as_str().expect("a string").to_string())
        .collect();
    let program = argv.remove(0);
    let mut command = Command::new(program);
    command
        .args(argv)
        .env_clear()
        .env("PATH", engines::path_with(&engines::handoff_dir()))
        .env("HANDOFF_CACHE_DIR", support::cache_dir());
    for var in container["env"].as_array().expect("env") {
        let key = var["name"].as_str().expect("a name");
        let value = if let Some(value) = var["value"].as_str() {
            value.to_string()
        } else if var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            name.to_string()
        } else if var["valueFrom"]["secretKeyRef"].is_object() {
            uri.to_string()
        } else {
            panic!("an env source this check does not resolve: {var}");
        };
        let value = if key == "HANDOFF_METRICS_LISTEN" {
            format!("127.0.0.1:{port}")
        } else {
            value
        };
        command.env(key, value);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the pod's container starts");
    Pod {
        name: name.to_string(),
        port,
        child,
    }
}

/// Probes `path` on the pod as its kubelet does until it answers 200.
fn probe_until_ok(pod: &Pod, path: &str) {
    let started = Instant::now();
    while http::status(pod.port, path) != Some(200) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{}: {path} never answered 200",
            pod.name
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_statefulset_runs_one_follow_partition_per_pod_with_probes_on_its_metrics_endpoint() {
    let seed = support::seed("HANDOFF_SCALE_SEED");
    eprintln!("HANDOFF_SCALE_SEED={seed}");
    let mut rng = Rng::new(seed ^ 0x5e75);
    let (set, service) = manifest();
    let spec = &set["spec"];
    let replicas = spec["replicas"].as_u64().expect("replicas") as usize;
    let template = &spec["template"];
    let container = &template["spec"]["containers"][0];
    let env: BTreeMap<&str, &Value> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|v| (v["name"].as_str().expect("a name"), v))
        .collect();
    // The manifest holds together: N partitions = replicas, the Service governs the set and
    // selects its pods, the probes and the Service use the port handoff serves on.
    assert_eq!(
        env["PARTITIONS"]["value"].as_str(),
        Some(replicas.to_string().as_str()),
        "PARTITIONS equals replicas"
    );
    assert_eq!(spec["serviceName"], service["metadata"]["name"]);
    assert_eq!(spec["podManagementPolicy"], "Parallel");
    let labels = &template["metadata"]["labels"];
    for (key, value) in spec["selector"]["matchLabels"].as_object().expect("labels") {
        assert_eq!(&labels[key], value, "the selector selects the pods");
    }
    for (key, value) in service["spec"]["selector"].as_object().expect("labels") {
        assert_eq!(&labels[key], value, "the Service selects the pods");
    }
    let listen = env["HANDOFF_METRICS_LISTEN"]["value"]
        .as_str()
        .expect("a metrics address");
    let port = &container["ports"][0];
    assert_eq!(
        listen.rsplit_once(':').map(|(_, p)| p.to_string()),
        Some(port["containerPort"].to_string())
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"],
        serde_json::json!({"path": "/readyz", "port": port["name"]})
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"],
        serde_json::json!({"path": "/healthz", "port": port["name"]})
    );
    assert_eq!(service["spec"]["ports"][0]["targetPort"], port["name"]);
    // Every variable is one handoff reads or one the container's script uses.
    let script = container["args"][0].as_str().expect("the script");
    let reads = support::variables_handoff_reads();
    for key in env.keys() {
        assert!(
            reads.contains(*key)
                || script.contains(&format!("${key}"))
                || script.contains(&format!("${{{key}")),
            "the container sets {key}, which neither handoff nor its script reads"
        );
    }
    let grace = template["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");

    let live = Live::for_kills();
    let uri = live.uri();
    let name = set["metadata"]["name"].as_str().expect("a name");
    let mut pods: Vec<Pod> = (0..replicas)
        .map(|i| start_pod(container, &format!("{name}-{i}"), &uri))
        .collect();
    for pod in &pods {
        probe_until_ok(pod, "/readyz");
        probe_until_ok(pod, "/healthz");
    }
    let prefix = env["CONSUMER_PREFIX"]["value"].as_str().expect("a prefix");
    let consumers: Vec<String> = (0..replicas)
        .map(|i| format!("{prefix}-{i}-of-{replicas}"))
        .collect();
    partitions::started(&live, &consumers);
    let writer =
        live.background(async move |_, db| partitions::write_keys(db, KEYS, UPDATES, seed).await);
    // A node loses pods: SIGKILL, and the kubelet starts each again (its lease ends as time would).
    let mut kills = 0;
    while !writer.is_finished() || kills < 3 {
        std::thread::sleep(Duration::from_millis(200 + rng.below(500)));
        let i = rng.below(replicas as u64) as usize;
        let _ = pods[i].child.kill();
        let _ = pods[i].child.wait();
        kills += 1;
        partitions::expire_lease_of(&live, &consumers[i]);
        pods[i] = start_pod(container, &format!("{name}-{i}"), &uri);
    }
    let expected = writer.join().expect("writer");
    // The kubelet restarts a container that exited (a run started right after a kill can find
    // the killed one's transaction still open: exit 10).
    let deadline = Instant::now() + Duration::from_secs(90);
    while live.outbox_len() < expected {
        assert!(
            Instant::now() < deadline,
            "the pods never caught up (seed {seed})"
        );
        for (i, pod) in pods.iter_mut().enumerate() {
            if let Some(status) = pod.child.try_wait().expect("try_wait") {
                assert_eq!(status.code(), Some(10), "{} (seed {seed})", pod.name);
                *pod = start_pod(container, &format!("{name}-{i}"), &uri);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Scaled to zero: each pod gets SIGTERM and ends within its grace period, exit 0.
    for pod in &pods {
        probe_until_ok(pod, "/readyz");
    }
    let signalled = Instant::now();
    for pod in &pods {
        support::sigterm(&pod.child);
    }
    for pod in pods {
        let output = pod.child.wait_with_output().expect("the pod ends");
        assert!(signalled.elapsed() < Duration::from_secs(grace));
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}: {}",
            pod.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    partitions::check_partitioned(&live.outbox(), expected, replicas, seed);
    eprintln!(
        "{replicas} pods, {expected} writes, {kills} pods killed and started again: every write \
         once, each key in one partition, in order"
    );
}
