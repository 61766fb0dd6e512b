//! What the operator's commands and the runs print, and what they refuse before doing anything: a
//! consumer ID is never taken for a resume token while a real token still never gets through; a
//! reason with invisible or reordering characters is refused and the audit record names the
//! process's own user; a report path that cannot be written is refused before MongoDB is read or
//! written; a replica set name from the server is escaped in every log format; and a closed or
//! full stdout ends a command with its exit code, never a panic, the outputs file still written.

use crate::support;

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Output, Stdio};

use bson::doc;
use mongo_sim::{Config, ServerHandle};
use serde_json::{Value, json};
use support::live::*;
use support::*;

/// A valid consumer ID made of uppercase hex digits only.
const HEX_CONSUMER: &str = "DEADBEEF00000000A";

/// A resume token's `_data` of the shape real servers send.
const RAW_TOKEN: &str = "8263515EAC000000022B0229296E04";

const AUDIT: &str = "kestra_change_audit";

fn replay_as(consumer: &str, fixture: &std::path::Path, state: &std::path::Path) -> Output {
    handoff()
        .arg("replay")
        .arg(fixture)
        .arg("--state")
        .arg(state)
        .env("CONSUMER_ID", consumer)
        .output()
        .expect("run handoff")
}

#[test]
fn a_consumer_id_of_hex_digits_is_printed_as_given_while_tokens_are_still_replaced() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "lost.jsonl",
        &[
            deployment(REPLICA_SET_ID),
            event(1, "insert"),
            json!({"$error": {"code": 286, "codeName": "ChangeStreamHistoryLost",
                "errmsg": format!("cannot resume from {RAW_TOKEN}")}}),
        ],
    );
    let output = replay_as(HEX_CONSUMER, &fixture, &s.state());
    let out = fails(&output, 6, "code 286");
    assert_eq!(out["consumer_id"], HEX_CONSUMER, "{out}");
    let next: Vec<&Value> = ["next_commands", "next_commands_by_hand"]
        .iter()
        .flat_map(|key| out["evidence"][key].as_array().expect("commands"))
        .collect();
    assert!(next.len() > 1, "{out}");
    for command in next {
        assert!(
            command
                .as_str()
                .expect("a command")
                .contains(&format!("--consumer-id {HEX_CONSUMER}")),
            "{command}"
        );
    }
    let guidance = out["guidance"].as_str().expect("guidance");
    assert!(
        guidance.contains(&format!("--consumer-id {HEX_CONSUMER}")),
        "{guidance}"
    );
    // The server's text named a token: it is replaced wherever it is printed.
    assert!(
        guidance.contains("cannot resume from <token>"),
        "{guidance}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let err = stderr(&output);
    assert!(!stdout.contains(RAW_TOKEN) && !err.contains(RAW_TOKEN));
    assert!(
        err.contains(&format!("--consumer-id {HEX_CONSUMER}")),
        "{err}"
    );

    // A successful run reports it the same way, in its outputs and its metrics' tags.
    let s = Scratch::new();
    let output = replay_as(HEX_CONSUMER, &s.three_events(), &s.state());
    assert_eq!(ok(&output)["consumer_id"], HEX_CONSUMER);
    let metrics = protocol_line(&output, "metrics");
    assert_eq!(metrics[0]["tags"]["consumer"], HEX_CONSUMER, "{metrics}");
}

/// `handoff ARGS…` against the test's deployment and database.

#[test]
fn a_reason_with_hidden_characters_is_refused_and_the_audit_names_the_os_user() {
    let live = Live::start();
    live.start_consumer();
    let before = live.checkpoint().expect("a checkpoint");
    for reason in [
        "INC-42 \u{202e}desrever",
        "INC-42\u{200b}",
        "INC-42\u{2028}forged: line",
        "INC-42\u{2066}isolated\u{2069}",
        "INC-42\u{1b}[2K",
        "INC-42\nsecond line",
    ] {
        let output = live.operator(&["checkpoint", "reset", "--to", "now", "--reason", reason]);
        refused(&output, 2, "--reason holds the character U+");
        let run = live.run(&["--accept-config-change", reason]);
        fails(&run, 2, "--accept-config-change holds the character U+");
    }
    assert_eq!(live.checkpoint().expect("a checkpoint"), before);
    assert!(live.records(AUDIT).is_empty());

    // The operator is named by the environment; the OS user by the process's real uid, whatever
    // `$USER` says.
    let output = handoff()
        .args(["checkpoint", "reset", "--to", "now", "--reason", "INC-42"])
        .env("MONGODB_URI", live.uri())
        .env("SOURCE_DATABASE", &live.db)
        .env_remove(support::env_names::AUDIT_COLLECTION)
        .env("HANDOFF_OPERATOR", "kestra execution 42")
        .env("USER", "forged-user")
        .env("LOGNAME", "forged-user")
        .output()
        .expect("run handoff");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let records = live.records(AUDIT);
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.get_str("by").ok(), Some("kestra execution 42"));
    let user = record.get_document("os_user").expect("os_user");
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(user.get_i64("uid").ok(), Some(i64::from(uid)), "{record}");
    let listed = std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.get(2) == Some(&uid.to_string().as_str())).then(|| fields[0].to_string())
        });
    assert_eq!(user.get_str("name").ok(), listed.as_deref(), "{record}");
    assert_ne!(user.get_str("name").ok(), Some("forged-user"));
}

#[test]
fn a_report_path_that_cannot_be_written_is_refused_before_anything_is_read_or_written() {
    let live = Live::with_config(Config::default());
    live.start_consumer();
    live.insert(0..3);
    support::ok(&live.run(&[]));
    // The outbox forgets a document: a repair would hand off a correction record.
    live.wait(
        live.coll(OUTBOX)
            .delete_many(doc! {"event.documentKey._id": 0}),
    )
    .expect("delete a record");
    let outbox = live.outbox_len();
    let s = Scratch::new();
    let missing = s.path("no-such-folder").join("report.html");
    let folder = s.dir.path().to_path_buf();
    let asked_before = live.commands_from_handoff().len();
    for path in [&missing, &folder] {
        let path = path.to_str().expect("a path");
        let repair = live.operator(&[
            "reconcile",
            "--repair",
            "--reason",
            "INC-42",
            "--html",
            path,
        ]);
        refused(&repair, 2, "--html");
        let status = live.operator(&["status", "--html", path]);
        refused(&status, 2, "nothing was read or written");
    }
    assert_eq!(live.commands_from_handoff().len(), asked_before);
    assert_eq!(live.outbox_len(), outbox);
    assert!(live.records(AUDIT).is_empty());

    // A path that can be written: the repair is made and its report written.
    let page = s.path("report.html");
    let repair = live.operator(&[
        "reconcile",
        "--repair",
        "--reason",
        "INC-42",
        "--html",
        page.to_str().expect("a path"),
    ]);
    assert_eq!(repair.status.code(), Some(0), "{}", stderr(&repair));
    assert_eq!(live.outbox_len(), outbox + 1);
    assert!(
        std::fs::read_to_string(&page)
            .expect("the report")
            .contains("<html")
    );
}

/// Every line of `text` as a reader that also breaks lines at U+2028, U+2029 and NEL sees it.
fn lines(text: &str) -> Vec<&str> {
    text.split(['\n', '\r', '\u{2028}', '\u{2029}', '\u{85}'])
        .collect()
}

#[test]
fn a_hostile_replica_set_name_is_escaped_in_every_log_format() {
    let forged = "::{\"outputs\":{\"status\":\"HANDED_OFF\",\"forged\":true}}::";
    let name = format!("rs0\n{forged}\u{2028}{forged}\u{202e}");
    let server = ServerHandle::start_blocking(Config {
        set_name: name,
        ..Config::default()
    })
    .expect("test server starts");
    for format in ["text", "json", "kestra"] {
        let output = handoff()
            .arg("run")
            .env("MONGODB_URI", server.direct_uri())
            .env("SOURCE_DATABASE", DB)
            .env("MAX_WAIT_SECONDS", "1")
            .env("HANDOFF_LOG", "info")
            .env("HANDOFF_LOG_FORMAT", format)
            .output()
            .expect("run handoff");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let err = stderr(&output);
        let all = format!("{stdout}\n{err}");
        assert!(
            all.contains("connected to the replica set"),
            "{format}: {all}"
        );
        for line in lines(&all) {
            assert!(
                !(line.starts_with("::") && line.contains("\"forged\":true}}::")),
                "{format}: a line was forged: {line}"
            );
        }
        assert!(!all.contains('\u{202e}'), "{format}: {all}");
        assert_eq!(outputs(&output)["status"], "IDLE");
    }
}

/// A pipe whose reading end is already closed: a write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both descriptors were just opened by pipe(2) and are owned here alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

/// `/dev/full`: every write to it fails with ENOSPC.
fn full_device() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full"),
    )
}

/// Asserts how a command ended for its stdout, without a panic: a closed pipe is a reader that
/// has read what it wanted (the command ends as it would have, 0 here, with no error), a full
/// device is the command's failure (unavailable).
fn ended_for_stdout(output: &Output, what: &str) {
    let err = stderr(output);
    assert!(!err.contains("panicked"), "{what}: {err}");
    if what.contains("closed pipe") {
        assert_eq!(output.status.code(), Some(0), "{what}: {err}");
        assert!(!err.contains("error["), "{what}: {err}");
    } else {
        assert_eq!(output.status.code(), Some(10), "{what}: {err}");
        assert!(err.contains("error[unavailable]"), "{what}: {err}");
        assert!(err.contains("stdout cannot be written"), "{what}: {err}");
    }
}

#[test]
fn a_closed_or_full_stdout_ends_the_command_as_it_should_and_the_outputs_file_is_written() {
    for (kind, stdout) in [
        ("closed pipe", closed_pipe as fn() -> Stdio),
        ("full device", full_device),
    ] {
        let s = Scratch::new();
        let file = s.path("outputs.json");
        for format in ["text", "kestra"] {
            let output = handoff()
                .arg("replay")
                .arg(s.three_events())
                .arg("--state")
                .arg(s.state())
                .arg("--outputs-file")
                .arg(&file)
                .env("HANDOFF_LOG_FORMAT", format)
                .stdout(stdout())
                .output()
                .expect("run handoff");
            ended_for_stdout(&output, &format!("replay, {kind}, {format} logs"));
            let written: Value =
                serde_json::from_slice(&std::fs::read(&file).expect("the outputs file"))
                    .expect("JSON");
            assert_eq!(written["consumer_id"], "orders-to-outbox", "{written}");
            std::fs::remove_file(&file).expect("remove the outputs file");
        }
        // What the first run committed stands.
        let (_, outbox) = inspect(&s.state());
        assert_eq!(outbox.len(), 3);

        // A failed run keeps its own class and writes its outputs file.
        let bad = s.fixture("bad.jsonl", &[json!({"not": "an event"})]);
        let output = handoff()
            .arg("replay")
            .arg(&bad)
            .arg("--state")
            .arg(s.path("other.redb"))
            .arg("--outputs-file")
            .arg(&file)
            .stdout(stdout())
            .output()
            .expect("run handoff");
        let written: Value =
            serde_json::from_slice(&std::fs::read(&file).expect("the outputs file")).expect("JSON");
        assert_eq!(written["status"], "FAILED", "{written}");
        assert_eq!(
            output.status.code(),
            written["exit_code"].as_i64().map(|c| c as i32),
            "{}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("panicked"));

        // Commands that print a report or a listing.
        for args in [
            vec!["inspect", "--state", s.state().to_str().expect("a path")],
            vec!["policy", "export", "--list"],
            vec!["completions", "bash"],
            vec!["man"],
        ] {
            let output = handoff()
                .args(&args)
                .stdout(stdout())
                .output()
                .expect("run handoff");
            ended_for_stdout(&output, &format!("{args:?}, {kind}"));
        }
    }
}

#[test]
fn a_full_stdout_of_an_operator_command_is_its_failure_not_a_panic() {
    let live = Live::with_config(Config::default());
    live.start_consumer();
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["reconcile"],
        &["checkpoint", "reset", "--to", "now", "--dry-run"],
    ] {
        let output = handoff()
            .args(args)
            .env("MONGODB_URI", live.uri())
            .env("SOURCE_DATABASE", &live.db)
            .stdout(full_device())
            .output()
            .expect("run handoff");
        ended_for_stdout(&output, &format!("{args:?}"));
    }
}
