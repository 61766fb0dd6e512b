use crate::common;

use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use common::{command, next_event, next_op, token_doc, token_hex, token_of};
use mongo_sim::Config;
use mongodb::error::ErrorKind;
use mongodb::options::FullDocumentType;

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

#[tokio::test]
async fn crud_events_with_update_lookup() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("orders");
    let mut stream = coll
        .watch()
        .full_document(FullDocumentType::UpdateLookup)
        .max_await_time(Duration::from_millis(200))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1, "s": "new"}).await.unwrap();
    coll.update_one(
        doc! {"_id": 1},
        doc! {"$set": {"s": "paid"}, "$unset": {"x": ""}},
    )
    .await
    .unwrap();
    coll.replace_one(doc! {"_id": 1}, doc! {"s": "replaced"})
        .await
        .unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();

    let ins = next_event(&mut stream).await;
    assert_eq!(ins.get_str("operationType").unwrap(), "insert");
    assert_eq!(
        ins.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "s": "new"}
    );
    assert_eq!(
        ins.get_document("ns").unwrap(),
        &doc! {"db": "cs", "coll": "orders"}
    );
    assert_eq!(ins.get_document("documentKey").unwrap(), &doc! {"_id": 1});
    assert!(ins.get_timestamp("clusterTime").is_ok());
    assert!(ins.get_datetime("wallTime").is_ok());

    let upd = next_event(&mut stream).await;
    assert_eq!(upd.get_str("operationType").unwrap(), "update");
    let desc = upd.get_document("updateDescription").unwrap();
    assert_eq!(
        desc.get_document("updatedFields").unwrap(),
        &doc! {"s": "paid"}
    );
    assert!(desc.get_array("removedFields").unwrap().is_empty());
    // Looked up at read time: the document has since been deleted.
    assert_eq!(upd.get("fullDocument"), Some(&Bson::Null));

    let rep = next_event(&mut stream).await;
    assert_eq!(rep.get_str("operationType").unwrap(), "replace");
    assert_eq!(
        rep.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "s": "replaced"}
    );
    let del = next_event(&mut stream).await;
    assert_eq!(del.get_str("operationType").unwrap(), "delete");
    assert_eq!(del.get_document("documentKey").unwrap(), &doc! {"_id": 1});

    // Token shape: 82 + timestamp, uppercase hex, ordered like the stream.
    let hexes: Vec<String> = [&ins, &upd, &rep, &del]
        .iter()
        .map(|e| token_hex(e.get_document("_id").unwrap()))
        .collect();
    for h in &hexes {
        assert!(h.starts_with("82"));
        assert!(
            h.chars()
                .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)),
            "{h}"
        );
    }
    let mut sorted = hexes.clone();
    sorted.sort();
    assert_eq!(sorted, hexes);
    server.shutdown().await;
}

#[tokio::test]
async fn update_lookup_returns_the_current_document() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("lookup");
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    let mut stream = coll
        .watch()
        .full_document(FullDocumentType::UpdateLookup)
        .max_await_time(Duration::from_millis(200))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
        .await
        .unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        e.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "n": 1}
    );
    assert_eq!(
        e.get_document("updateDescription")
            .unwrap()
            .get_document("updatedFields")
            .unwrap(),
        &doc! {"n": 1}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn every_reply_carries_a_post_batch_token_and_int64_cursor_id() {
    let (server, client) = common::start().await;
    let db = "cs";
    client.database(db).create_collection("pbrt").await.unwrap();
    let reply = command(
        &client,
        db,
        doc! {"aggregate": "pbrt", "pipeline": [{"$changeStream": {}}], "cursor": {}},
    )
    .await;
    let cursor = reply.get_document("cursor").unwrap();
    assert!(cursor.get_array("firstBatch").unwrap().is_empty());
    let first_token = cursor.get_document("postBatchResumeToken").unwrap().clone();
    let id = cursor.get_i64("id").unwrap();
    assert_ne!(id, 0);
    assert_eq!(cursor.get_str("ns").unwrap(), "cs.pbrt");
    assert!(reply.get_timestamp("operationTime").is_ok());

    let started = Instant::now();
    let reply = command(
        &client,
        db,
        doc! {"getMore": id, "collection": "pbrt", "maxTimeMS": 300},
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "an empty getMore waits for maxTimeMS"
    );
    let cursor = reply.get_document("cursor").unwrap();
    assert!(cursor.get_array("nextBatch").unwrap().is_empty());
    assert_eq!(cursor.get_i64("id").unwrap(), id);
    let empty_token = cursor.get_document("postBatchResumeToken").unwrap().clone();
    assert!(token_hex(&empty_token) >= token_hex(&first_token));

    // A write elsewhere advances the post-batch token without an event.
    client
        .database(db)
        .collection::<Document>("other")
        .insert_one(doc! {"x": 1})
        .await
        .unwrap();
    let reply = command(
        &client,
        db,
        doc! {"getMore": id, "collection": "pbrt", "maxTimeMS": 10},
    )
    .await;
    let advanced = reply
        .get_document("cursor")
        .unwrap()
        .get_document("postBatchResumeToken")
        .unwrap()
        .clone();
    assert!(token_hex(&advanced) > token_hex(&empty_token));

    // A waiting getMore returns as soon as an event arrives.
    let coll = client.database(db).collection::<Document>("pbrt");
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        coll.insert_one(doc! {"_id": 7}).await.unwrap();
    });
    let started = Instant::now();
    let reply = command(
        &client,
        db,
        doc! {"getMore": id, "collection": "pbrt", "maxTimeMS": 5000},
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(3));
    let cursor = reply.get_document("cursor").unwrap();
    let batch = cursor.get_array("nextBatch").unwrap();
    assert_eq!(batch.len(), 1);
    let event_token = batch[0]
        .as_document()
        .unwrap()
        .get_document("_id")
        .unwrap()
        .clone();
    let pbrt = cursor.get_document("postBatchResumeToken").unwrap().clone();
    assert!(token_hex(&pbrt) >= token_hex(&event_token));
    writer.await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn resume_after_and_start_at_operation_time() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("resume");
    let stream = coll.watch().await.unwrap();
    let start = stream.resume_token().unwrap();
    drop(stream);
    for i in 0..5 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    let mut from_start = coll
        .watch()
        .resume_after(start.clone())
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    let mut tokens = Vec::new();
    for i in 0..5 {
        let e = next_event(&mut from_start).await;
        assert_eq!(e.get_document("documentKey").unwrap(), &doc! {"_id": i});
        tokens.push(token_of(&e));
    }
    // Resuming after the third event yields the fourth and fifth only.
    let mut resumed = coll
        .watch()
        .resume_after(tokens[2].clone())
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    assert_eq!(
        next_event(&mut resumed)
            .await
            .get_document("documentKey")
            .unwrap(),
        &doc! {"_id": 3}
    );
    assert_eq!(
        next_event(&mut resumed)
            .await
            .get_document("documentKey")
            .unwrap(),
        &doc! {"_id": 4}
    );
    assert!(resumed.next_if_any().await.unwrap().is_none());
    // startAfter behaves like resumeAfter for ordinary events.
    let mut started_after = coll
        .watch()
        .start_after(tokens[3].clone())
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    assert_eq!(
        next_event(&mut started_after)
            .await
            .get_document("documentKey")
            .unwrap(),
        &doc! {"_id": 4}
    );

    // startAtOperationTime includes events at that time.
    let first = {
        let mut s = coll
            .watch()
            .resume_after(start)
            .await
            .unwrap()
            .with_type::<Document>();
        next_event(&mut s).await
    };
    let second_time = {
        let mut s = coll
            .watch()
            .resume_after(token_of(&first))
            .await
            .unwrap()
            .with_type::<Document>();
        next_event(&mut s)
            .await
            .get_timestamp("clusterTime")
            .unwrap()
    };
    let mut at = coll
        .watch()
        .start_at_operation_time(second_time)
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    assert_eq!(
        next_event(&mut at)
            .await
            .get_document("documentKey")
            .unwrap(),
        &doc! {"_id": 1}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn both_tokens_is_an_error() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("both");
    let token = coll.watch().await.unwrap().resume_token().unwrap();
    let t = token_doc(&token);
    let err = client
        .database("cs")
        .run_command(doc! {"aggregate": "both", "pipeline": [{"$changeStream": {"resumeAfter": t.clone(), "startAfter": t}}], "cursor": {}})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(50865));
    server.shutdown().await;
}

#[tokio::test]
async fn transaction_events_appear_at_commit_with_session_fields() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("txn");
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    coll.insert_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 2})
        .session(&mut s)
        .await
        .unwrap();
    assert!(
        stream.next_if_any().await.unwrap().is_none(),
        "uncommitted writes are not visible"
    );
    s.commit_transaction().await.unwrap();
    let a = next_event(&mut stream).await;
    let b = next_event(&mut stream).await;
    assert_eq!(
        a.get_timestamp("clusterTime").unwrap(),
        b.get_timestamp("clusterTime").unwrap()
    );
    for e in [&a, &b] {
        assert_eq!(e.get_document("lsid").unwrap(), s.id());
        assert!(e.get_i64("txnNumber").is_ok());
    }
    assert!(token_hex(a.get_document("_id").unwrap()) < token_hex(b.get_document("_id").unwrap()));
    server.shutdown().await;
}

#[tokio::test]
async fn drop_invalidates_and_tokens_behave() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("dropme");
    coll.insert_one(doc! {"_id": 0}).await.unwrap();
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    coll.drop().await.unwrap();
    assert_eq!(next_op(&mut stream).await, "insert");
    let dropped = next_event(&mut stream).await;
    assert_eq!(dropped.get_str("operationType").unwrap(), "drop");
    assert_eq!(
        dropped.get_document("ns").unwrap(),
        &doc! {"db": "cs", "coll": "dropme"}
    );
    let invalidate = next_event(&mut stream).await;
    assert_eq!(invalidate.get_str("operationType").unwrap(), "invalidate");
    assert!(!stream.is_alive(), "the cursor is closed after invalidate");

    // resumeAfter an invalidate → 260; startAfter it → a new stream.
    let err = coll
        .watch()
        .resume_after(token_of(&invalidate))
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(260));
    let mut after = coll
        .watch()
        .start_after(token_of(&invalidate))
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let e = next_event(&mut after).await;
    assert_eq!(e.get_str("operationType").unwrap(), "insert");
    assert_eq!(e.get_document("documentKey").unwrap(), &doc! {"_id": 2});
    // Resuming after the drop event yields the invalidate again.
    let mut again = coll
        .watch()
        .resume_after(token_of(&dropped))
        .await
        .unwrap()
        .with_type::<Document>();
    assert_eq!(next_op(&mut again).await, "invalidate");
    server.shutdown().await;
}

#[tokio::test]
async fn raw_drop_reply_closes_the_cursor() {
    let (server, client) = common::start().await;
    client
        .database("cs")
        .create_collection("raw")
        .await
        .unwrap();
    let reply = command(
        &client,
        "cs",
        doc! {"aggregate": "raw", "pipeline": [{"$changeStream": {}}], "cursor": {}},
    )
    .await;
    let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
    client
        .database("cs")
        .collection::<Document>("raw")
        .drop()
        .await
        .unwrap();
    let reply = command(
        &client,
        "cs",
        doc! {"getMore": id, "collection": "raw", "maxTimeMS": 100},
    )
    .await;
    let cursor = reply.get_document("cursor").unwrap();
    let kinds: Vec<&str> = cursor
        .get_array("nextBatch")
        .unwrap()
        .iter()
        .map(|e| e.as_document().unwrap().get_str("operationType").unwrap())
        .collect();
    assert_eq!(kinds, vec!["drop", "invalidate"]);
    assert_eq!(cursor.get_i64("id").unwrap(), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn rename_invalidates() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("before");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    command(
        &client,
        "admin",
        doc! {"renameCollection": "cs.before", "to": "cs.after"},
    )
    .await;
    let e = next_event(&mut stream).await;
    assert_eq!(e.get_str("operationType").unwrap(), "rename");
    assert_eq!(
        e.get_document("to").unwrap(),
        &doc! {"db": "cs", "coll": "after"}
    );
    assert_eq!(next_op(&mut stream).await, "invalidate");
    assert!(!stream.is_alive());
    server.shutdown().await;
}

#[tokio::test]
async fn database_level_stream() {
    let (server, client) = common::start().await;
    let db = client.database("csdb");
    let mut stream = db
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    db.collection::<Document>("a")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    db.collection::<Document>("b")
        .insert_one(doc! {"_id": 2})
        .await
        .unwrap();
    client
        .database("elsewhere")
        .collection::<Document>("a")
        .insert_one(doc! {"_id": 3})
        .await
        .unwrap();
    db.collection::<Document>("a").drop().await.unwrap();
    assert_eq!(
        next_event(&mut stream).await.get_document("ns").unwrap(),
        &doc! {"db": "csdb", "coll": "a"}
    );
    assert_eq!(
        next_event(&mut stream).await.get_document("ns").unwrap(),
        &doc! {"db": "csdb", "coll": "b"}
    );
    assert_eq!(next_op(&mut stream).await, "drop");
    assert!(
        stream.is_alive(),
        "dropping one collection does not invalidate a database stream"
    );
    db.drop().await.unwrap();
    assert_eq!(next_op(&mut stream).await, "drop");
    assert_eq!(next_op(&mut stream).await, "dropDatabase");
    assert_eq!(next_op(&mut stream).await, "invalidate");
    server.shutdown().await;
}

#[tokio::test]
async fn match_stage_filters_events() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("filtered");
    let mut stream = coll
        .watch()
        .pipeline([doc! {"$match": {"operationType": "delete"}}])
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(next_op(&mut stream).await, "delete");
    server.shutdown().await;
}

#[tokio::test]
async fn project_stage_and_fatal_id_change() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("projected");
    let mut stream = coll
        .watch()
        .pipeline([
            doc! {"$project": {"operationType": 1, "ns": 1, "kind": "$operationType", "tag": "t"}},
        ])
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        e.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
        vec!["_id", "operationType", "ns", "kind", "tag"]
    );
    assert_eq!(e.get_str("kind").unwrap(), "insert");
    let mut bad = coll
        .watch()
        .pipeline([doc! {"$project": {"_id": 0}}])
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let err = loop {
        match bad.next_if_any().await {
            Ok(None) => continue,
            Ok(Some(e)) => panic!("unexpected event {e}"),
            Err(e) => break e,
        }
    };
    assert_eq!(code_of(&err), Some(280));
    assert!(err.contains_label("NonResumableChangeStreamError"));
    server.shutdown().await;
}

#[tokio::test]
async fn history_loss_is_286_and_not_resumable() {
    let (server, client) = common::start_with(Config {
        history_limit: 5,
        ..Config::default()
    })
    .await;
    let coll = client.database("cs").collection::<Document>("small");
    coll.insert_one(doc! {"_id": 0}).await.unwrap();
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let first = next_event(&mut stream).await;
    for i in 2..20 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    assert!(server.history_len() <= 5);
    // Resuming from a token that fell off the history.
    let err = coll
        .watch()
        .resume_after(token_of(&first))
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(286));
    assert!(err.contains_label("NonResumableChangeStreamError"));
    let message = match &*err.kind {
        ErrorKind::Command(c) => c.message.clone(),
        _ => String::new(),
    };
    assert!(message.contains("no longer be in the oplog"), "{message}");
    // An open stream that fell behind fails the same way on getMore, without resuming.
    let err = loop {
        match stream.next_if_any().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("expected history loss"),
            Err(e) => break e,
        }
    };
    assert_eq!(code_of(&err), Some(286));
    server.shutdown().await;
}

#[tokio::test]
async fn an_event_over_16_mib_fails_the_stream_with_bson_object_too_large() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("big");
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 0}).await.unwrap();
    let first = next_event(&mut stream).await;
    // The document fits (16 MiB less a little); its event, with the event's own fields, does not.
    let pad = 16 * 1024 * 1024 - 64;
    coll.insert_one(doc! {"_id": 1, "pad": "x".repeat(pad)})
        .await
        .unwrap();
    let err = loop {
        match stream.next_if_any().await {
            Ok(None) => continue,
            Ok(Some(e)) => panic!("an oversized event was delivered: {:?}", e.get("_id")),
            Err(e) => break e,
        }
    };
    assert_eq!(code_of(&err), Some(10334), "{err}");
    // Opening the stream just before it fails the same way.
    let reopened = coll
        .watch()
        .resume_after(token_of(&first))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(code_of(&reopened), Some(10334), "{reopened}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_batch_holds_at_most_16_mib_of_events() {
    let (server, client) = common::start().await;
    let coll = client.database("cs").collection::<Document>("wide");
    let start = common::command(
        &client,
        "cs",
        doc! {"aggregate": "wide", "pipeline": [{"$changeStream": {}}], "cursor": {}},
    )
    .await;
    let start = start
        .get_document("cursor")
        .unwrap()
        .get_document("postBatchResumeToken")
        .unwrap()
        .clone();
    for i in 0..30 {
        coll.insert_one(doc! {"_id": i, "pad": "x".repeat(1024 * 1024)})
            .await
            .unwrap();
    }
    let reply = common::command(
        &client,
        "cs",
        doc! {"aggregate": "wide", "pipeline": [{"$changeStream": {"resumeAfter": start}}], "cursor": {}},
    )
    .await;
    let cursor = reply.get_document("cursor").unwrap();
    let mut seen: Vec<i32> = Vec::new();
    let mut batches = 0;
    let mut batch = cursor.get_array("firstBatch").unwrap().clone();
    let id = cursor.get_i64("id").unwrap();
    loop {
        let bytes: usize = batch
            .iter()
            .map(|e| e.as_document().unwrap().to_vec().unwrap().len())
            .sum();
        assert!(bytes <= 16 * 1024 * 1024, "a batch of {bytes} bytes");
        seen.extend(batch.iter().map(|e| {
            e.as_document()
                .unwrap()
                .get_document("documentKey")
                .unwrap()
                .get_i32("_id")
                .unwrap()
        }));
        batches += 1;
        if seen.len() == 30 {
            break;
        }
        let more = common::command(
            &client,
            "cs",
            doc! {"getMore": id, "collection": "wide", "maxTimeMS": 100},
        )
        .await;
        batch = more
            .get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .clone();
        assert!(batches < 10, "too many batches");
    }
    assert_eq!(seen, (0..30).collect::<Vec<_>>());
    assert!(batches >= 2, "30 MiB of events came in one batch");
    server.shutdown().await;
}
