//! The policy authors' kit: shipped policies pass their cases on the same host binary, case
//! mismatches are shown and can be accepted, `policy check` tells what a file is, `policy new`
//! scaffolds a crate that builds and passes as generated, and `record` turns live traffic into a
//! fixture that replays to the same outbox.

use crate::support;

use handoff::runtime::policy::CONTRACT;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bson::doc;
use serde_json::{Value, json};
use support::live::Live;
use support::*;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn policy(args: &[&str]) -> Output {
    handoff().arg("policy").args(args).output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn every_shipped_policy_passes_its_cases_on_the_same_host() {
    for (policy_file, cases) in [
        (None, "guest/default/cases"),
        (
            Some(handoff_test_policies::BATCHING),
            "guest/batching/cases",
        ),
        (
            Some(handoff_test_policies::QUARANTINE),
            "guest/quarantine/cases",
        ),
        (
            Some(handoff_test_policies::DOMAIN_EVENTS),
            "guest/domain-events/cases",
        ),
    ] {
        let mut args = vec!["test"];
        if let Some(file) = policy_file {
            args.extend(["--policy", file]);
        }
        let dir = workspace().join(cases);
        args.push(dir.to_str().unwrap());
        let output = policy(&args);
        let text = stdout(&output);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{cases}: {text}{}",
            stderr(&output)
        );
        assert!(
            text.contains(", 0 failed") && !text.contains(" 0 passed"),
            "{text}"
        );
    }
}

#[test]
fn a_mismatch_prints_a_diff_and_fails_and_update_accepts_it() {
    let s = Scratch::new();
    let case = s.path("cases/every-operation");
    std::fs::create_dir_all(&case).unwrap();
    let source = workspace().join("guest/default/cases/every-operation");
    std::fs::copy(source.join("stream.jsonl"), case.join("stream.jsonl")).unwrap();
    let mut spec: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("case.json")).unwrap()).unwrap();
    spec["expect"][0]["outbox"][1] = Value::String("not-the-id".into());
    std::fs::write(case.join("case.json"), spec.to_string()).unwrap();

    let cases = s.path("cases");
    let output = policy(&["test", cases.to_str().unwrap()]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(9), "{text}");
    assert!(text.contains("FAILED   every-operation"), "{text}");
    assert!(text.contains("-      \"not-the-id\""), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with('+') && l.contains(&baseline_event_id(&token_of(&case, 2)))),
        "{text}"
    );
    assert!(text.contains("0 passed, 1 failed"));

    // Without a terminal to ask, --update refuses unless told --yes, and writes nothing.
    let before = std::fs::read(case.join("case.json")).unwrap();
    let output = policy(&["test", "--update", cases.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
    assert!(stderr(&output).contains("add --yes"), "{}", stderr(&output));
    assert_eq!(std::fs::read(case.join("case.json")).unwrap(), before);

    let output = policy(&["test", "--update", "--yes", cases.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    let output = policy(&["test", cases.to_str().unwrap()]);
    assert!(
        stdout(&output).contains("1 passed, 0 failed"),
        "{}",
        stdout(&output)
    );
}

/// The token of the `n`th event (1-based) of a case's stream.
fn token_of(case: &Path, n: usize) -> Value {
    let text = std::fs::read_to_string(case.join("stream.jsonl")).unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("operationType").is_some())
        .collect();
    events[n - 1]["_id"].clone()
}

#[test]
fn batching_and_quarantine_swap_in_without_rebuilding_the_host() {
    let s = Scratch::new();
    let mut lines = vec![deployment(REPLICA_SET_ID)];
    for seq in 1..=7 {
        let mut e = event(seq, "insert");
        e["fullDocument"]["schemaVersion"] = Value::from(if seq == 4 { 9 } else { 1 });
        lines.push(e);
    }
    lines.push(batch_end(7));
    let fixture = s.fixture("seven.jsonl", &lines);
    let default = ok(&replay(&fixture, &s.path("default.redb"), &[]));
    let batching = ok(&replay(
        &fixture,
        &s.path("batching.redb"),
        &[
            "--policy",
            handoff_test_policies::BATCHING,
            "--policy-param",
            "batch_size=3",
        ],
    ));
    let quarantine = ok(&replay(
        &fixture,
        &s.path("quarantine.redb"),
        &["--policy", handoff_test_policies::QUARANTINE],
    ));
    // Three different components ran on this one binary.
    let digests: std::collections::HashSet<_> = [&default, &batching, &quarantine]
        .iter()
        .map(|o| o["policy_sha256"].to_string())
        .collect();
    assert_eq!(digests.len(), 3);

    let expected: Vec<String> = (1..=7).map(|seq| baseline_event_id(&token(seq))).collect();
    assert_eq!(outbox_ids(&inspect(&s.path("default.redb")).1), expected);
    // Batching: the baseline's IDs and the same checkpoint, in fewer transactions.
    let (checkpoint, outbox) = inspect(&s.path("batching.redb"));
    assert_eq!(outbox_ids(&outbox), expected);
    assert_eq!(checkpoint["token"], batch_end(7)["$postBatchResumeToken"]);

    // Quarantine: event 4 (schemaVersion 9) is quarantined with its token and reason; the rest flow.
    assert_eq!(quarantine["events_handed_off"], 6);
    assert_eq!(quarantine["events_quarantined"], 1);
    let (_, records) = inspect(&s.path("quarantine.redb"));
    let (held, handed): (Vec<_>, Vec<_>) =
        records.into_iter().partition(|r| r.get("reason").is_some());
    assert_eq!(handed.len(), 6);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["token"], token(4));
    assert_eq!(
        held[0]["_id"],
        format!("orders-to-outbox/{}", baseline_event_id(&token(4)))
    );
    assert!(
        held[0]["reason"]
            .as_str()
            .unwrap()
            .contains("schemaVersion 9 is not supported")
    );
    assert_eq!(held[0]["event"]["fullDocument"]["schemaVersion"], 9);
}

#[test]
fn policy_check_tells_what_a_file_is_and_refuses_what_the_host_would() {
    let s = Scratch::new();
    let exported = s.path("default.wasm");
    assert!(
        policy(&["export-default", exported.to_str().unwrap()])
            .status
            .success()
    );
    let bytes = std::fs::read(&exported).unwrap();
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(&bytes));

    let output = policy(&["check", exported.to_str().unwrap()]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("sha256:    {digest}")), "{text}");
    assert!(text.contains(&format!("size:      {} bytes", bytes.len())));
    assert!(
        text.contains(&format!(
            "contract:  {CONTRACT} (this host implements {CONTRACT}): compatible"
        )),
        "{text}"
    );
    assert!(text.contains("verdict:   this host runs it"));

    let legacy = policy(&["check", handoff_test_policies::LEGACY_V1_0]);
    assert!(stdout(&legacy).contains(&format!(
        "contract:  1.0.0 (this host implements {CONTRACT}): compatible"
    )));
    let legacy_batches = policy(&["check", handoff_test_policies::LEGACY_V1_1]);
    assert!(
        stdout(&legacy_batches).contains(&format!(
            "contract:  1.1.0 (this host implements {CONTRACT}): compatible"
        )),
        "{}",
        stdout(&legacy_batches)
    );
    // An older minor version also runs: its IDs show it is the one making the decisions.
    let fixture = s.fixture("f.jsonl", &[deployment(REPLICA_SET_ID), event(1, "insert")]);
    let out = ok(&replay(
        &fixture,
        &s.state(),
        &["--policy", handoff_test_policies::LEGACY_V1_0],
    ));
    assert_eq!(
        out["last_event_id"],
        format!("v1-{}", &baseline_event_id(&token(1))[..16])
    );
    // So does a policy built against 1.1.0 that commits batches.
    let out = ok(&replay(
        &fixture,
        &s.path("legacy-1.1.redb"),
        &["--policy", handoff_test_policies::LEGACY_V1_1],
    ));
    assert_eq!(
        out["last_event_id"],
        format!("v11-{}", &baseline_event_id(&token(1))[..16])
    );
    assert_eq!(out["events_handed_off"], 1);

    // Sockets are linked and denied, and the check says so for each import.
    let output = policy(&["check", handoff_test_policies::NET_CLIENT]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let shown = stdout(&output);
    assert!(
        shown.lines().any(
            |l| l.starts_with("import:    wasi:sockets/tcp@") && l.contains("every use denied")
        ),
        "{shown}"
    );
    assert!(
        shown.lines().any(|l| l.starts_with("import:    wasi:cli/environment@") && l.contains("no variable")),
        "{shown}"
    );
    for (file, needle) in [
        (
            handoff_test_policies::FUTURE_MINOR,
            format!("newer than this host's {CONTRACT}; upgrade handoff"),
        ),
        (
            handoff_test_policies::FUTURE_MAJOR,
            "a different major version is incompatible".to_string(),
        ),
        (
            handoff_test_policies::FOREIGN_IMPORT,
            "imports what the host does not grant: handoff:policy/backdoor".to_string(),
        ),
    ] {
        let output = policy(&["check", file]);
        assert_eq!(output.status.code(), Some(9), "{file}");
        assert!(stdout(&output).contains("verdict:   refused"));
        assert!(stderr(&output).contains(&needle), "{}", stderr(&output));
        // The same refusal when it is deployed.
        fails(
            &replay(&fixture, &s.path("refused.redb"), &["--policy", file]),
            9,
            &needle,
        );
    }
    let core = s.path("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let output = policy(&["check", core.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(9));
    assert!(stdout(&output).contains("component: no"));
    assert!(stderr(&output).contains("core WebAssembly module"));
}

/// The SDK crate as `cargo package` builds it, unpacked into `dir` (what `HANDOFF_SDK_DIR`
/// holds), offline; its version.
fn packaged_sdk(dir: &Path) -> String {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sdk-package");
    let output = Command::new(env!("CARGO"))
        .args([
            "package",
            "-p",
            "handoff-policy-sdk",
            "--no-verify",
            "--offline",
        ])
        .args(["--allow-dirty", "--quiet", "--target-dir"])
        .arg(&target)
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo package: {}",
        stderr(&output)
    );
    let manifest: toml::Table = std::fs::read_to_string(workspace().join("guest/sdk/Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let version = manifest["package"]["version"].as_str().unwrap().to_string();
    std::fs::create_dir_all(dir).unwrap();
    let crate_file = target.join(format!("package/handoff-policy-sdk-{version}.crate"));
    let unpacked = Command::new("tar")
        .arg("-xzf")
        .arg(&crate_file)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap();
    assert!(unpacked.success());
    version
}

#[test]
fn policy_new_builds_tests_checks_and_passes_its_cases_as_generated() {
    let s = Scratch::new();
    let sdk = s.path("sdk");
    let version = packaged_sdk(&sdk);
    let new = |name: &str| {
        handoff()
            .args(["policy", "new", name, "--dir"])
            .arg(s.dir.path())
            .env("HANDOFF_SDK_DIR", &sdk)
            .output()
            .unwrap()
    };
    let output = new("shop-policy");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let root = s.path("shop-policy");
    for file in [
        "Cargo.toml",
        "rust-toolchain.toml",
        ".cargo/config.toml",
        "src/lib.rs",
        "README.md",
        "cases/sample/case.json",
    ] {
        assert!(root.join(file).exists(), "{file}");
    }
    // The project names the SDK by version and carries none of it.
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        manifest["dependencies"]["handoff-policy-sdk"].as_str(),
        Some(version.as_str())
    );
    assert!(!root.join("handoff-policy-sdk").exists());
    assert!(!root.join("wit").exists());
    // The policy as generated is the smallest one: at most 5 lines besides comments and tests
    // (the SDK's `policy!` makes a policy of one function), and no contract version.
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let code = lib
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap()
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with("//"))
        .count();
    assert!(code <= 5, "{code} lines:\n{lib}");
    assert!(!lib.contains("handoff:policy"), "{lib}");
    // Refuses to overwrite, refuses a bad name, and an SDK directory without the crate.
    assert_eq!(new("shop-policy").status.code(), Some(2));
    assert_eq!(new("Bad Name").status.code(), Some(2));
    let missing = handoff()
        .args(["policy", "new", "elsewhere", "--dir"])
        .arg(s.dir.path())
        .env("HANDOFF_SDK_DIR", s.dir.path())
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains(&format!("no handoff-policy-sdk-{version}/Cargo.toml")),
        "{}",
        stderr(&missing)
    );
    assert!(!s.path("elsewhere").exists());

    // The generated crate, built the way its README says (sharing one target directory), offline.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffold-build");
    let cargo = |args: &[&str]| {
        let output = Command::new(env!("CARGO"))
            .args(args)
            .arg("--offline")
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cargo {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert!(cargo(&["test"]).contains("test result: ok. 2 passed"));
    cargo(&["build", "--release", "--target", "wasm32-wasip2"]);
    let wasm = target.join("wasm32-wasip2/release/shop_policy.wasm");
    let check = policy(&["check", wasm.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    let cases = root.join("cases");
    let test = policy(&[
        "test",
        "--policy",
        wasm.to_str().unwrap(),
        cases.to_str().unwrap(),
    ]);
    assert_eq!(test.status.code(), Some(0), "{}", stdout(&test));
    assert!(stdout(&test).contains("1 passed, 0 failed"));
    // As generated it is the default policy: it passes the default's cases.
    let default_cases = workspace().join("guest/default/cases");
    let default = policy(&[
        "test",
        "--policy",
        wasm.to_str().unwrap(),
        default_cases.to_str().unwrap(),
    ]);
    assert_eq!(default.status.code(), Some(0), "{}", stdout(&default));
    assert!(
        stdout(&default).contains(" passed, 0 failed"),
        "{}",
        stdout(&default)
    );

    // A fix to the SDK, released as a new version, reaches the existing project by moving to it.
    let (major_minor, patch) = version.rsplit_once('.').unwrap();
    let fixed = format!("{major_minor}.{}", patch.parse::<u32>().unwrap() + 1);
    let released = sdk.join(format!("handoff-policy-sdk-{fixed}"));
    let copied = Command::new("cp")
        .arg("-R")
        .arg(sdk.join(format!("handoff-policy-sdk-{version}")))
        .arg(&released)
        .status()
        .unwrap();
    assert!(copied.success());
    let edit = |path: &Path, from: &str, to: &str| {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains(from), "{}: no {from}", path.display());
        std::fs::write(path, text.replacen(from, to, 1)).unwrap();
    };
    edit(
        &released.join("Cargo.toml"),
        &format!("version = \"{version}\""),
        &format!("version = \"{fixed}\""),
    );
    let lib_rs = released.join("src/lib.rs");
    let mut sdk_lib = std::fs::read_to_string(&lib_rs).unwrap();
    sdk_lib.push_str("\n/// The fix of this release.\npub const FIXED: bool = true;\n");
    std::fs::write(&lib_rs, sdk_lib).unwrap();
    edit(
        &root.join("Cargo.toml"),
        &format!("handoff-policy-sdk = \"{version}\""),
        &format!("handoff-policy-sdk = \"{fixed}\""),
    );
    edit(
        &root.join(".cargo/config.toml"),
        &format!("handoff-policy-sdk-{version}"),
        &format!("handoff-policy-sdk-{fixed}"),
    );
    edit(
        &root.join("src/lib.rs"),
        "    #[test]\n",
        "    #[test]\n    fn the_sdk_fix_is_here() {\n        assert!(handoff_policy_sdk::FIXED);\n    }\n\n    #[test]\n",
    );
    assert!(cargo(&["test"]).contains("test result: ok. 3 passed"));
}

#[test]
fn record_captures_live_traffic_that_replays_to_the_same_outbox() {
    let live = Live::start();
    let s = Scratch::new();
    let recording = s.path("recorded/stream.jsonl");
    refused(
        &handoff()
            .args(["record", "--redact", "_id._data", "--out"])
            .arg(&recording)
            .env("MONGODB_URI", live.uri())
            .env("SOURCE_DATABASE", &live.db)
            .output()
            .unwrap(),
        2,
        "cannot hide the resume token",
    );
    let mut child = handoff()
        .args([
            "record",
            "--redact",
            "fullDocument.email",
            "--redact",
            "lines.email",
            "--max-wait-seconds",
            "2",
            "--case",
        ])
        .arg(s.path("recorded"))
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .env("HANDOFF_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("recording") {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "the recorder ended before recording"
        );
    }
    live.wait(async {
        let orders = live.coll("orders");
        orders
            .insert_many(vec![
                doc! {"_id": 1, "email": "a@example.com"},
                doc! {"_id": 2, "email": "b@example.com"},
            ])
            .await
            .unwrap();
        orders
            .update_one(doc! {"_id": 1}, doc! {"$set": {"qty": 2}})
            .await
            .unwrap();
        // The address again, where an update carries it: a changed field, a dotted path into an
        // array, a subdocument holding it.
        orders
            .update_one(doc! {"_id": 2}, doc! {"$set": {"email": "c@example.com"}})
            .await
            .unwrap();
        orders
            .update_one(
                doc! {"_id": 2},
                doc! {"$set": {"lines": [{"email": "d@example.com", "sku": "s1"}]}},
            )
            .await
            .unwrap();
        orders
            .update_one(
                doc! {"_id": 2},
                doc! {"$set": {"lines.0.email": "e@example.com"}},
            )
            .await
            .unwrap();
    });
    let status = child.wait().unwrap();
    assert!(status.success());

    let text = std::fs::read_to_string(&recording).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[0]["$deployment"]["source"],
        format!("{}.orders", live.db)
    );
    assert_eq!(
        lines[0]["$deployment"]["replicaSetId"],
        live.replica_set_id()
    );
    let events: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("operationType").is_some())
        .collect();
    assert_eq!(events.len(), 6);
    assert!(
        lines
            .iter()
            .any(|l| l.get("$postBatchResumeToken").is_some()),
        "{text}"
    );
    assert!(
        !text.contains("example.com"),
        "redacted fields leaked: {text}"
    );
    assert_eq!(events[0]["fullDocument"]["email"], "<redacted>");
    assert_eq!(events[2]["fullDocument"]["qty"], 2);
    assert_eq!(
        events[3]["updateDescription"]["updatedFields"]["email"],
        "<redacted>"
    );
    assert_eq!(
        events[4]["updateDescription"]["updatedFields"]["lines"][0],
        json!({"email": "<redacted>", "sku": "s1"})
    );
    assert_eq!(
        events[5]["updateDescription"]["updatedFields"]["lines.0.email"],
        "<redacted>"
    );

    // The recording is a complete case: its expectations are the default policy's results.
    let cases = s.path("recorded");
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(cases.join("case.json")).unwrap()).unwrap();
    assert_eq!(case["runs"], 1, "{case}");
    assert_eq!(case["expect"][0]["events_handed_off"], 6, "{case}");
    assert!(stdout(&policy(&["test", cases.to_str().unwrap()])).contains("1 passed, 0 failed"));
    // A second recording into the same case folder is refused before anything is recorded.
    let again = handoff()
        .args(["record", "--max-wait-seconds", "1", "--case"])
        .arg(&cases)
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .output()
        .unwrap();
    refused(&again, 2, "holds a case already");

    // The recording is a fixture: replaying it, with the database and collection it names,
    // hands off the recorded events with the live IDs.
    let out = ok(&replay(&recording, &s.state(), &[]));
    assert_eq!(out["events_handed_off"], 6);
    let ids = outbox_ids(&inspect(&s.state()).1);
    let expected: Vec<String> = events
        .iter()
        .map(|e| {
            let token = bson::Document::try_from(e["_id"].as_object().unwrap().clone()).unwrap();
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(
                handoff::domain::token::canonical_text(&token).as_bytes(),
            ))
        })
        .collect();
    assert_eq!(ids, expected);
    // A database named otherwise is refused: the recording names its own.
    let other = replay(
        &recording,
        &s.path("other.redb"),
        &["--database", "elsewhere"],
    );
    fails(&other, 2, "recorded from");
}

#[test]
fn every_shipped_policy_is_exported_and_passes_its_own_cases() {
    let s = Scratch::new();
    let listed = policy(&["export", "--list"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let names: Vec<&str> = handoff::runtime::policy::SHIPPED
        .iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names[0], "default");
    assert!(names.len() >= 4, "{names:?}");
    for name in names {
        // One line each: the name, its digest and what it does.
        let line = stdout(&listed)
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(str::to_string);
        let line = line.unwrap_or_else(|| panic!("{name} not listed: {}", stdout(&listed)));
        assert!(line.split_whitespace().count() > 3, "{line}");
        let file = s.path(&format!("exported/{name}.wasm"));
        let output = policy(&["export", name, file.to_str().unwrap()]);
        assert!(output.status.success(), "{}", stderr(&output));
        let digest = line.split_whitespace().nth(1).unwrap();
        assert!(stdout(&output).starts_with(digest), "{}", stdout(&output));
        let output = policy(&["check", file.to_str().unwrap()]);
        assert!(
            output.status.success() && stdout(&output).contains("this host runs it"),
            "{name}: {}{}",
            stdout(&output),
            stderr(&output)
        );
        let cases = workspace().join("guest").join(name).join("cases");
        let output = policy(&[
            "test",
            "--policy",
            file.to_str().unwrap(),
            cases.to_str().unwrap(),
        ]);
        assert!(
            output.status.success(),
            "{name}: {}{}",
            stdout(&output),
            stderr(&output)
        );
        assert!(stdout(&output).contains(" passed, 0 failed"));
    }
    // The exported domain-events policy is the component built from `guest/domain-events`.
    assert_eq!(
        std::fs::read(s.path("exported/domain-events.wasm")).unwrap(),
        std::fs::read(handoff_test_policies::DOMAIN_EVENTS).unwrap()
    );
    // The default is the same bytes under both commands.
    let old = s.path("exported/old.wasm");
    assert!(
        policy(&["export-default", old.to_str().unwrap()])
            .status
            .success()
    );
    assert_eq!(
        std::fs::read(&old).unwrap(),
        std::fs::read(s.path("exported/default.wasm")).unwrap()
    );
    // An unknown name is bad input and writes nothing.
    let missing = s.path("exported/nope.wasm");
    let output = policy(&["export", "nope", missing.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("default, batching, quarantine, domain-events"),
        "{}",
        stderr(&output)
    );
    assert!(!missing.exists());
}

#[test]
fn policy_test_filters_cases_and_reports_as_json_or_junit() {
    let s = Scratch::new();
    let cases = s.path("cases");
    for name in [
        "every-operation",
        "max-events",
        "invalidate-then-start-after",
    ] {
        let from = workspace().join("guest/default/cases").join(name);
        let to = cases.join(name);
        std::fs::create_dir_all(&to).unwrap();
        for file in ["case.json", "stream.jsonl"] {
            std::fs::copy(from.join(file), to.join(file)).unwrap();
        }
    }
    let dir = cases.to_str().unwrap();

    // A filter by text, then by glob; JSON says which ran.
    let output = policy(&["test", "--filter", "max", "--format", "json", dir]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["passed"], 1);
    assert_eq!(report["failed"], 0);
    assert_eq!(report["cases"][0]["name"], "max-events");
    assert_eq!(report["cases"][0]["verdict"], "passed");
    assert_eq!(report["policy"], "embedded default");
    let output = policy(&["test", "--filter", "*-after", "--format", "json", dir]);
    let report: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["cases"].as_array().unwrap().len(), 1);
    assert_eq!(report["cases"][0]["name"], "invalidate-then-start-after");
    // A filter that selects nothing is an error, not a pass.
    let output = policy(&["test", "--filter", "nothing-like-this", dir]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("no case in"),
        "{}",
        stderr(&output)
    );

    // JUnit: every case, and the failing one carries its diff.
    let spec_path = cases.join("max-events/case.json");
    let mut spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    spec["expect"][0]["outbox"][0] = Value::String("<not&the-id>".into());
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let output = policy(&["test", "--format", "junit", dir]);
    assert_eq!(output.status.code(), Some(9));
    let xml = stdout(&output);
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert!(
        xml.contains(r#"<testsuites tests="3" failures="1""#),
        "{xml}"
    );
    for name in [
        "every-operation",
        "max-events",
        "invalidate-then-start-after",
    ] {
        assert!(
            xml.contains(&format!(r#"<testcase name="{name}""#)),
            "{xml}"
        );
    }
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    assert!(xml.contains("&lt;not&amp;the-id&gt;"), "{xml}");
}

/// `policy test --update` on a terminal (util-linux `script` gives it one), answering `answer`.
fn update_on_a_terminal(cases: &Path, answer: &str) -> Output {
    use std::io::Write;
    let command = format!(
        "{} policy test --update {}",
        env!("CARGO_BIN_EXE_handoff"),
        cases.display()
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux `script` runs the command on a terminal");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn update_asks_on_a_terminal_and_a_no_writes_nothing() {
    let s = Scratch::new();
    let case = s.path("cases/max-events");
    std::fs::create_dir_all(&case).unwrap();
    let source = workspace().join("guest/default/cases/max-events");
    std::fs::copy(source.join("stream.jsonl"), case.join("stream.jsonl")).unwrap();
    let mut spec: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("case.json")).unwrap()).unwrap();
    spec["expect"][0]["outbox"][0] = Value::String("stale".into());
    std::fs::write(case.join("case.json"), spec.to_string()).unwrap();
    let before = std::fs::read(case.join("case.json")).unwrap();

    let output = update_on_a_terminal(&s.path("cases"), "n\n");
    let text = stdout(&output);
    assert!(
        text.contains("write these results as the expectations of max-events? [y/N]"),
        "{text}"
    );
    assert!(
        text.contains("\"stale\""),
        "the diff is shown before the question: {text}"
    );
    assert!(text.contains("update declined: nothing written"), "{text}");
    assert_eq!(output.status.code(), Some(9), "{text}");
    assert_eq!(std::fs::read(case.join("case.json")).unwrap(), before);

    let output = update_on_a_terminal(&s.path("cases"), "y\n");
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    assert!(stdout(&output).contains("updated  max-events"));
    assert!(
        policy(&["test", s.path("cases").to_str().unwrap()])
            .status
            .success()
    );
}

/// `policy build --watch` builds again when a source file changes, and keeps watching after a
/// failed build (here cargo refuses a broken manifest at once, so no toolchain work is timed).
#[test]
fn policy_build_watch_rebuilds_when_a_source_changes() {
    let s = Scratch::new();
    let project = s.path("watched");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(project.join("Cargo.toml"), "this is [not a manifest\n").unwrap();
    let mut child = handoff()
        .args(["policy", "build", "--watch"])
        .arg(&project)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let watching = |what: &str| loop {
        let line = received
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no `watching` line {what}"));
        if line.starts_with("watching ") {
            break;
        }
    };
    watching("after the first build");
    // Nothing changed: no new build within a few polls.
    assert!(
        received
            .recv_timeout(std::time::Duration::from_millis(1500))
            .is_err()
    );
    std::fs::write(project.join("src/lib.rs"), "// changed\n").unwrap();
    watching("after a source changed");
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    let err = stderr(&output);
    assert!(
        err.matches("cargo build failed").count() >= 2,
        "each build reports its failure: {err}"
    );
}

/// `policy build` runs each language's toolchain without the shell's secrets: here every
/// toolchain program is a script that records the environment it was given.
#[test]
fn policy_build_keeps_secrets_out_of_the_toolchains_environment() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    let bin = s.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let record = s.path("seen-env");
    let recorder = format!(
        "#!/bin/sh\n{{ echo \"== $(basename \"$0\") $*\"; env; }} >> '{}'\n\
         case \"$1\" in --version) echo 'componentize-py 9.9.9' ;; esac\nexit 0\n",
        record.display()
    );
    for program in ["cargo", "componentize-py", "node", "npm"] {
        let path = bin.join(program);
        std::fs::write(&path, &recorder).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let rust = s.path("rust-policy");
    std::fs::create_dir_all(&rust).unwrap();
    std::fs::write(rust.join("Cargo.toml"), "[package]\nname = \"p\"\n").unwrap();
    let python = s.path("python-policy");
    std::fs::create_dir_all(python.join("wit")).unwrap();
    for file in ["policy.py", "handoff_policy.py", "wit/policy.wit"] {
        std::fs::write(python.join(file), "").unwrap();
    }
    std::fs::write(
        python.join("pyproject.toml"),
        "[tool.handoff]\ncomponentize-py = \"9.9.9\"\n",
    )
    .unwrap();
    let javascript = s.path("javascript-policy");
    std::fs::create_dir_all(&javascript).unwrap();
    std::fs::write(javascript.join("package.json"), "{}\n").unwrap();

    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (project, tools) in [
        (&rust, &["cargo"][..]),
        (
            &python,
            &["componentize-py --version", "componentize-py -d"],
        ),
        (
            &javascript,
            &["node --version", "npm --version", "npm install"],
        ),
    ] {
        let output = handoff()
            .args(["policy", "build"])
            .arg(project)
            .env("PATH", &path)
            .env(
                "MONGODB_URI",
                "mongodb://app:hunter2@db.example/?replicaSet=rs0",
            )
            .env("AWS_SECRET_ACCESS_KEY", "hunter2")
            .env("CARGO_REGISTRIES_PRIVATE_TOKEN", "hunter2")
            .env("HANDOFF_OPERATOR", "hunter2")
            .env("CARGO_HOME", "/opt/cargo")
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        // None of the fakes builds a component: the build fails after they ran.
        assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
        let seen = std::fs::read_to_string(&record).unwrap_or_else(|e| {
            panic!(
                "{}: no toolchain ran ({e}): {}",
                project.display(),
                stderr(&output)
            )
        });
        std::fs::remove_file(&record).unwrap();
        for tool in tools {
            assert!(
                seen.contains(&format!("== {tool}")),
                "{tool} did not run: {seen}"
            );
        }
        assert!(
            !seen.contains("hunter2"),
            "a secret reached the toolchain: {seen}"
        );
        assert!(!seen.contains("MONGODB_URI"), "{seen}");
        for kept in [
            format!("PATH={path}"),
            "CARGO_HOME=/opt/cargo".into(),
            "LC_ALL=C".into(),
        ] {
            assert!(seen.contains(&kept), "{kept} missing: {seen}");
        }
    }
}

/// A case giving a parameter its policy does not read is refused as a wrong case, naming the
/// parameter the policy reads.
#[test]
fn a_case_with_a_parameter_its_policy_does_not_read_is_refused() {
    let s = Scratch::new();
    let case = s.path("cases/typo");
    std::fs::create_dir_all(&case).unwrap();
    std::fs::copy(s.three_events(), case.join("stream.jsonl")).unwrap();
    std::fs::write(
        case.join("case.json"),
        r#"{"runs": 1, "params": {"batch_sise": "3"}}"#,
    )
    .unwrap();
    let output = policy(&[
        "test",
        "--policy",
        handoff_test_policies::BATCHING,
        case.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("did you mean batch_size?"),
        "{}",
        stderr(&output)
    );
}
