//! `showExpandedEvents`: DDL events (`create`, `createIndexes`, `dropIndexes`, `modify`),
//! `collectionUUID`, `operationDescription` and `updateDescription.disambiguatedPaths`.

use crate::common;

use std::time::Duration;

use bson::{Bson, Document, doc};
use common::{command, next_event};
use mongo_sim::Config;
use mongodb::change_stream::ChangeStream;
use mongodb::error::ErrorKind;
use mongodb::{Client, Database};

async fn watch_db(db: &Database, expanded: bool) -> ChangeStream<Document> {
    db.watch()
        .show_expanded_events(expanded)
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>()
}

async fn uuid_of(client: &Client, db: &str, coll: &str) -> Bson {
    let reply = command(
        client,
        db,
        doc! {"listCollections": 1, "filter": {"name": coll}},
    )
    .await;
    reply
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()[0]
        .as_document()
        .unwrap()
        .get_document("info")
        .unwrap()
        .get("uuid")
        .unwrap()
        .clone()
}

/// Runs the same DDL and writes: create (with images), an index, collMod, dropIndexes, an
/// insert, a rename and a drop.
async fn ddl_script(client: &Client) {
    command(
        client,
        "ddl",
        doc! {"create": "c", "changeStreamPreAndPostImages": {"enabled": true}},
    )
    .await;
    command(
        client,
        "ddl",
        doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}]},
    )
    .await;
    command(
        client,
        "ddl",
        doc! {"collMod": "c", "changeStreamPreAndPostImages": {"enabled": false}},
    )
    .await;
    command(client, "ddl", doc! {"dropIndexes": "c", "index": "a_1"}).await;
    client
        .database("ddl")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    command(
        client,
        "admin",
        doc! {"renameCollection": "ddl.c", "to": "ddl.d"},
    )
    .await;
    command(client, "ddl", doc! {"drop": "d"}).await;
}

#[tokio::test]
async fn ddl_events_with_show_expanded_events() {
    let (server, client) = common::start().await;
    let db = client.database("ddl");
    let mut stream = watch_db(&db, true).await;
    ddl_script(&client).await;
    let mut events = Vec::new();
    for _ in 0..7 {
        events.push(next_event(&mut stream).await);
    }
    let ops: Vec<&str> = events
        .iter()
        .map(|e| e.get_str("operationType").unwrap())
        .collect();
    assert_eq!(
        ops,
        [
            "create",
            "createIndexes",
            "modify",
            "dropIndexes",
            "insert",
            "rename",
            "drop"
        ]
    );
    let uuid = events[0].get("collectionUUID").unwrap().clone();
    assert!(matches!(uuid, Bson::Binary(_)));
    for e in &events {
        assert_eq!(e.get("collectionUUID"), Some(&uuid), "{e}");
        let keys: Vec<&str> = e.keys().map(String::as_str).collect();
        assert_eq!(
            &keys[..5],
            [
                "_id",
                "operationType",
                "clusterTime",
                "collectionUUID",
                "wallTime"
            ]
        );
    }
    let create = &events[0];
    assert_eq!(
        create.get_document("ns").unwrap(),
        &doc! {"db": "ddl", "coll": "c"}
    );
    assert_eq!(
        create.get_document("operationDescription").unwrap(),
        &doc! {
            "changeStreamPreAndPostImages": {"enabled": true},
            "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"},
        }
    );
    assert!(!create.contains_key("documentKey"));
    assert_eq!(
        events[1].get_document("operationDescription").unwrap(),
        &doc! {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}
    );
    let modify = &events[2];
    assert_eq!(
        modify.get_document("operationDescription").unwrap(),
        &doc! {"changeStreamPreAndPostImages": {"enabled": false}}
    );
    assert_eq!(
        modify.get_document("stateBeforeChange").unwrap(),
        &doc! {"collectionOptions": {"uuid": uuid.clone(), "changeStreamPreAndPostImages": {"enabled": true}}}
    );
    assert_eq!(
        events[3].get_document("operationDescription").unwrap(),
        &doc! {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}
    );
    assert!(!events[4].contains_key("operationDescription"));
    let rename = &events[5];
    assert_eq!(
        rename.get_document("to").unwrap(),
        &doc! {"db": "ddl", "coll": "d"}
    );
    assert_eq!(
        rename.get_document("operationDescription").unwrap(),
        &doc! {"to": {"db": "ddl", "coll": "d"}}
    );
    assert_eq!(
        events[6].get_document("ns").unwrap(),
        &doc! {"db": "ddl", "coll": "d"}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn without_the_flag_only_classic_events_are_sent() {
    let (server, client) = common::start().await;
    let db = client.database("ddl");
    let mut stream = watch_db(&db, false).await;
    ddl_script(&client).await;
    let insert = next_event(&mut stream).await;
    assert_eq!(insert.get_str("operationType").unwrap(), "insert");
    assert!(!insert.contains_key("collectionUUID"));
    assert_eq!(
        next_event(&mut stream)
            .await
            .get_str("operationType")
            .unwrap(),
        "rename"
    );
    assert_eq!(
        next_event(&mut stream)
            .await
            .get_str("operationType")
            .unwrap(),
        "drop"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_first_write_reports_the_collection_it_creates() {
    let (server, client) = common::start().await;
    let coll = client.database("ddl").collection::<Document>("implicit");
    // A stream on a collection that does not exist yet.
    let mut stream = coll
        .watch()
        .show_expanded_events(true)
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let create = next_event(&mut stream).await;
    assert_eq!(create.get_str("operationType").unwrap(), "create");
    assert_eq!(
        create.get_document("operationDescription").unwrap(),
        &doc! {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    );
    assert_eq!(
        create.get("collectionUUID"),
        Some(&uuid_of(&client, "ddl", "implicit").await)
    );
    for id in [1, 2] {
        let insert = next_event(&mut stream).await;
        assert_eq!(
            insert.get_document("documentKey").unwrap(),
            &doc! {"_id": id}
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn index_builds_on_a_non_empty_collection_commit_together_and_drops_are_one_each() {
    let (server, client) = common::start().await;
    let coll = client.database("ddl").collection::<Document>("idx");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let mut stream = coll
        .watch()
        .show_expanded_events(true)
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    command(
        &client,
        "ddl",
        doc! {"createIndexes": "idx", "indexes": [
            {"key": {"a": 1}, "name": "a_1"},
            {"key": {"b": -1}, "name": "b_-1"},
        ]},
    )
    .await;
    command(&client, "ddl", doc! {"dropIndexes": "idx", "index": "*"}).await;
    let built = next_event(&mut stream).await;
    assert_eq!(built.get_str("operationType").unwrap(), "createIndexes");
    assert_eq!(
        built
            .get_document("operationDescription")
            .unwrap()
            .get_array("indexes")
            .unwrap()
            .len(),
        2
    );
    for name in ["a_1", "b_-1"] {
        let dropped = next_event(&mut stream).await;
        assert_eq!(dropped.get_str("operationType").unwrap(), "dropIndexes");
        let indexes = dropped
            .get_document("operationDescription")
            .unwrap()
            .get_array("indexes")
            .unwrap();
        assert_eq!(
            indexes[0].as_document().unwrap().get_str("name").unwrap(),
            name
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn disambiguated_paths_come_with_expanded_events_from_7_0() {
    for (wire, expected) in [(25, true), (21, true), (17, false)] {
        let (server, client) = common::start_with(Config {
            max_wire_version: wire,
            ..Config::default()
        })
        .await;
        let coll = client.database("ddl").collection::<Document>("paths");
        coll.insert_one(doc! {"_id": 1, "a": {}, "b": 0})
            .await
            .unwrap();
        let mut expanded = coll
            .watch()
            .show_expanded_events(true)
            .max_await_time(Duration::from_millis(100))
            .await
            .unwrap()
            .with_type::<Document>();
        let mut classic = coll
            .watch()
            .max_await_time(Duration::from_millis(100))
            .await
            .unwrap()
            .with_type::<Document>();
        coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a.0": 1, "b": 1}})
            .await
            .unwrap();
        let e = next_event(&mut expanded).await;
        let description = e.get_document("updateDescription").unwrap();
        assert_eq!(
            description.get_document("updatedFields").unwrap(),
            &doc! {"a.0": 1, "b": 1}
        );
        if expected {
            assert_eq!(
                description.get_document("disambiguatedPaths").unwrap(),
                &doc! {"a.0": ["a", "0"]},
                "wire {wire}"
            );
        } else {
            assert!(
                !description.contains_key("disambiguatedPaths"),
                "wire {wire}"
            );
        }
        let c = next_event(&mut classic).await;
        assert!(
            !c.get_document("updateDescription")
                .unwrap()
                .contains_key("disambiguatedPaths")
        );
        server.shutdown().await;
    }
}

#[tokio::test]
async fn show_expanded_events_must_be_a_boolean() {
    let (server, client) = common::start().await;
    let err = client
        .database("ddl")
        .run_command(doc! {"aggregate": 1, "pipeline": [{"$changeStream": {"showExpandedEvents": "yes"}}], "cursor": {}})
        .await
        .unwrap_err();
    match &*err.kind {
        ErrorKind::Command(c) => {
            assert_eq!(c.code, 14);
            assert_eq!(
                c.message,
                "BSON field '$changeStream.showExpandedEvents' is the wrong type 'string', expected type 'bool'"
            );
        }
        other => panic!("{other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn ddl_in_a_transaction_is_reported_when_it_commits_and_not_if_it_aborts() {
    let (server, client) = common::start().await;
    let db = client.database("ddl");
    let mut stream = watch_db(&db, true).await;
    let mut s = client.start_session().await.unwrap();

    // Explicitly with an index, and implicitly by a first insert: all with the commit.
    s.start_transaction().await.unwrap();
    db.create_collection("c").session(&mut s).await.unwrap();
    db.collection::<Document>("c")
        .create_index(mongodb::IndexModel::builder().keys(doc! {"x": 1}).build())
        .session(&mut s)
        .await
        .unwrap();
    db.collection::<Document>("d")
        .insert_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap();
    s.commit_transaction().await.unwrap();

    // Created and gone again: no event.
    s.start_transaction().await.unwrap();
    db.create_collection("e").session(&mut s).await.unwrap();
    db.collection::<Document>("f")
        .insert_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap();
    s.abort_transaction().await.unwrap();

    db.collection::<Document>("marker")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let e = next_event(&mut stream).await;
        let coll = e
            .get_document("ns")
            .unwrap()
            .get_str("coll")
            .unwrap()
            .to_string();
        let in_txn = e.contains_key("txnNumber");
        seen.push((
            e.get_str("operationType").unwrap().to_string(),
            coll,
            in_txn,
        ));
    }
    let expected: Vec<(String, String, bool)> = [
        ("create", "c", true),
        ("createIndexes", "c", true),
        ("create", "d", true),
        ("insert", "d", true),
        ("create", "marker", false),
        ("insert", "marker", false),
    ]
    .into_iter()
    .map(|(op, c, t)| (op.to_string(), c.to_string(), t))
    .collect();
    assert_eq!(seen, expected);
    server.shutdown().await;
}

#[tokio::test]
async fn a_view_is_reported_by_its_definition() {
    let (server, client) = common::start().await;
    let db = client.database("ddl");
    let mut stream = watch_db(&db, true).await;
    command(
        &client,
        "ddl",
        doc! {"create": "v", "viewOn": "c", "pipeline": [{"$match": {"a": 1}}]},
    )
    .await;
    let e = next_event(&mut stream).await;
    assert_eq!(e.get_str("operationType").unwrap(), "create");
    assert_eq!(
        e.get_document("operationDescription").unwrap(),
        &doc! {"viewOn": "c", "pipeline": [{"$match": {"a": 1}}]}
    );
    // A view has no UUID.
    assert!(!e.contains_key("collectionUUID"), "{e}");
    server.shutdown().await;
}

#[tokio::test]
async fn update_descriptions_index_into_arrays_where_the_update_reaches() {
    let (server, client) = common::start().await;
    let coll = client.database("ddl").collection::<Document>("arrays");
    coll.insert_one(doc! {"_id": 1, "a": [{"1": 1}], "obj": {"sub.obj": [[1, 2], 3]}, "n": [1, 2]})
        .await
        .unwrap();
    let mut stream = coll
        .watch()
        .show_expanded_events(true)
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();

    // An operator path into an array element: reported there, the index an integer.
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a.0.1": 2, "n": [1]}})
        .await
        .unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        e.get_document("updateDescription").unwrap(),
        &doc! {
            "updatedFields": {"a.0.1": 2, "n": [1]},
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {"a.0.1": ["a", 0, "1"]},
        }
    );

    // A pipeline-style update: the difference, shortened arrays with their paths disambiguated.
    coll.update_one(
        doc! {"_id": 1},
        vec![doc! {"$set": {"obj": {"$literal": {"sub.obj": [[1], 4]}}}}],
    )
    .await
    .unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        e.get_document("updateDescription").unwrap(),
        &doc! {
            "updatedFields": {"obj.sub.obj.1": 4},
            "removedFields": [],
            "truncatedArrays": [{"field": "obj.sub.obj.0", "newSize": 1}],
            "disambiguatedPaths": {
                "obj.sub.obj.0": ["obj", "sub.obj", 0],
                "obj.sub.obj.1": ["obj", "sub.obj", 1],
            },
        }
    );
    server.shutdown().await;
}
