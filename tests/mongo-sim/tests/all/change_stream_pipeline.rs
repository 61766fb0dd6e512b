//! Stages after `$changeStream`: `$addFields`, `$set`, `$unset`, `$replaceRoot`,
//! `$replaceWith`, `$redact`, the expressions they evaluate, and the errors for the rest.

use crate::common;

use std::time::Duration;

use bson::{Bson, Document, doc};
use common::next_event;
use mongodb::Collection;
use mongodb::change_stream::ChangeStream;
use mongodb::error::ErrorKind;

fn command_error(e: &mongodb::error::Error) -> (i32, String, String) {
    match &*e.kind {
        ErrorKind::Command(c) => (c.code, c.code_name.clone(), c.message.clone()),
        other => panic!("not a command error: {other:?}"),
    }
}

async fn watch(coll: &Collection<Document>, pipeline: Vec<Document>) -> ChangeStream<Document> {
    coll.watch()
        .pipeline(pipeline)
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>()
}

async fn next_error(stream: &mut ChangeStream<Document>) -> mongodb::error::Error {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match stream.next_if_any().await {
            Ok(Some(e)) => panic!("an event was delivered: {e}"),
            Ok(None) => assert!(std::time::Instant::now() < deadline, "no error within 10 s"),
            Err(e) => return e,
        }
    }
}

#[tokio::test]
async fn add_fields_and_set_compute_from_the_event() {
    let (server, client) = common::start().await;
    let coll = client.database("pipe").collection::<Document>("calc");
    let mut stream = watch(
        &coll,
        vec![
            doc! {"$addFields": {
                "kind": {"$concat": ["$operationType", ":", "$ns.coll"]},
                "fullDocument.double": {"$multiply": ["$fullDocument.n", 2]},
                "sum": {"$add": ["$fullDocument.n", 0.5]},
                "diff": {"$subtract": ["$fullDocument.n", 20]},
                "abs": {"$abs": {"$subtract": ["$fullDocument.n", 20]}},
                "odd": {"$eq": [{"$mod": ["$fullDocument.n", 2]}, 1]},
                "label": {"$toString": "$fullDocument.n"},
                "t": {"$type": "$fullDocument.n"},
                "fallback": {"$ifNull": ["$fullDocument.missing", "none"]},
                "picked": {"$getField": {"field": "n", "input": "$fullDocument"}},
                "lit": {"$literal": "$notAPath"},
            }},
            doc! {"$set": {
                "big": {"$cond": {"if": {"$gte": ["$fullDocument.n", 10]}, "then": true, "else": false}},
                "both": {"$and": [{"$gt": ["$fullDocument.n", 1]}, {"$not": [{"$lt": ["$fullDocument.n", 0]}]}]},
                "either": {"$or": [{"$ne": ["$fullDocument.n", 11]}, {"$lte": ["$fullDocument.n", 11]}]},
            }},
        ],
    )
    .await;
    coll.insert_one(doc! {"_id": 1, "n": 11}).await.unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(e.get_str("kind").unwrap(), "insert:calc");
    assert_eq!(
        e.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "n": 11, "double": 22}
    );
    assert_eq!(e.get_f64("sum").unwrap(), 11.5);
    assert_eq!(e.get_i32("diff").unwrap(), -9);
    assert_eq!(e.get_i32("abs").unwrap(), 9);
    assert!(e.get_bool("odd").unwrap());
    assert_eq!(e.get_str("label").unwrap(), "11");
    assert_eq!(e.get_str("t").unwrap(), "int");
    assert_eq!(e.get_str("fallback").unwrap(), "none");
    assert_eq!(e.get_i32("picked").unwrap(), 11);
    assert_eq!(e.get_str("lit").unwrap(), "$notAPath");
    assert!(e.get_bool("big").unwrap());
    assert!(e.get_bool("both").unwrap());
    assert!(e.get_bool("either").unwrap());
    // Existing fields keep their place; new ones follow.
    let keys: Vec<&str> = e.keys().map(String::as_str).collect();
    assert_eq!(&keys[..2], ["_id", "operationType"]);
    assert_eq!(keys.last(), Some(&"either"));
    server.shutdown().await;
}

#[tokio::test]
async fn to_hashed_index_key_computes_mongodb_hashes() {
    let (server, client) = common::start().await;
    let coll = client.database("pipe").collection::<Document>("hash");
    let mut stream = watch(
        &coll,
        vec![doc! {"$project": {
            "h": {"$toHashedIndexKey": "$fullDocument.check"},
            "same": {"$eq": [
                {"$toHashedIndexKey": "$fullDocument.four"},
                {"$toHashedIndexKey": 4.9},
            ]},
            "nullHash": {"$eq": [
                {"$toHashedIndexKey": "$fullDocument.missing"},
                {"$toHashedIndexKey": null},
            ]},
        }}],
    )
    .await;
    coll.insert_one(doc! {"_id": 1, "check": 42, "four": 4i64})
        .await
        .unwrap();
    let e = next_event(&mut stream).await;
    // MongoDB's own start-up check: 42 hashes (seed 0) to this value.
    assert_eq!(e.get_i64("h").unwrap(), -944302157085130861);
    assert!(e.get_bool("same").unwrap());
    assert!(e.get_bool("nullHash").unwrap());
    server.shutdown().await;
}

#[tokio::test]
async fn unset_and_replace_root_keep_the_resume_token() {
    let (server, client) = common::start().await;
    let coll = client.database("pipe").collection::<Document>("reshape");
    let mut unset = watch(
        &coll,
        vec![doc! {"$unset": ["ns", "wallTime", "fullDocument.secret"]}],
    )
    .await;
    let mut replaced = watch(
        &coll,
        vec![doc! {"$replaceRoot": {"newRoot": {"_id": "$_id", "doc": "$fullDocument", "op": "$operationType"}}}],
    )
    .await;
    let mut with = watch(
        &coll,
        vec![doc! {"$replaceWith": {"_id": "$_id", "key": "$documentKey._id"}}],
    )
    .await;
    coll.insert_one(doc! {"_id": 7, "secret": "s", "v": 1})
        .await
        .unwrap();
    let e = next_event(&mut unset).await;
    assert!(!e.contains_key("ns") && !e.contains_key("wallTime"));
    assert_eq!(
        e.get_document("fullDocument").unwrap(),
        &doc! {"_id": 7, "v": 1}
    );
    let token = e.get_document("_id").unwrap().clone();
    let r = next_event(&mut replaced).await;
    assert_eq!(
        r,
        doc! {"_id": token.clone(), "doc": {"_id": 7, "secret": "s", "v": 1}, "op": "insert"}
    );
    let w = next_event(&mut with).await;
    assert_eq!(w, doc! {"_id": token, "key": 7});
    server.shutdown().await;
}

#[tokio::test]
async fn redact_prunes_and_descends() {
    let (server, client) = common::start().await;
    let coll = client.database("pipe").collection::<Document>("redact");
    let mut stream = watch(
        &coll,
        vec![doc! {"$redact": {"$cond": {
            "if": {"$eq": ["$level", "secret"]},
            "then": "$$PRUNE",
            "else": {"$cond": [{"$eq": ["$level", "public"]}, "$$KEEP", "$$DESCEND"]},
        }}}],
    )
    .await;
    coll.insert_one(doc! {
        "_id": 1,
        "a": {"level": "secret", "x": 1},
        "b": [{"level": "secret"}, {"k": 2}, 3],
        "c": {"level": "public", "inner": {"level": "secret"}},
    })
    .await
    .unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        e.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "b": [{"k": 2}, 3], "c": {"level": "public", "inner": {"level": "secret"}}}
    );
    // An event pruned at the top is not delivered.
    let mut top = watch(
        &coll,
        vec![doc! {"$redact": {"$cond": [{"$eq": ["$operationType", "delete"]}, "$$PRUNE", "$$KEEP"]}}],
    )
    .await;
    coll.delete_one(doc! {"_id": 1}).await.unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let e = next_event(&mut top).await;
    assert_eq!(e.get_str("operationType").unwrap(), "insert");
    server.shutdown().await;
}

#[tokio::test]
async fn every_stage_that_changes_the_token_is_fatal() {
    let (server, client) = common::start().await;
    let coll = client.database("pipe").collection::<Document>("fatal");
    let pipelines = [
        doc! {"$addFields": {"_id": 1}},
        doc! {"$set": {"_id._data": "x"}},
        doc! {"$unset": "_id"},
        doc! {"$replaceRoot": {"newRoot": "$fullDocument"}},
        doc! {"$replaceWith": {"a": 1}},
        doc! {"$redact": {"$cond": [{"$eq": [{"$type": "$_data"}, "string"]}, "$$PRUNE", "$$DESCEND"]}},
    ];
    let mut streams = Vec::new();
    for p in &pipelines {
        streams.push(watch(&coll, vec![p.clone()]).await);
    }
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    for (stream, p) in streams.iter_mut().zip(&pipelines) {
        let err = next_error(stream).await;
        let (code, name, _) = command_error(&err);
        assert_eq!(
            (code, name.as_str()),
            (280, "ChangeStreamFatalError"),
            "{p}"
        );
        assert!(err.contains_label("NonResumableChangeStreamError"));
    }
    server.shutdown().await;
}

#[tokio::test]
async fn unknown_disallowed_and_malformed_stages_get_mongodb_errors() {
    let (server, client) = common::start().await;
    let db = client.database("pipe");
    let cases: Vec<(Vec<Document>, i32, &str, &str)> = vec![
        (
            vec![doc! {"$frobnicate": {}}],
            40324,
            "Location40324",
            "Unrecognized pipeline stage name: '$frobnicate'",
        ),
        (
            vec![doc! {"$group": {"_id": null}}],
            20,
            "IllegalOperation",
            "$group is not permitted in a $changeStream pipeline",
        ),
        (
            vec![doc! {"$sort": {"a": 1}}, doc! {"$match": {}}],
            20,
            "IllegalOperation",
            "$sort is not permitted in a $changeStream pipeline",
        ),
        (
            vec![doc! {"$addFields": {"x": {"$frobnicate": 1}}}],
            168,
            "InvalidPipelineOperator",
            "Invalid $addFields :: caused by :: Unrecognized expression '$frobnicate'",
        ),
        (
            vec![doc! {"$project": {"x": {"$frobnicate": 1}}}],
            168,
            "InvalidPipelineOperator",
            "Invalid $project :: caused by :: Unrecognized expression '$frobnicate'",
        ),
        (
            vec![doc! {"$set": 5}],
            40272,
            "Location40272",
            "$set specification stage must be an object, got int",
        ),
        (
            vec![doc! {"$unset": 5}],
            31002,
            "Location31002",
            "$unset specification must be a string or an array",
        ),
        (
            vec![doc! {"$replaceRoot": {"root": "$a"}}],
            40415,
            "Location40415",
            "BSON field '$replaceRoot.root' is an unknown field.",
        ),
        (
            vec![doc! {"$redact": {"$eq": [1]}}],
            16020,
            "Location16020",
            "Expression $eq takes exactly 2 arguments. 1 were passed in.",
        ),
        (
            vec![doc! {"$set": {"x": "$$NOPE"}}],
            17276,
            "Location17276",
            "Invalid $set :: caused by :: Use of undefined variable: NOPE",
        ),
        (
            vec![doc! {"$match": {}, "$set": {"a": 1}}],
            40323,
            "Location40323",
            "A pipeline stage specification object must contain exactly one field.",
        ),
    ];
    for (stages, code, name, message) in cases {
        let mut pipeline = vec![Bson::Document(doc! {"$changeStream": {}})];
        pipeline.extend(stages.iter().cloned().map(Bson::Document));
        let err = db
            .run_command(doc! {"aggregate": "c", "pipeline": pipeline, "cursor": {}})
            .await
            .unwrap_err();
        let (got, got_name, text) = command_error(&err);
        assert_eq!(
            (got, got_name.as_str(), text.as_str()),
            (code, name, message),
            "{stages:?}"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn expression_errors_while_reading_events_fail_the_get_more() {
    let (server, client) = common::start().await;
    let coll = client.database("pipe").collection::<Document>("runtime");
    let cases = [
        (doc! {"$set": {"x": {"$add": ["$operationType", 1]}}}, 16554),
        (doc! {"$redact": "$operationType"}, 17053),
        (doc! {"$replaceWith": "$operationType"}, 40228),
        (
            doc! {"$set": {"x": {"$mod": ["$fullDocument.n", 0]}}},
            16610,
        ),
        (doc! {"$set": {"x": {"$toString": "$ns"}}}, 241),
    ];
    let mut streams = Vec::new();
    for (stage, _) in &cases {
        streams.push(watch(&coll, vec![stage.clone()]).await);
    }
    coll.insert_one(doc! {"_id": 1, "n": 3}).await.unwrap();
    for (stream, (stage, code)) in streams.iter_mut().zip(&cases) {
        let err = next_error(stream).await;
        assert_eq!(command_error(&err).0, *code, "{stage}");
    }
    // The server and its connections carry on.
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
    server.shutdown().await;
}
