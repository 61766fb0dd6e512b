use crate::common;

use std::time::{Duration, Instant};

use bson::{Document, doc};
use common::{command, next_event};
use mongodb::Client;
use mongodb::error::ErrorKind;

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

async fn fail_point(client: &Client, mode: bson::Bson, data: Document) {
    command(
        client,
        "admin",
        doc! {"configureFailPoint": "failCommand", "mode": mode, "data": data},
    )
    .await;
}

async fn off(client: &Client) {
    command(
        client,
        "admin",
        doc! {"configureFailPoint": "failCommand", "mode": "off"},
    )
    .await;
}

#[tokio::test]
async fn error_code_and_labels_times() {
    let (server, client) = common::start().await;
    fail_point(
        &client,
        doc! {"times": 2}.into(),
        doc! {"failCommands": ["ping"], "errorCode": 91, "errorLabels": ["MyLabel"]},
    )
    .await;
    let admin = client.database("admin");
    for _ in 0..2 {
        let err = admin.run_command(doc! {"ping": 1}).await.unwrap_err();
        assert_eq!(code_of(&err), Some(91));
        assert!(err.contains_label("MyLabel"));
    }
    admin.run_command(doc! {"ping": 1}).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn skip_then_always_on_until_off() {
    let (server, client) = common::start().await;
    fail_point(
        &client,
        doc! {"skip": 2}.into(),
        doc! {"failCommands": ["count"], "errorCode": 8},
    )
    .await;
    let db = client.database("fp");
    for _ in 0..2 {
        db.run_command(doc! {"count": "c"}).await.unwrap();
    }
    for _ in 0..3 {
        assert_eq!(
            code_of(&db.run_command(doc! {"count": "c"}).await.unwrap_err()),
            Some(8)
        );
    }
    off(&client).await;
    db.run_command(doc! {"count": "c"}).await.unwrap();
    fail_point(
        &client,
        "alwaysOn".into(),
        doc! {"failCommands": ["count"], "errorCode": 8},
    )
    .await;
    assert_eq!(
        code_of(&db.run_command(doc! {"count": "c"}).await.unwrap_err()),
        Some(8)
    );
    off(&client).await;
    db.run_command(doc! {"count": "c"}).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn block_connection_delays_the_command() {
    let (server, client) = common::start().await;
    fail_point(
        &client,
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["find"], "blockConnection": true, "blockTimeMS": 700},
    )
    .await;
    let coll = client.database("fp").collection::<Document>("slow");
    let started = Instant::now();
    coll.find_one(doc! {}).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(690));
    let started = Instant::now();
    coll.find_one(doc! {}).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "only the first find is blocked"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn close_connection_is_retried_by_retryable_writes_exactly_once() {
    let (server, client) = common::start().await;
    fail_point(
        &client,
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["insert"], "closeConnection": true},
    )
    .await;
    let coll = client.database("fp").collection::<Document>("retry");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn injected_transient_error_in_a_transaction_is_labelled() {
    let (server, client) = common::start().await;
    fail_point(
        &client,
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["update"], "errorCode": 112},
    )
    .await;
    let coll = client.database("fp").collection::<Document>("wc");
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    let err = coll
        .update_one(doc! {"_id": 1}, doc! {"$set": {"a": 1}})
        .session(&mut s)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(112));
    assert!(err.contains_label("TransientTransactionError"));
    server.shutdown().await;
}

#[tokio::test]
async fn change_stream_resumes_across_a_closed_get_more() {
    let (server, client) = common::start().await;
    let coll = client.database("fp").collection::<Document>("stream");
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    for i in 0..3 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    let mut seen = Vec::new();
    seen.push(
        next_event(&mut stream)
            .await
            .get_document("documentKey")
            .unwrap()
            .get_i32("_id")
            .unwrap(),
    );
    // The batch holding events 1 and 2 was already delivered with the first; drain it, then
    // break the next getMore.
    while seen.len() < 3 {
        seen.push(
            next_event(&mut stream)
                .await
                .get_document("documentKey")
                .unwrap()
                .get_i32("_id")
                .unwrap(),
        );
    }
    fail_point(
        &client,
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["getMore"], "closeConnection": true},
    )
    .await;
    for i in 3..6 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    while seen.len() < 6 {
        seen.push(
            next_event(&mut stream)
                .await
                .get_document("documentKey")
                .unwrap()
                .get_i32("_id")
                .unwrap(),
        );
    }
    coll.insert_one(doc! {"_id": 6}).await.unwrap();
    seen.push(
        next_event(&mut stream)
            .await
            .get_document("documentKey")
            .unwrap()
            .get_i32("_id")
            .unwrap(),
    );
    assert_eq!(
        seen,
        (0..7).collect::<Vec<_>>(),
        "no event lost or repeated"
    );
    assert!(stream.next_if_any().await.unwrap().is_none());
    server.shutdown().await;
}

#[tokio::test]
async fn change_stream_resumes_after_a_resumable_error_code() {
    let (server, client) = common::start().await;
    let coll = client.database("fp").collection::<Document>("stream2");
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 0}).await.unwrap();
    assert_eq!(
        next_event(&mut stream)
            .await
            .get_document("documentKey")
            .unwrap(),
        &doc! {"_id": 0}
    );
    // A failure inside the cursor carries ResumableChangeStreamError: the driver resumes.
    command(
        &client,
        "admin",
        doc! {"configureFailPoint": "failGetMoreAfterCursorCheckout", "mode": {"times": 1}, "data": {"errorCode": 10107}},
    )
    .await;
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(
        next_event(&mut stream)
            .await
            .get_document("documentKey")
            .unwrap(),
        &doc! {"_id": 1}
    );
    // The same kind of code from failCommand (in front of the command) has no resume label.
    fail_point(
        &client,
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["getMore"], "errorCode": 6},
    )
    .await;
    let err = stream.next_if_any().await.unwrap_err();
    assert_eq!(code_of(&err), Some(6));
    assert!(!err.contains_label("ResumableChangeStreamError"));
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    // History loss injected on getMore is not resumed.
    fail_point(
        &client,
        doc! {"times": 1}.into(),
        doc! {"failCommands": ["getMore"], "errorCode": 286},
    )
    .await;
    let err = loop {
        match stream.next_if_any().await {
            Ok(None) => continue,
            Ok(Some(e)) => panic!("unexpected event {e}"),
            Err(e) => break e,
        }
    };
    assert_eq!(code_of(&err), Some(286));
    assert!(err.contains_label("NonResumableChangeStreamError"));
    server.shutdown().await;
}
