//! Bad input: every input outside the rules, checkpoints of shapes neither this tool nor the
//! baseline writes, broken recorded streams and URIs with credentials. Each is refused with a
//! clear error and its exit code, and nothing is written.

use crate::support;

use std::process::Output;

use bson::{Bson, Document, doc};
use support::live::*;
use support::*;

/// Names no database, collection or consumer may take (`[A-Za-z][A-Za-z0-9_-]{0,62}`).
fn bad_names() -> Vec<String> {
    [
        "", "1abc", "_abc", "-abc", "a.b", "a b", "a$b", "ä", "a/b", "a\nb", "a\\b", "a:b", "a*",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["a".repeat(64), format!("B{}", "9".repeat(63))])
    .collect()
}

/// Runs `handoff run` with the arguments and environment given, against the live server.
fn run_with(live: &Live, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = live.command();
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run handoff")
}

/// No database exists but those that did before (on a test server of its own, none but the
/// server's own): nothing was written anywhere.
fn assert_nothing_written(live: &Live, before: &[String]) {
    let user = live.user_databases();
    assert_eq!(user, before, "databases were created");
}

#[test]
fn every_input_outside_the_rules_is_refused_with_nothing_written() {
    let live = Live::start();
    let databases = live.user_databases();
    let mut tried = 0;
    let inputs = [
        ("--database", "SOURCE_DATABASE"),
        ("--collection", "SOURCE_COLLECTION"),
        ("--consumer-id", "CONSUMER_ID"),
        ("--checkpoint-collection", "CHECKPOINT_COLLECTION"),
        ("--outbox-collection", "OUTBOX_COLLECTION"),
    ];
    for (flag, key) in inputs {
        for bad in bad_names() {
            let needle = format!(
                "{key} must contain 1-63 letters, digits, underscores or hyphens and start with a letter"
            );
            fails(
                &run_with(&live, &[&format!("{flag}={bad}")], &[]),
                2,
                &needle,
            );
            if !bad.is_empty() {
                fails(&run_with(&live, &[], &[(key, &bad)]), 2, &needle);
            }
            tried += 2;
        }
    }
    for args in [
        ["--collection", "same", "--checkpoint-collection", "same"],
        ["--collection", "same", "--outbox-collection", "same"],
        [
            "--checkpoint-collection",
            "same",
            "--outbox-collection",
            "same",
        ],
    ] {
        fails(
            &run_with(&live, &args, &[]),
            2,
            "The source, checkpoint and outbox collection names must be distinct",
        );
        tried += 1;
    }
    let limits = "max_events must be 1-500 and max_wait_seconds must be 1-30";
    for bad in [
        "0",
        "501",
        "-1",
        "abc",
        "1.5",
        "",
        " ",
        "1e2",
        "0x10",
        "99999999999999999999",
    ] {
        fails(
            &run_with(&live, &[&format!("--max-events={bad}")], &[]),
            2,
            limits,
        );
        tried += 1;
        // An empty variable counts as unset (the default applies), as for the baseline's flow.
        if !bad.is_empty() {
            fails(&run_with(&live, &[], &[("MAX_EVENTS", bad)]), 2, limits);
            tried += 1;
        }
    }
    for bad in ["0", "31", "-5", "x", "", "2.0", "4294967297"] {
        fails(
            &run_with(&live, &[&format!("--max-wait-seconds={bad}")], &[]),
            2,
            limits,
        );
        tried += 1;
        if !bad.is_empty() {
            fails(
                &run_with(&live, &[], &[("MAX_WAIT_SECONDS", bad)]),
                2,
                limits,
            );
            tried += 1;
        }
    }
    for bad in [
        "http://127.0.0.1:27017",
        "postgres://127.0.0.1/db",
        "mongodb:/127.0.0.1",
        "MONGODB://127.0.0.1",
        "127.0.0.1:27017",
        " mongodb://127.0.0.1",
    ] {
        fails(
            &run_with(&live, &[], &[("MONGODB_URI", bad)]),
            2,
            "MONGODB_URI must be a MongoDB connection URI",
        );
        tried += 1;
    }
    for (args, needle) in [
        (vec!["--policy-param", "novalue"], "must be KEY=VALUE"),
        (vec!["--policy-param", "=value"], "must be KEY=VALUE"),
        (
            vec!["--policy", "/nonexistent/policy.wasm"],
            "cannot read the policy",
        ),
        (vec!["--policy-memory-mib", "0"], "--policy-memory-mib"),
        (vec!["--policy-slice-ms", "0"], "--policy-slice-ms"),
        (vec!["--run-timeout-seconds", "0"], "--run-timeout-seconds"),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ] {
        let output = run_with(&live, &args, &[]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(needle),
            "{args:?}: {}",
            stderr(&output)
        );
        let out = support::failure_outputs(&output, 2);
        assert_eq!(out["events_handed_off"], 0, "{args:?}");
        tried += 1;
    }
    // Without any URI at all.
    let mut command = handoff();
    command.arg("run").env_remove("MONGODB_URI");
    let output = command.output().unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    tried += 1;
    assert_nothing_written(&live, &databases);
    eprintln!("{tried} bad inputs refused");
}

#[test]
fn bad_inputs_to_a_replay_never_touch_its_state() {
    let s = Scratch::new();
    let fixture = s.fixture(
        "one.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert"), batch_end(1)],
    );
    for args in [
        vec!["--consumer-id", "1x"],
        vec!["--max-events", "0"],
        vec!["--max-wait-seconds", "31"],
        vec!["--outbox-collection", "kestra_change_checkpoints"],
        vec!["--collection", "other"],
    ] {
        let output = replay(&fixture, &s.state(), &args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!s.state().exists(), "{args:?} created the state store");
    }
    fails(
        &replay(&fixture, &s.state(), &["--collection", "other"]),
        2,
        "the fixture was recorded from change_demo.orders but the inputs watch change_demo.other",
    );
}

/// Fields to set (`Some`) or remove (`None`) in a checkpoint.
type Changes = Vec<(&'static str, Option<Bson>)>;

/// A checkpoint document as the baseline creates it, for the live deployment.
fn checkpoint_doc(live: &Live, consumer: &str) -> Document {
    handoff::domain::checkpoint::initial(
        consumer,
        &format!("{}.orders", live.db),
        &live.replica_set_id(),
    )
}

#[test]
fn malformed_or_foreign_checkpoints_are_refused_and_left_as_they_are() {
    let live = Live::start();
    let good_token = live.start_consumer();
    live.insert(0..3);
    let foreign_rs = "65f0000000000000000000ff";
    let cases: Vec<(&str, Changes, i32, &str)> = vec![
        (
            "token-string",
            vec![("token", Some(Bson::String("8200000001".into())))],
            5,
            "Checkpoint is malformed; restore a verified token before retrying",
        ),
        (
            "token-int",
            vec![("token", Some(Bson::Int32(7)))],
            5,
            "Checkpoint is malformed",
        ),
        (
            "token-array",
            vec![(
                "token",
                Some(Bson::Array(vec![Bson::Document(good_token.clone())])),
            )],
            5,
            "Checkpoint is malformed",
        ),
        (
            "mode-unknown",
            vec![
                ("token", Some(Bson::Document(good_token.clone()))),
                ("mode", Some(Bson::String("startAtOperationTime".into()))),
            ],
            5,
            "Checkpoint is malformed",
        ),
        (
            "mode-int",
            vec![("mode", Some(Bson::Int32(1)))],
            5,
            "Checkpoint is malformed",
        ),
        (
            "source-missing",
            vec![("source", None)],
            4,
            "Consumer checkpoint belongs to another source; use the original source or a new consumer_id",
        ),
        (
            "source-other",
            vec![(
                "source",
                Some(Bson::String(format!("{}.invoices", live.db))),
            )],
            4,
            "belongs to another source",
        ),
        (
            "replica-set-other",
            vec![
                ("token", Some(Bson::Document(good_token.clone()))),
                ("replicaSetId", Some(Bson::String(foreign_rs.into()))),
            ],
            4,
            "Consumer checkpoint belongs to another replica set; reconcile from a verified snapshot before reset",
        ),
        (
            "replica-set-missing",
            vec![("replicaSetId", None)],
            4,
            "belongs to another replica set",
        ),
    ];
    let mut tried = 0;
    for (consumer, changes, code, needle) in cases {
        let mut stored = checkpoint_doc(&live, consumer);
        for (key, value) in changes {
            match value {
                Some(value) => stored.insert(key, value),
                None => stored.remove(key),
            };
        }
        live.wait(live.coll(CHECKPOINTS).insert_one(stored.clone()))
            .unwrap();
        let output = live.run(&["--consumer-id", consumer]);
        fails(&output, code, needle);
        let after = live
            .wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer}))
            .unwrap();
        assert_eq!(
            after.as_ref(),
            Some(&stored),
            "{consumer}: checkpoint changed"
        );
        tried += 1;
    }
    assert_eq!(live.outbox_len(), 0, "an outbox record was written");
    eprintln!("{tried} malformed or foreign checkpoints refused");
}

#[test]
fn a_checkpoint_token_of_another_shape_is_malformed_and_left_as_it_is() {
    let live = Live::start();
    live.start_consumer();
    live.insert(0..3);
    let mut tried = 0;
    for (consumer, token) in [
        ("token-garbage", doc! {"_data": "zz"}),
        ("token-data-int", doc! {"_data": 5}),
        ("token-other-key", doc! {"x": 1}),
        ("token-empty", doc! {}),
        ("token-data-empty", doc! {"_data": ""}),
        ("token-extra-key", doc! {"_data": "826AE7", "x": 1}),
    ] {
        let mut stored = checkpoint_doc(&live, consumer);
        stored.insert("token", token);
        live.wait(live.coll(CHECKPOINTS).insert_one(stored.clone()))
            .unwrap();
        // Refused on load, before the server is asked to resume from it.
        let output = live.run(&["--consumer-id", consumer]);
        fails(&output, 5, "error[malformed_checkpoint]");
        assert!(
            stderr(&output).contains("restore a verified token before retrying"),
            "{consumer}: {}",
            stderr(&output)
        );
        let after = live
            .wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer}))
            .unwrap();
        assert_eq!(
            after.as_ref(),
            Some(&stored),
            "{consumer}: checkpoint changed"
        );
        tried += 1;
    }
    // A well-formed token past the end of the history resumes nowhere yet: the run idles and
    // never moves the checkpoint back to the present.
    let consumer = "token-future";
    let mut stored = checkpoint_doc(&live, consumer);
    stored.insert(
        "token",
        doc! {"_data": format!("82{}01{}00", "FFFFFFF000000001", "00000000")},
    );
    live.wait(live.coll(CHECKPOINTS).insert_one(stored.clone()))
        .unwrap();
    let out = ok(&live.run(&["--consumer-id", consumer]));
    assert_eq!(out["events_handed_off"], 0);
    let after = live
        .wait(live.coll(CHECKPOINTS).find_one(doc! {"_id": consumer}))
        .unwrap()
        .unwrap();
    // The run took and gave back its lease, and recorded its configuration: its position
    // is the one it found.
    for key in ["token", "mode", "source", "replicaSetId"] {
        assert_eq!(
            after.get(key),
            stored.get(key),
            "the checkpoint's {key} moved"
        );
    }
    tried += 1;
    assert_eq!(live.outbox_len(), 0);
    eprintln!("{tried} unusable tokens tried");
}

#[test]
fn broken_fixture_lines_are_refused_with_their_line_number_and_nothing_written() {
    let s = Scratch::new();
    let good = [
        deployment(REPLICA_SET_ID).to_string(),
        event(1, "insert").to_string(),
    ];
    let cases: Vec<(&str, &str)> = vec![
        ("{oops", "not JSON"),
        ("[1, 2]", "each line must be a JSON object"),
        ("\"text\"", "each line must be a JSON object"),
        (
            "{\"operationType\": \"insert\"}",
            "an event needs a resume token document in `_id`",
        ),
        (
            "{\"_id\": \"x\", \"operationType\": \"insert\"}",
            "an event needs a resume token document in `_id`",
        ),
        (
            "{\"_id\": [1], \"operationType\": \"insert\"}",
            "an event needs a resume token document in `_id`",
        ),
        (
            "{\"_id\": {\"_data\": \"82\"}}",
            "an event needs a string `operationType`",
        ),
        (
            "{\"_id\": {\"_data\": \"82\"}, \"operationType\": 5}",
            "an event needs a string `operationType`",
        ),
        (
            "{\"_id\": {\"$oid\": \"zz\"}, \"operationType\": \"insert\"}",
            "event is not Extended JSON",
        ),
        (
            "{\"_id\": {\"_data\": \"82\"}, \"operationType\": \"insert\", \"n\": {\"$numberLong\": \"x\"}}",
            "event is not Extended JSON",
        ),
        (
            "{\"$postBatchResumeToken\": 5}",
            "`$postBatchResumeToken` must be a document",
        ),
        (
            "{\"$postBatchResumeToken\": {\"_data\": \"82\"}, \"x\": 1}",
            "`$postBatchResumeToken` must be the only key",
        ),
        (
            "{\"$error\": {\"codeName\": \"x\"}}",
            "`$error` needs an integer `code`",
        ),
        (
            "{\"$error\": {\"code\": \"286\"}}",
            "`$error` needs an integer `code`",
        ),
        (
            "{\"$error\": {\"code\": 99999999999}}",
            "`$error` needs an integer `code`",
        ),
        ("{\"$error\": 286}", "`$error` must be a document"),
        (
            "{\"$deployment\": {\"setName\": \"rs0\"}}",
            "`$deployment` must be the only key of the first line",
        ),
        ("{\"$bogus\": 1}", "unknown control line `$bogus`"),
    ];
    let mut tried = 0;
    for (line, needle) in &cases {
        // The broken line comes third, after two good ones.
        let text = format!("{}\n{}\n{line}\n", good[0], good[1]);
        let fixture = s.path("broken.jsonl");
        std::fs::write(&fixture, text).unwrap();
        let output = replay(&fixture, &s.state(), &[]);
        fails(&output, 2, &format!("fixture line 3: {needle}"));
        assert!(!s.state().exists(), "{line}: the state store was created");
        tried += 1;
    }
    for (text, needle) in [
        // `$deployment` with a missing field, on the first line.
        (
            "{\"$deployment\": {\"setName\": \"rs0\", \"source\": \"change_demo.orders\"}}\n",
            "fixture line 1: `$deployment` needs a string `replicaSetId`",
        ),
        (
            "{\"$deployment\": [1]}\n",
            "fixture line 1: `$deployment` must be a document",
        ),
        (
            "{\"$deployment\": {\"setName\": \"rs0\", \"replicaSetId\": \"x\", \"source\": \"change_demo.orders\"}, \"y\": 1}\n",
            "fixture line 1: `$deployment` must be the only key",
        ),
    ] {
        let fixture = s.path("broken.jsonl");
        std::fs::write(&fixture, text).unwrap();
        fails(&replay(&fixture, &s.state(), &[]), 2, needle);
        assert!(!s.state().exists());
        tried += 1;
    }
    // Not UTF-8, and no file at all.
    let fixture = s.path("binary.jsonl");
    std::fs::write(&fixture, b"\xff\xfe{}\n").unwrap();
    fails(&replay(&fixture, &s.state(), &[]), 2, "cannot read fixture");
    fails(
        &replay(&s.path("missing.jsonl"), &s.state(), &[]),
        2,
        "cannot read fixture",
    );
    tried += 2;
    assert!(!s.state().exists());

    // A broken recording never disturbs a state that already holds work.
    let fixture = s.fixture(
        "good.jsonl",
        &[deployment(REPLICA_SET_ID), event(1, "insert"), batch_end(1)],
    );
    ok(&replay(&fixture, &s.state(), &[]));
    let before = inspect(&s.state());
    let broken = s.path("broken.jsonl");
    std::fs::write(
        &broken,
        format!("{}\n{}\n{}\n{{oops\n", good[0], good[1], event(2, "insert")),
    )
    .unwrap();
    fails(
        &replay(&broken, &s.state(), &[]),
        2,
        "fixture line 4: not JSON",
    );
    assert_eq!(inspect(&s.state()), before);
    tried += 1;

    // An event that repeats an earlier event's token: refused, and neither a new state nor one
    // that already holds work is touched.
    let repeated = s.path("repeated.jsonl");
    std::fs::write(
        &repeated,
        format!(
            "{}\n{}\n{}\n{}\n",
            good[0],
            event(7, "insert"),
            event(8, "insert"),
            event(7, "update")
        ),
    )
    .unwrap();
    let fresh = s.path("fresh.redb");
    fails(
        &replay(&repeated, &fresh, &[]),
        2,
        "fixture line 4: the event repeats the resume token of line 2",
    );
    assert!(!fresh.exists(), "the state store was created");
    fails(
        &replay(&repeated, &s.state(), &[]),
        2,
        "fixture line 4: the event repeats the resume token of line 2",
    );
    assert_eq!(inspect(&s.state()), before);
    tried += 2;
    eprintln!("{tried} broken recordings refused");
}

#[test]
fn a_uri_with_credentials_never_shows_the_password() {
    // Its own test server, whatever MONGODB_URI says: one that refuses every credential offered
    // on a plain connection.
    let live = Live::with_config(mongo_sim::Config::default());
    let databases = live.user_databases();
    let port = live.server().port();
    let password = "Sup3rS3cretPw";
    let cases = [
        // The test server has no users: the credentials are refused.
        (
            format!("mongodb://alice:{password}@127.0.0.1:{port}/?replicaSet=rs0"),
            11,
        ),
        (
            format!("mongodb://{password}@127.0.0.1:{port}/?replicaSet=rs0"),
            11,
        ),
        // Nothing listens on port 1.
        (
            format!("mongodb://alice:{password}@127.0.0.1:1/?connectTimeoutMS=200"),
            10,
        ),
        // Broken connection strings.
        (
            format!("mongodb://alice:{password}@127.0.0.1:{port}/?bogusOption=1"),
            2,
        ),
        (
            format!("mongodb://alice:{password}@127.0.0.1:{port}/?authMechanism=BOGUS"),
            2,
        ),
        (format!("mongodb://alice:{password}@/db"), 2),
        (format!("mongodb://alice:p@{password}@127.0.0.1:{port}/"), 2),
        (format!("mongodb://alice:{password}%@127.0.0.1:{port}/"), 2),
        (
            format!("mongodb://alice:{password}@127.0.0.1:{port}/?authMechanism=MONGODB-X509"),
            2,
        ),
        (
            format!(
                "mongodb://alice:{password}@127.0.0.1:{port}/?tls=true&tlsCAFile=/nonexistent/{password}"
            ),
            2,
        ),
        (format!("http://alice:{password}@127.0.0.1:{port}/"), 2),
        (
            format!("mongodb+srv://alice:{password}@nonexistent.invalid/"),
            2,
        ),
        // A password holding `?`, `@`, `/` and `:`, percent-encoded: refused by the server.
        (
            format!("mongodb://alice:{password}%3F%40%2F%3A@127.0.0.1:{port}/?replicaSet=rs0"),
            11,
        ),
        (
            format!("mongodb://alice:%3F{password}%40@127.0.0.1:{port}/?replicaSet=rs0"),
            11,
        ),
        // The same characters left raw break the URI.
        (
            format!("mongodb://alice:pa?ss{password}@127.0.0.1:{port}/"),
            2,
        ),
        (
            format!("mongodb://alice:pa/ss{password}@127.0.0.1:{port}/"),
            2,
        ),
        // Secrets in the query string.
        (
            format!(
                "mongodb://AKIAEXAMPLE:x@127.0.0.1:{port}/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:{password}"
            ),
            2,
        ),
        (
            format!(
                "mongodb://127.0.0.1:{port}/?authMechanismProperties=AWS_SESSION_TOKEN={password}"
            ),
            2,
        ),
        (
            format!(
                "mongodb://127.0.0.1:{port}/?tls=true&tlsCertificateKeyFile=/nonexistent.pem&tlsCertificateKeyFilePassword={password}"
            ),
            2,
        ),
        (
            format!("mongodb://127.0.0.1:{port}/?readPreference={password}"),
            2,
        ),
        (format!("mongodb://127.0.0.1:{port}/?{password}=1"), 2),
    ];
    let mut tried = 0;
    for (uri, code) in &cases {
        for (as_flag, format) in [(false, "text"), (true, "json")] {
            let mut command = handoff();
            command
                .args(["--log-format", format, "run"])
                .env("HANDOFF_LOG", "trace")
                .env("MAX_WAIT_SECONDS", "1");
            if as_flag {
                command.args(["--uri", uri]);
            } else {
                command.env("MONGODB_URI", uri);
            }
            let output = command.output().unwrap();
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert_eq!(output.status.code(), Some(*code), "{uri}: {all}");
            assert!(all.contains("error["), "{uri}: no clear error: {all}");
            assert!(!all.contains(password), "{uri}: the password leaked: {all}");
            tried += 1;
        }
    }
    // Neither help nor an argument error prints the URI taken from the environment.
    for args in [&["run", "--help"][..], &["run", "--max-events"][..]] {
        let output = handoff()
            .args(args)
            .env(
                "MONGODB_URI",
                format!("mongodb://alice:{password}@127.0.0.1:1/"),
            )
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!all.contains(password), "{args:?}: {all}");
        tried += 1;
    }
    assert_nothing_written(&live, &databases);
    eprintln!("{tried} runs with credentials, none showed the password");
}

#[test]
fn a_uri_the_driver_cannot_parse_gets_a_fixed_message_that_echoes_nothing_of_it() {
    let live = Live::start();
    let databases = live.user_databases();
    let host = live.address();
    let secret = "Zq7SecretPart";
    for uri in [
        format!("mongodb://alice:{secret}@/db"),
        format!("mongodb://alice:pa?ss{secret}@{host}/"),
        format!("mongodb://alice:{secret}%@{host}/"),
        format!("mongodb://{host}/?authMechanismProperties=AWS_SESSION_TOKEN={secret}"),
        format!("mongodb://{host}/?readPreference={secret}"),
        format!("mongodb://{host}/?{secret}=1"),
        format!(
            "mongodb://{host}/?tls=true&tlsCertificateKeyFile=/k.pem&tlsCertificateKeyFilePassword={secret}"
        ),
    ] {
        let output = run_with(
            &live,
            &[],
            &[("MONGODB_URI", &uri), ("HANDOFF_LOG", "debug")],
        );
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.status.code(), Some(2), "{uri}: {all}");
        assert!(
            all.contains("error[bad_input]: MONGODB_URI is not a valid MongoDB connection string"),
            "{uri}: {all}"
        );
        for fragment in [secret, "alice", "AWS_SESSION_TOKEN"] {
            assert!(!all.contains(fragment), "{uri}: {fragment} echoed: {all}");
        }
        // A known option the driver refuses is named (its value never is).
        for option in [
            "authMechanismProperties",
            "readPreference",
            "tlsCertificateKeyFilePassword",
        ] {
            if uri.contains(&format!("{option}=")) {
                assert!(
                    all.contains(&format!("its option {option} is refused")),
                    "{all}"
                );
            }
        }
    }
    assert_nothing_written(&live, &databases);
}

/// A URI the Python task takes runs here: the options PyMongo reads that change nothing here are
/// set aside with one warning naming them.
#[test]
fn a_uri_with_options_only_pymongo_reads_runs_with_one_warning_naming_them() {
    let live = Live::start();
    let uri = format!(
        "{}&uuidRepresentation=standard&connect=false&tz_aware=true&socketTimeoutMS=20000",
        live.uri()
    );
    let output = run_with(&live, &[], &[("MONGODB_URI", &uri)]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let warnings: Vec<String> = stderr(&output)
        .lines()
        .filter(|l| l.contains("set aside"))
        .map(str::to_string)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for name in [
        "uuidRepresentation",
        "connect",
        "tz_aware",
        "socketTimeoutMS",
    ] {
        assert!(warnings[0].contains(name), "{warnings:?}");
    }
}
