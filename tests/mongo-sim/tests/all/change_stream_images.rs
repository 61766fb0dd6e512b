//! Pre- and post-images: `changeStreamPreAndPostImages` on `create` / `collMod`,
//! `fullDocument: whenAvailable | required` and `fullDocumentBeforeChange`.

use crate::common;

use std::time::Duration;

use bson::{Bson, Document, doc};
use common::{command, next_event};
use mongodb::change_stream::ChangeStream;
use mongodb::error::ErrorKind;
use mongodb::options::{FullDocumentBeforeChangeType, FullDocumentType};
use mongodb::{Client, Collection};

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

fn command_error(e: &mongodb::error::Error) -> (i32, String, String) {
    match &*e.kind {
        ErrorKind::Command(c) => (c.code, c.code_name.clone(), c.message.clone()),
        other => panic!("not a command error: {other:?}"),
    }
}

async fn create_with_images(client: &Client, db: &str, coll: &str) -> Collection<Document> {
    command(
        client,
        db,
        doc! {"create": coll, "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    client.database(db).collection(coll)
}

async fn options_of(client: &Client, db: &str, coll: &str) -> Document {
    let reply = command(
        client,
        db,
        doc! {"listCollections": 1, "filter": {"name": coll}},
    )
    .await;
    let batch = reply
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch.len(), 1, "{reply}");
    batch[0]
        .as_document()
        .unwrap()
        .get_document("options")
        .unwrap()
        .clone()
}

async fn watch(
    coll: &Collection<Document>,
    full: Option<FullDocumentType>,
    before: Option<FullDocumentBeforeChangeType>,
) -> ChangeStream<Document> {
    let mut w = coll.watch().max_await_time(Duration::from_millis(100));
    if let Some(f) = full {
        w = w.full_document(f);
    }
    if let Some(b) = before {
        w = w.full_document_before_change(b);
    }
    w.await.unwrap().with_type::<Document>()
}

/// The next getMore failure of a stream (events before it are skipped).
async fn next_error(stream: &mut ChangeStream<Document>) -> mongodb::error::Error {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match stream.next_if_any().await {
            Ok(_) => assert!(std::time::Instant::now() < deadline, "no error within 10 s"),
            Err(e) => return e,
        }
    }
}

#[tokio::test]
async fn create_and_coll_mod_set_the_option_listed_by_list_collections() {
    let (server, client) = common::start().await;
    create_with_images(&client, "img", "on").await;
    assert_eq!(
        options_of(&client, "img", "on").await,
        doc! {"changeStreamPreAndPostImages": {"enabled": true}}
    );
    // Disabled is the default and is not listed.
    command(
        &client,
        "img",
        doc! {"create": "off", "changeStreamPreAndPostImages": {"enabled": false}},
    )
    .await;
    assert_eq!(options_of(&client, "img", "off").await, doc! {});
    let reply = command(
        &client,
        "img",
        doc! {"collMod": "off", "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    assert_eq!(
        options_of(&client, "img", "off").await,
        doc! {"changeStreamPreAndPostImages": {"enabled": true}}
    );
    command(
        &client,
        "img",
        doc! {"collMod": "on", "changeStreamPreAndPostImages": {"enabled": false}},
    )
    .await;
    assert_eq!(options_of(&client, "img", "on").await, doc! {});
    server.shutdown().await;
}

#[tokio::test]
async fn update_replace_and_delete_carry_their_images() {
    let (server, client) = common::start().await;
    let coll = create_with_images(&client, "img", "all").await;
    let mut stream = watch(
        &coll,
        Some(FullDocumentType::Required),
        Some(FullDocumentBeforeChangeType::Required),
    )
    .await;
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
        .await
        .unwrap();
    coll.replace_one(doc! {"_id": 1}, doc! {"r": true})
        .await
        .unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();

    let insert = next_event(&mut stream).await;
    assert_eq!(insert.get_str("operationType").unwrap(), "insert");
    assert!(!insert.contains_key("fullDocumentBeforeChange"), "{insert}");

    let update = next_event(&mut stream).await;
    assert_eq!(update.get_str("operationType").unwrap(), "update");
    // The stored post-image, although the document is gone by now.
    assert_eq!(
        update.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "n": 1}
    );
    assert_eq!(
        update.get_document("fullDocumentBeforeChange").unwrap(),
        &doc! {"_id": 1, "n": 0}
    );
    let keys: Vec<&String> = update.keys().collect();
    assert_eq!(keys.last().unwrap().as_str(), "fullDocumentBeforeChange");
    assert_eq!(keys[4].as_str(), "fullDocument", "{update}");

    let replace = next_event(&mut stream).await;
    assert_eq!(
        replace.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "r": true}
    );
    assert_eq!(
        replace.get_document("fullDocumentBeforeChange").unwrap(),
        &doc! {"_id": 1, "n": 1}
    );

    let delete = next_event(&mut stream).await;
    assert_eq!(delete.get_str("operationType").unwrap(), "delete");
    assert!(!delete.contains_key("fullDocument"));
    assert_eq!(
        delete.get_document("fullDocumentBeforeChange").unwrap(),
        &doc! {"_id": 1, "r": true}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn the_post_image_is_the_stored_one_while_update_lookup_reads_the_current_state() {
    let (server, client) = common::start().await;
    let coll = create_with_images(&client, "img", "post").await;
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    let mut images = watch(&coll, Some(FullDocumentType::WhenAvailable), None).await;
    let mut lookup = watch(&coll, Some(FullDocumentType::UpdateLookup), None).await;
    for _ in 0..2 {
        coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
            .await
            .unwrap();
    }
    let first = next_event(&mut images).await;
    let second = next_event(&mut images).await;
    assert_eq!(
        first.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "n": 1}
    );
    assert_eq!(
        second.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "n": 2}
    );
    assert!(!first.contains_key("fullDocumentBeforeChange"));
    let first = next_event(&mut lookup).await;
    assert_eq!(
        first.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "n": 2}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn when_available_gives_null_on_a_collection_without_the_option() {
    let (server, client) = common::start().await;
    let coll = client.database("img").collection::<Document>("plain");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let mut stream = watch(
        &coll,
        Some(FullDocumentType::WhenAvailable),
        Some(FullDocumentBeforeChangeType::WhenAvailable),
    )
    .await;
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a": 1}})
        .await
        .unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();
    let update = next_event(&mut stream).await;
    assert_eq!(update.get("fullDocument"), Some(&Bson::Null));
    assert_eq!(update.get("fullDocumentBeforeChange"), Some(&Bson::Null));
    let delete = next_event(&mut stream).await;
    assert_eq!(delete.get("fullDocumentBeforeChange"), Some(&Bson::Null));
    server.shutdown().await;
}

#[tokio::test]
async fn only_writes_made_while_enabled_keep_images() {
    let (server, client) = common::start().await;
    let coll = client.database("img").collection::<Document>("later");
    coll.insert_one(doc! {"_id": 1, "v": 0}).await.unwrap();
    let mut stream = watch(
        &coll,
        None,
        Some(FullDocumentBeforeChangeType::WhenAvailable),
    )
    .await;
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 1}})
        .await
        .unwrap();
    command(
        &client,
        "img",
        doc! {"collMod": "later", "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 2}})
        .await
        .unwrap();
    let before = next_event(&mut stream).await;
    assert_eq!(before.get("fullDocumentBeforeChange"), Some(&Bson::Null));
    let after = next_event(&mut stream).await;
    assert_eq!(
        after.get_document("fullDocumentBeforeChange").unwrap(),
        &doc! {"_id": 1, "v": 1}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_transaction_keeps_the_image_before_each_of_its_writes() {
    let (server, client) = common::start().await;
    let coll = create_with_images(&client, "img", "txn").await;
    coll.insert_one(doc! {"_id": 1, "v": 0}).await.unwrap();
    let mut stream = watch(
        &coll,
        Some(FullDocumentType::Required),
        Some(FullDocumentBeforeChangeType::Required),
    )
    .await;
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    for v in 1..=2 {
        coll.update_one(doc! {"_id": 1}, doc! {"$set": {"v": v}})
            .session(&mut session)
            .await
            .unwrap();
    }
    session.commit_transaction().await.unwrap();
    for (pre, post) in [(0, 1), (1, 2)] {
        let e = next_event(&mut stream).await;
        assert!(e.contains_key("txnNumber"));
        assert_eq!(
            e.get_document("fullDocument").unwrap(),
            &doc! {"_id": 1, "v": post}
        );
        assert_eq!(
            e.get_document("fullDocumentBeforeChange").unwrap(),
            &doc! {"_id": 1, "v": pre}
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_required_pre_image_that_is_missing_fails_with_no_matching_document() {
    let (server, client) = common::start().await;
    let coll = client.database("img").collection::<Document>("nopre");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let mut stream = watch(&coll, None, Some(FullDocumentBeforeChangeType::Required)).await;
    // Inserts have no pre-image to require.
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    assert_eq!(
        next_event(&mut stream)
            .await
            .get_str("operationType")
            .unwrap(),
        "insert"
    );
    coll.delete_one(doc! {"_id": 1}).await.unwrap();
    let err = next_error(&mut stream).await;
    let (code, name, message) = command_error(&err);
    assert_eq!((code, name.as_str()), (47, "NoMatchingDocument"));
    assert!(
        message.starts_with(
            "Change stream was configured to require a pre-image for all update, delete and replace events, but the pre-image was not found for event: {operationType: \"delete\", ns: {db: \"img\", coll: \"nopre\"}, clusterTime: Timestamp("
        ),
        "{message}"
    );
    assert!(!err.contains_label("ResumableChangeStreamError"));
    server.shutdown().await;
}

#[tokio::test]
async fn a_required_post_image_that_is_missing_fails_the_aggregate_and_the_get_more() {
    let (server, client) = common::start().await;
    let coll = client.database("img").collection::<Document>("nopost");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let start = command(&client, "admin", doc! {"ping": 1})
        .await
        .get_timestamp("operationTime")
        .unwrap();
    let mut stream = watch(&coll, Some(FullDocumentType::Required), None).await;
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a": 1}})
        .await
        .unwrap();
    let err = next_error(&mut stream).await;
    let (code, _, message) = command_error(&err);
    assert_eq!(code, 47);
    assert!(
        message.starts_with(
            "Change stream was configured to require a post-image for all update events, but the post-image was not found for event: {operationType: \"update\""
        ),
        "{message}"
    );
    // Opened where the event is already in the first batch: the aggregate fails.
    let err = coll
        .watch()
        .full_document(FullDocumentType::Required)
        .start_at_operation_time(start)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(47));
    server.shutdown().await;
}

#[tokio::test]
async fn bad_option_values_get_mongodb_errors() {
    let (server, client) = common::start().await;
    let db = client.database("img");
    let run = |cmd: Document| {
        let db = db.clone();
        async move { db.run_command(cmd).await.unwrap_err() }
    };
    let cases = [
        (
            doc! {"create": "a", "changeStreamPreAndPostImages": true},
            14,
            "BSON field 'create.changeStreamPreAndPostImages' is the wrong type 'bool', expected type 'object'",
        ),
        (
            doc! {"create": "a", "changeStreamPreAndPostImages": {"enabled": "yes"}},
            14,
            "BSON field 'create.changeStreamPreAndPostImages.enabled' is the wrong type 'string', expected type 'bool'",
        ),
        (
            doc! {"create": "a", "changeStreamPreAndPostImages": {}},
            40414,
            "BSON field 'create.changeStreamPreAndPostImages.enabled' is missing but a required field",
        ),
        (
            doc! {"create": "a", "changeStreamPreAndPostImages": {"enabled": true, "x": 1}},
            40415,
            "BSON field 'create.changeStreamPreAndPostImages.x' is an unknown field.",
        ),
        (
            doc! {"create": "v", "viewOn": "a", "changeStreamPreAndPostImages": {"enabled": true}},
            72,
            "option not supported on a view: changeStreamPreAndPostImages",
        ),
        (
            doc! {"collMod": "missing", "changeStreamPreAndPostImages": {"enabled": true}},
            26,
            "ns does not exist: img.missing",
        ),
        (
            doc! {"collMod": "a", "frobnicate": 1},
            40415,
            "BSON field 'collMod.frobnicate' is an unknown field.",
        ),
    ];
    for (cmd, code, message) in cases {
        let err = run(cmd.clone()).await;
        let (got, _, text) = command_error(&err);
        assert_eq!((got, text.as_str()), (code, message), "{cmd}");
    }
    let coll = db.collection::<Document>("a");
    for (spec, code) in [
        (doc! {"fullDocumentBeforeChange": "sometimes"}, 2),
        (doc! {"fullDocumentBeforeChange": 1}, 14),
        (doc! {"fullDocument": "always"}, 2),
        (doc! {"fullDocument": true}, 14),
    ] {
        let err = db
            .run_command(doc! {"aggregate": "a", "pipeline": [{"$changeStream": spec.clone()}], "cursor": {}})
            .await
            .unwrap_err();
        assert_eq!(code_of(&err), Some(code), "{spec}");
    }
    let err = db
        .run_command(doc! {"aggregate": "a", "pipeline": [{"$changeStream": {"fullDocumentBeforeChange": "sometimes"}}], "cursor": {}})
        .await
        .unwrap_err();
    assert_eq!(
        command_error(&err).2,
        "Enumeration value 'sometimes' for field '$changeStream.fullDocumentBeforeChange' is not a valid value."
    );
    // The connection is still good.
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    server.shutdown().await;
}
