//! `$changeStreamSplitLargeEvent`: events over 16 MiB arrive as fragments, each with its own
//! resume token, and a stream resumes after any fragment.

use crate::common;

use std::time::Duration;

use bson::{Document, doc};
use common::{command, next_event, token_hex, token_of};
use mongodb::change_stream::ChangeStream;
use mongodb::error::ErrorKind;
use mongodb::options::{FullDocumentBeforeChangeType, FullDocumentType};
use mongodb::{Client, Collection};

const MIB: usize = 1024 * 1024;

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

fn split_stage() -> Vec<Document> {
    vec![doc! {"$changeStreamSplitLargeEvent": {}}]
}

/// A collection keeping images, holding one 9 MiB document, so that an update's event (the
/// document before and after) is about 18 MiB.
async fn setup(client: &Client) -> Collection<Document> {
    command(
        client,
        "split",
        doc! {"create": "big", "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    let coll = client.database("split").collection::<Document>("big");
    coll.insert_one(doc! {"_id": 1, "pad": "x".repeat(9 * MIB)})
        .await
        .unwrap();
    coll
}

async fn watch(
    coll: &Collection<Document>,
    pipeline: Vec<Document>,
    resume: Option<mongodb::change_stream::event::ResumeToken>,
) -> mongodb::error::Result<ChangeStream<Document>> {
    let mut w = coll
        .watch()
        .pipeline(pipeline)
        .full_document(FullDocumentType::Required)
        .full_document_before_change(FullDocumentBeforeChangeType::Required)
        .max_await_time(Duration::from_millis(200));
    if let Some(t) = resume {
        w = w.resume_after(t);
    }
    Ok(w.await?.with_type::<Document>())
}

fn size(d: &Document) -> usize {
    d.to_vec().unwrap().len()
}

#[tokio::test]
async fn an_oversized_event_arrives_as_ordered_fragments() {
    let (server, client) = common::start().await;
    let coll = setup(&client).await;
    let mut stream = watch(&coll, split_stage(), None).await.unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"tag": "new"}})
        .await
        .unwrap();
    let first = next_event(&mut stream).await;
    let second = next_event(&mut stream).await;
    assert_eq!(
        first.get_document("splitEvent").unwrap(),
        &doc! {"fragment": 1, "of": 2}
    );
    assert_eq!(
        second.get_document("splitEvent").unwrap(),
        &doc! {"fragment": 2, "of": 2}
    );
    for f in [&first, &second] {
        assert!(size(f) < 16 * MIB, "{}", size(f));
        let keys: Vec<&str> = f.keys().map(String::as_str).collect();
        assert_eq!(&keys[..2], ["_id", "splitEvent"]);
    }
    // Smallest fields first: the small ones and the image before the change fill the first
    // fragment; the (larger) image after it goes in the second.
    assert_eq!(first.get_str("operationType").unwrap(), "update");
    assert!(first.contains_key("updateDescription") && first.contains_key("documentKey"));
    assert_eq!(
        first
            .get_document("fullDocumentBeforeChange")
            .unwrap()
            .get_str("pad")
            .unwrap()
            .len(),
        9 * MIB
    );
    assert!(!first.contains_key("fullDocument"));
    let after = second.get_document("fullDocument").unwrap();
    assert_eq!(after.get_str("tag").unwrap(), "new");
    assert_eq!(second.len(), 3);
    // Distinct tokens, in stream order.
    let (a, b) = (
        token_hex(first.get_document("_id").unwrap()),
        token_hex(second.get_document("_id").unwrap()),
    );
    assert!(a < b, "{a} {b}");
    // The next event follows normally.
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let next = next_event(&mut stream).await;
    assert_eq!(next.get_str("operationType").unwrap(), "insert");
    assert!(token_hex(next.get_document("_id").unwrap()) > b);
    server.shutdown().await;
}

#[tokio::test]
async fn resuming_after_a_fragment_continues_with_the_next_one() {
    let (server, client) = common::start().await;
    let coll = setup(&client).await;
    let mut stream = watch(&coll, split_stage(), None).await.unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"tag": "new"}})
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let first = next_event(&mut stream).await;
    let second = next_event(&mut stream).await;
    drop(stream);

    let mut resumed = watch(&coll, split_stage(), Some(token_of(&first)))
        .await
        .unwrap();
    let again = next_event(&mut resumed).await;
    assert_eq!(again.get("_id"), second.get("_id"));
    assert_eq!(
        again.get_document("splitEvent").unwrap(),
        &doc! {"fragment": 2, "of": 2}
    );
    let mut resumed = watch(&coll, split_stage(), Some(token_of(&second)))
        .await
        .unwrap();
    let next = next_event(&mut resumed).await;
    assert_eq!(next.get_str("operationType").unwrap(), "insert");
    assert_eq!(next.get_document("documentKey").unwrap(), &doc! {"_id": 2});

    // Resuming from a fragment needs the split stage.
    let err = watch(&coll, Vec::new(), Some(token_of(&first)))
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(280), "{err}");
    server.shutdown().await;
}

#[tokio::test]
async fn small_events_are_not_split_and_oversized_ones_fail_without_the_stage() {
    let (server, client) = common::start().await;
    let coll = setup(&client).await;
    let mut split = watch(&coll, split_stage(), None).await.unwrap();
    let mut plain = watch(&coll, Vec::new(), None).await.unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let small = next_event(&mut split).await;
    assert!(!small.contains_key("splitEvent"));
    assert_eq!(small.get_str("operationType").unwrap(), "insert");
    assert_eq!(
        next_event(&mut plain)
            .await
            .get_str("operationType")
            .unwrap(),
        "insert"
    );
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"tag": "new"}})
        .await
        .unwrap();
    let fragment = next_event(&mut split).await;
    assert!(fragment.contains_key("splitEvent"));
    let err = loop {
        match plain.next_if_any().await {
            Ok(None) => continue,
            Ok(Some(e)) => panic!("an oversized event was delivered: {:?}", e.get("_id")),
            Err(e) => break e,
        }
    };
    assert_eq!(code_of(&err), Some(10334), "{err}");
    server.shutdown().await;
}

#[tokio::test]
async fn the_split_stage_must_be_last_and_take_no_arguments() {
    let (server, client) = common::start().await;
    let db = client.database("split");
    for (stages, code) in [
        (
            vec![
                doc! {"$changeStreamSplitLargeEvent": {}},
                doc! {"$match": {}},
            ],
            7182802,
        ),
        (
            vec![doc! {"$changeStreamSplitLargeEvent": {"x": 1}}],
            7182800,
        ),
        (vec![doc! {"$changeStreamSplitLargeEvent": 1}], 7182800),
    ] {
        let mut pipeline = vec![doc! {"$changeStream": {}}];
        pipeline.extend(stages.clone());
        let err = db
            .run_command(doc! {"aggregate": "c", "pipeline": pipeline, "cursor": {}})
            .await
            .unwrap_err();
        assert_eq!(code_of(&err), Some(code), "{stages:?}");
    }
    server.shutdown().await;
}
