//! The checkpoint's revision and lease: every write counts, a run takes the lease at its start
//! and gives it back at its end, a second run stops at its start while the lease holds, an
//! expired lease is taken over, and a run that lost its lease cannot commit.

use crate::support;

use std::time::Duration;

use bson::{DateTime, Document, doc};
use handoff::backend::mongo::{Connection, MongoStore};
use handoff::domain::{CheckpointStore, Collections, Commit, CommitError, Consumer, Lease, Mode};
use support::live::*;

fn set_checkpoint(live: &Live, fields: Document) {
    live.wait(
        live.coll(CHECKPOINTS)
            .update_one(doc! {"_id": CONSUMER}, doc! {"$set": fields}),
    )
    .expect("update checkpoint");
}

/// Another run's name.
const ELSEWHERE: &str = "handoff@elsewhere:7:1";

/// Plants a live lease of another run on the consumer.
fn held_elsewhere(live: &Live) {
    set_checkpoint(live, doc! {"owner": ELSEWHERE, "leaseUntil": in_ms(60_000)});
}

fn in_ms(ms: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + ms)
}

#[test]
fn a_run_counts_its_writes_and_gives_its_lease_back() {
    let live = Live::start();
    live.start_consumer();
    let first = live.checkpoint().unwrap();
    // Created at 0; the claim, the saved starting position, the idle watermark when the
    // server's moved meanwhile, and the release.
    let revision = first.get_i64("revision").unwrap();
    assert!((3..=4).contains(&revision), "{first}");
    let owner = first.get_str("owner").unwrap().to_string();
    assert!(owner.starts_with("handoff@"), "{owner}");
    // Given back: the epoch, whatever the next run's clock says.
    let until = *first.get_datetime("leaseUntil").unwrap();
    assert_eq!(until, DateTime::from_millis(0), "released");
    assert_eq!(
        first.get_str("configDigest").unwrap(),
        handoff::domain::StreamConfig::default().digest()
    );

    live.insert(0..3);
    let out = support::ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 3);
    let second = live.checkpoint().unwrap();
    // The claim, three commits, perhaps the idle watermark, the release.
    let moved = second.get_i64("revision").unwrap() - revision;
    assert!((5..=6).contains(&moved), "{second}");
    assert_ne!(
        second.get_str("owner").unwrap(),
        owner,
        "each run has its own name"
    );
}

#[test]
fn a_second_run_stops_at_its_start_while_the_lease_holds_and_takes_it_over_once_expired() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..3);
    held_elsewhere(&live);
    let before = live.checkpoint().unwrap();
    let held = live.run(&[]);
    let out = support::fails(
        &held,
        3,
        "Another run (handoff@elsewhere:7:1) holds this consumer",
    );
    assert_eq!(out["events_handed_off"], 0);
    assert_eq!(live.checkpoint().unwrap(), before, "nothing was written");
    assert_eq!(live.outbox_len(), 0);

    set_checkpoint(&live, doc! {"leaseUntil": in_ms(-1)});
    let out = support::ok(&live.run(&[]));
    assert_eq!(out["events_handed_off"], 3);
    let after = live.checkpoint().unwrap();
    assert_ne!(after.get_str("owner").unwrap(), ELSEWHERE);
    assert_eq!(
        outbox_event_ids(&live.outbox()),
        live.events_after(&start)
            .iter()
            .map(event_id)
            .collect::<Vec<_>>()
    );
}

#[test]
fn two_runs_racing_for_the_lease_one_stops_at_its_start() {
    let live = Live::start();
    let start = live.start_consumer();
    live.insert(0..20);
    // The first run idles three seconds after the events, holding its lease; the second
    // starts meanwhile.
    let first = live.spawn(&["--max-wait-seconds", "3"]);
    std::thread::sleep(Duration::from_millis(700));
    let second = live.spawn(&[]).wait_with_output().unwrap();
    let first = first.wait_with_output().unwrap();
    let out = support::ok(&first);
    assert_eq!(out["events_handed_off"], 20);
    let lost = support::fails(&second, 3, "holds this consumer");
    assert_eq!(lost["events_handed_off"], 0);
    assert_eq!(
        outbox_event_ids(&live.outbox()),
        live.events_after(&start)
            .iter()
            .map(event_id)
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_run_whose_lease_was_taken_over_cannot_commit() {
    let live = Live::start();
    let start = live.start_consumer();
    let connection = Connection::connect(&live.uri()).expect("connect");
    let collections = Collections {
        checkpoints: CHECKPOINTS.into(),
        outbox: OUTBOX.into(),
        quarantine: "kestra_change_quarantine".into(),
    };
    let store = MongoStore::new(connection.clone(), &live.db, &collections);
    let consumer = Consumer {
        consumer: CONSUMER.into(),
        source: format!("{}.orders", live.db),
    };
    let mine = Lease::new(Duration::from_secs(60));
    held_elsewhere(&live);
    let next = doc! {"_data": "82FFFFFFFF000000012B0429296E1404"};
    let record = bson::rawdoc! {"_id": format!("{CONSUMER}/x"), "consumer": CONSUMER, "source": consumer.source.as_str(), "event": {"_id": {"_data": "82FFFFFFFF000000012B0429296E1404"}}};
    let commit = Commit {
        consumer: &consumer,
        expected: Some(&start),
        next: &next,
        mode: Mode::ResumeAfter,
        outbox: vec![record],
        quarantine: vec![],
        lease: Some(&mine),
        policy: None,
    };
    assert!(matches!(store.commit(&commit), Err(CommitError::Conflict)));
    assert_eq!(live.checkpoint_token(), start);
    assert_eq!(
        live.outbox_len(),
        0,
        "the record went with the missed compare-and-set"
    );
    // Held by its own name, the same commit goes through and renews the lease.
    set_checkpoint(&live, doc! {"owner": &mine.owner});
    store.commit(&commit).expect("commit");
    let after = live.checkpoint().unwrap();
    assert_eq!(after.get_document("token").unwrap(), &next);
    assert!(*after.get_datetime("leaseUntil").unwrap() > in_ms(50_000));
    // A release by another name changes nothing; by the owner, it ends the lease now.
    store.release(CONSUMER, ELSEWHERE, DateTime::now()).unwrap();
    assert_eq!(live.checkpoint().unwrap(), after);
    store
        .release(CONSUMER, &mine.owner, DateTime::from_millis(0))
        .unwrap();
    assert_eq!(
        *live
            .checkpoint()
            .unwrap()
            .get_datetime("leaseUntil")
            .unwrap(),
        DateTime::from_millis(0)
    );
    drop(store);
    connection.close();
}

#[test]
fn a_run_reading_without_committing_keeps_its_lease() {
    let live = Live::start();
    live.start_consumer();
    // A six-second lease and a ten-second idle wait: the idle run must renew it to keep it.
    let first = live.spawn(&["--lease-seconds", "6", "--max-wait-seconds", "10"]);
    std::thread::sleep(Duration::from_secs(8));
    let second = live.run(&[]);
    support::fails(&second, 3, "holds this consumer");
    let first = first.wait_with_output().unwrap();
    assert_eq!(support::ok(&first)["status"], "IDLE");
    // Given back at its end: the next run goes at once.
    support::ok(&live.run(&[]));
}

#[test]
fn a_lease_duration_out_of_bounds_is_bad_input() {
    let live = Live::start();
    for bad in ["0", "4", "86401", "x"] {
        let out = live.run(&["--lease-seconds", bad]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bad}: {}",
            support::stderr(&out)
        );
    }
    assert!(live.checkpoint().is_none(), "nothing was written");
}

/// Statements that keep asking to start again (they never learn what they wait for) end the
/// transaction after a bounded number of tries, with nothing written, instead of looping.
#[test]
fn statements_that_always_start_again_end_in_a_failure_not_a_loop() {
    use handoff::backend::mongo::transaction::{self, Decision, Failure, MAX_AGAIN};
    let live = Live::start();
    let connection = Connection::connect(&live.uri()).expect("connect");
    let outbox = connection
        .database(&live.db)
        .collection::<bson::Document>(OUTBOX);
    let retries = std::sync::atomic::AtomicU32::new(0);
    let mut calls = 0u32;
    let outcome = connection.block_on(transaction::run(
        &connection,
        &outbox,
        &retries,
        async |session| {
            calls += 1;
            outbox
                .insert_one(doc! { "_id": format!("again-{calls}") })
                .session(&mut *session)
                .await?;
            Ok(Decision::<(), ()>::Again)
        },
    ));
    assert!(matches!(outcome, Err(Failure::Failed(_))), "{outcome:?}");
    assert_eq!(calls, MAX_AGAIN + 1);
    assert!(
        live.outbox().is_empty(),
        "nothing an abandoned attempt wrote stays"
    );
    connection.close();
}

/// A run that died holding its lease: `status` names the holder, a reset is refused (its dry run
/// says so), `lease release` gives the lease back with an audit record (only from the holder it
/// names), and the next run and the reset go ahead at once.
#[test]
fn a_dead_runs_lease_is_released_by_an_audited_command() {
    const AUDIT: &str = "kestra_change_audit";
    let live = Live::start();
    live.start_consumer();
    live.insert(0..2);
    held_elsewhere(&live);
    let status = support::json_stdout(&live.operator(&["status", "--json"]));
    assert_eq!(
        status["checkpoint"]["lease"]["owner"], ELSEWHERE,
        "{status}"
    );

    let reset = ["checkpoint", "reset", "--to", "now"];
    let dry = live.operator(&[&reset[..], &["--dry-run", "--json"]].concat());
    let dry = support::json_stdout(&dry);
    let refused = dry["refused"]
        .as_str()
        .expect("the dry run says the reset is refused");
    assert!(
        refused.contains(ELSEWHERE) && refused.contains("lease release"),
        "{dry}"
    );
    let human = live.operator(&[&reset[..], &["--dry-run"]].concat());
    assert!(String::from_utf8_lossy(&human.stdout).contains("would be refused"));
    support::refused(
        &live.operator(&[&reset[..], &["--reason", "x"]].concat()),
        3,
        "lease release",
    );

    // Only the lease of the owner named is released; a reason is required.
    let before = live.checkpoint().unwrap();
    support::refused(
        &live.operator(&[
            "lease",
            "release",
            "--owner",
            "handoff@other:1:1",
            "--reason",
            "r",
        ]),
        3,
        "is held by handoff@elsewhere",
    );
    assert_eq!(live.operator(&["lease", "release"]).status.code(), Some(2));
    support::refused(
        &live.operator(&[
            "lease",
            "release",
            "--consumer-id",
            "orders-to-outbx",
            "--reason",
            "r",
        ]),
        2,
        "did you mean orders-to-outbox?",
    );
    assert_eq!(live.checkpoint().unwrap(), before);
    assert!(live.records(AUDIT).is_empty());

    let released = live.operator(&[
        "lease",
        "release",
        "--owner",
        ELSEWHERE,
        "--reason",
        "its pod was lost",
        "--json",
    ]);
    let released = support::json_stdout(&released);
    assert_eq!(released["released"]["owner"], ELSEWHERE, "{released}");
    let after = live.checkpoint().unwrap();
    assert!(
        after.get("owner").is_none() && after.get("leaseUntil").is_none(),
        "{after}"
    );
    assert_eq!(
        after.get_i64("revision").unwrap(),
        before.get_i64("revision").unwrap() + 1
    );
    assert_eq!(
        after.get("token"),
        before.get("token"),
        "the position is untouched"
    );
    let audit = live.records(AUDIT);
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].get_str("reason").unwrap(), "its pod was lost");
    assert!(
        audit[0]
            .get_str("command")
            .unwrap()
            .starts_with("lease release")
    );

    // Nothing holds the consumer now: a second release writes nothing, the next run goes ahead.
    let again =
        support::json_stdout(&live.operator(&["lease", "release", "--reason", "r", "--json"]));
    assert!(again["released"].is_null(), "{again}");
    assert_eq!(live.records(AUDIT).len(), 1);
    assert_eq!(support::ok(&live.run(&[]))["events_handed_off"], 2);
}
