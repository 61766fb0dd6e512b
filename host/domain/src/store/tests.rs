use super::records::same_event_token;
use super::*;
use bson::doc;

/// A token of the test server's shape: `82`, a cluster time, the version, the operation's
/// index and the kind; a fragment's appends its 0-based number.
fn event_token(op: u32, fragment: Option<u32>) -> String {
    let whole = format!("82634F1A2B0000000101{op:08X}00");
    match fragment {
        Some(n) => format!("{whole}{n:08X}"),
        None => whole,
    }
}

/// The record of a whole event handed off under `c/<id>`.
fn whole(id: &str, op: u32) -> Document {
    doc! {
        "_id": format!("c/{id}"), "consumer": "c", "source": "db.coll",
        "event": { "_id": { "_data": event_token(op, None) }, "operationType": "update" },
    }
}

/// The records of event `op` split in `n` fragments, handed off under `c/<id>`.
fn split(id: &str, op: u32, n: u32) -> Vec<Document> {
    (1..=n)
        .map(|k| {
            doc! {
                "_id": format!("c/{id}.{k}of{n}"), "consumer": "c", "source": "db.coll",
                "event": {
                    "_id": { "_data": event_token(op, Some(k - 1)) },
                    "splitEvent": { "fragment": k as i32, "of": n as i32 },
                },
            }
        })
        .collect()
}

fn raw(records: &[Document]) -> Vec<RawDocumentBuf> {
    records
        .iter()
        .map(|r| RawDocumentBuf::try_from(r).unwrap())
        .collect()
}

/// What a store holding `stored` does with `new`: the records it inserts, and the events it
/// counts as duplicates.
fn admitted(
    new: &[Document],
    stored: &[Document],
) -> Result<(Vec<bool>, Vec<String>), CommitError> {
    let mut duplicates = Vec::new();
    let insert = admit_events(&raw(new), stored, &mut duplicates)?;
    Ok((insert, duplicates))
}

#[test]
fn a_record_is_the_same_hand_off_only_with_the_same_token() {
    let raw = |data: &str| {
        doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "event": { "_id": { "_data": data } } }
    };
    let shaped = |data: &str| {
        doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "token": { "_data": data }, "payload": {} }
    };
    let same = |stored: Document, new: Document| match admitted(&[new], &[stored]) {
        Ok((insert, duplicates)) => {
            assert_eq!(insert, [false]);
            assert_eq!(duplicates, ["c/1"]);
            true
        }
        Err(CommitError::Duplicate(id)) => {
            assert_eq!(id, "c/1");
            false
        }
        Err(other) => panic!("{other}"),
    };
    assert!(same(raw("82a"), raw("82a")));
    assert!(same(raw("82a"), shaped("82a")));
    assert!(!same(raw("82a"), raw("82b")));
    assert!(!same(shaped("82a"), shaped("82b")));
    // A record planted with the right token for another consumer or source is not the same.
    let mut planted = raw("82a");
    planted.insert("consumer", "other");
    assert!(!same(planted, raw("82a")));
    let mut planted = shaped("82a");
    planted.remove("source");
    assert!(!same(planted, shaped("82a")));
    // A record without a token (written by something else) is never taken as the same.
    assert!(!same(
        doc! { "_id": "c/1", "consumer": "c", "source": "db.coll" },
        raw("82a")
    ));
    assert!(!same(
        raw("82a"),
        doc! { "_id": "c/1", "consumer": "c", "source": "db.coll", "event": "x" }
    ));
    // Nothing held: every record is inserted.
    assert_eq!(
        admitted(&split("X", 1, 3), &[]).unwrap(),
        (vec![true; 3], vec![])
    );
}

#[test]
fn an_event_held_whole_or_split_otherwise_is_one_duplicate() {
    let one = |n: usize| (vec![false; n], vec!["c/X".to_string()]);
    // Split in 2, again in 3 (other options make it larger): fragment k's token is the same
    // in both splits.
    assert_eq!(
        admitted(&split("X", 1, 3), &split("X", 1, 2)).unwrap(),
        one(3)
    );
    assert_eq!(
        admitted(&split("X", 1, 2), &split("X", 1, 3)).unwrap(),
        one(2)
    );
    // Split, then whole (smaller now), and the converse.
    assert_eq!(
        admitted(&[whole("X", 1)], &split("X", 1, 2)).unwrap(),
        one(1)
    );
    assert_eq!(
        admitted(&split("X", 1, 2), &[whole("X", 1)]).unwrap(),
        one(2)
    );
    // The same split again.
    assert_eq!(
        admitted(&split("X", 1, 2), &split("X", 1, 2)).unwrap(),
        one(2)
    );
    // Held in several splits (written before splits were one event's): still one event.
    let mut held = split("X", 1, 2);
    held.extend(split("X", 1, 3));
    held.push(whole("X", 1));
    assert_eq!(admitted(&split("X", 1, 4), &held).unwrap(), one(4));
    // A policy-shaped record of a split event carries its first fragment's token.
    let mut shaped = whole("X", 1);
    shaped.remove("event");
    shaped.insert("token", doc! { "_data": event_token(1, Some(0)) });
    assert_eq!(
        admitted(&[whole("X", 1)], &[shaped.clone()]).unwrap(),
        one(1)
    );
    assert_eq!(
        admitted(&split("X", 1, 3), &[shaped.clone()]).unwrap(),
        one(3)
    );
    assert_eq!(admitted(&[shaped], &split("X", 1, 2)).unwrap(), one(1));
    // Events beside it are inserted, each counted on its own.
    let mut new = vec![whole("A", 7)];
    new.extend(split("X", 1, 2));
    new.push(whole("B", 8));
    let (insert, duplicates) = admitted(&new, &split("X", 1, 3)).unwrap();
    assert_eq!(insert, [true, false, false, true]);
    assert_eq!(duplicates, ["c/X"]);
}

#[test]
fn another_event_held_under_an_events_id_in_any_split_refuses_the_commit() {
    let refused = |new: &[Document], held: &[Document]| match admitted(new, held) {
        Err(CommitError::Duplicate(id)) => id,
        other => panic!("{other:?}"),
    };
    // Event 2 under the ID event 1 was handed off with, split or whole.
    assert_eq!(refused(&[whole("X", 2)], &split("X", 1, 2)), "c/X.1of2");
    assert_eq!(refused(&split("X", 2, 3), &split("X", 1, 2)), "c/X.1of2");
    assert_eq!(refused(&split("X", 2, 2), &[whole("X", 1)]), "c/X");
    // One split of the same event and one of another: the other refuses it.
    let mut held = split("X", 1, 2);
    held.extend(split("X", 2, 3));
    assert_eq!(refused(&[whole("X", 1)], &held), "c/X.1of3");
    // Fragments planted for another consumer.
    let mut planted = split("X", 1, 2);
    planted[1].insert("consumer", "other");
    assert_eq!(refused(&[whole("X", 1)], &planted), "c/X.1of2");
    // A whole event whose ID reads like a fragment's is its own ID's: beside `c/X` it is
    // another event, and under a fragment's `_id` it refuses the split event.
    let mut lookalike = whole("X.1of2", 5);
    assert_eq!(
        admitted(&[whole("X", 1)], &[lookalike.clone()]).unwrap(),
        (vec![true], vec![])
    );
    assert_eq!(refused(&split("X", 1, 2), &[lookalike.clone()]), "c/X.1of2");
    lookalike.insert("_id", "c/X.01of2");
    assert_eq!(
        admitted(&split("X", 1, 2), &[lookalike]).unwrap(),
        (vec![true; 2], vec![])
    );
}

#[test]
fn the_tokens_of_an_event_and_of_its_fragments_name_the_same_event() {
    let token = |data: String| doc! { "_data": data };
    let whole = token(event_token(1, None));
    let first = token(event_token(1, Some(0)));
    let second = token(event_token(1, Some(1)));
    assert!(same_event_token(&whole, &first));
    assert!(same_event_token(&second, &whole));
    assert!(same_event_token(&first, &first));
    // Two fragments are told apart; so are other events, whole or in fragments.
    assert!(!same_event_token(&first, &second));
    assert!(!same_event_token(&whole, &token(event_token(2, None))));
    assert!(!same_event_token(&whole, &token(event_token(2, Some(0)))));
    // MongoDB's layout: the fragment's number goes before the KeyString's closing `04`.
    let mongo = "82635019A0000000012B042C0100296E5A1004AB1154ACACD849A48C61756D70D3B21F4604";
    assert!(same_event_token(
        &token(format!("{mongo}04")),
        &token(format!("{mongo}2A04"))
    ));
    let other = mongo.replace("D3B21F46", "D3B21F47");
    assert!(!same_event_token(
        &token(format!("{other}04")),
        &token(format!("{mongo}2A04"))
    ));
    // Too short to hold a cluster time: only the same token is the same event.
    assert!(!same_event_token(
        &token("8201".into()),
        &token("820100".into())
    ));
    assert!(!same_event_token(&doc! { "_data": 1 }, &first));
}

#[test]
fn a_token_holding_nan_passes_the_compare_and_set() {
    let consumer = Consumer {
        consumer: "c".into(),
        source: "db.coll".into(),
    };
    let token = doc! { "_data": "8201", "n": f64::NAN, "a": [f64::NAN] };
    let next = doc! { "_data": "8202" };
    let stored =
        doc! { "_id": "c", "source": "db.coll", "token": token.clone(), "mode": "resumeAfter" };
    let commit = |expected: &Document| {
        compare_and_set(
            &stored,
            &Commit {
                consumer: &consumer,
                expected: Some(expected),
                next: &next,
                mode: Mode::ResumeAfter,
                outbox: vec![],
                quarantine: vec![],
                lease: None,
                policy: None,
            },
        )
    };
    let updated = commit(&token.clone()).expect("the saved token is the expected one");
    assert_eq!(updated.get_document("token").unwrap(), &next);
    let other = doc! { "_data": "8201", "n": f64::NAN, "a": [1.0] };
    assert!(matches!(commit(&other), Err(CommitError::Conflict)));
}

#[test]
fn a_commit_with_a_lease_needs_its_owner_renews_it_and_counts_the_revision() {
    let consumer = Consumer {
        consumer: "c".into(),
        source: "db.coll".into(),
    };
    let lease = Lease {
        owner: "me".into(),
        duration: std::time::Duration::from_secs(60),
    };
    let next = doc! { "_data": "8202" };
    let stored = doc! {
        "_id": "c", "source": "db.coll", "token": null, "mode": "resumeAfter",
        "revision": 4_i64, "owner": "me", "leaseUntil": DateTime::from_millis(0),
    };
    let commit = Commit {
        consumer: &consumer,
        expected: None,
        next: &next,
        mode: Mode::ResumeAfter,
        outbox: vec![],
        quarantine: vec![],
        lease: Some(&lease),
        policy: None,
    };
    let before = DateTime::now();
    let updated = compare_and_set(&stored, &commit).unwrap();
    assert_eq!(updated.get_i64("revision").unwrap(), 5);
    assert!(*updated.get_datetime("leaseUntil").unwrap() >= lease.until(before));
    let mut taken = stored.clone();
    taken.insert("owner", "someone else");
    assert!(matches!(
        compare_and_set(&taken, &commit),
        Err(CommitError::Conflict)
    ));
    // A checkpoint the baseline wrote has no revision: the first write makes it 1.
    let mut baseline = stored.clone();
    baseline.remove("revision");
    let without_lease = Commit {
        lease: None,
        ..commit.clone()
    };
    let updated = compare_and_set(&baseline, &without_lease).unwrap();
    assert_eq!(updated.get_i64("revision").unwrap(), 1);
}

#[test]
fn a_claim_needs_the_revision_it_read_and_keeps_the_last_changes() {
    let stored = doc! { "_id": "c", "source": "db.coll", "token": null, "revision": 2_i64 };
    let claim = |seen: Option<i64>, n: i32| Claim {
        seen_revision: seen,
        set: doc! { "owner": "me", "leaseUntil": DateTime::from_millis(5) },
        change: Some(doc! { "n": n }),
        run: 1,
        moves: 0,
    };
    assert!(matches!(
        apply_claim(&stored, &claim(Some(1), 0)),
        Err(CommitError::Conflict)
    ));
    assert!(matches!(
        apply_claim(&stored, &claim(None, 0)),
        Err(CommitError::Conflict)
    ));
    let mut current = stored.clone();
    for n in 0..25 {
        let seen = revision(&current);
        current = apply_claim(&current, &claim(seen, n)).unwrap();
    }
    assert_eq!(current.get_i64("revision").unwrap(), 27);
    assert_eq!(current.get_str("owner").unwrap(), "me");
    let changes = current.get_array("configChanges").unwrap();
    assert_eq!(changes.len(), CONFIG_CHANGES_KEPT as usize);
    assert_eq!(changes[0], Bson::Document(doc! { "n": 5 }));
    // A baseline checkpoint (no revision) is claimed from "none".
    let mut baseline = stored.clone();
    baseline.remove("revision");
    let claimed = apply_claim(&baseline, &claim(None, 0)).unwrap();
    assert_eq!(claimed.get_i64("revision").unwrap(), 1);
    // Only the owner releases.
    let at = DateTime::from_millis(9);
    assert!(apply_release(&claimed, "other", at).is_none());
    let released = apply_release(&claimed, "me", at).unwrap();
    assert_eq!(released.get_datetime("leaseUntil").unwrap(), &at);
    assert_eq!(released.get_i64("revision").unwrap(), 2);
}
