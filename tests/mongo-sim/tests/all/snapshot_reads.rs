//! Reads outside a transaction at a cluster time: `readConcern: {level: "snapshot",
//! atClusterTime?}` on `find`, `aggregate` and `distinct`, and the driver's snapshot sessions.

use crate::common;

use std::time::Duration;

use bson::{Bson, Document, Timestamp, doc};
use futures_util::TryStreamExt;
use mongo_sim::Config;
use mongodb::Client;
use mongodb::error::ErrorKind;

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

/// Runs a write command on `test` and returns its cluster time.
async fn write(client: &Client, cmd: Document) -> Timestamp {
    common::command(client, "test", cmd)
        .await
        .get_timestamp("operationTime")
        .unwrap()
}

fn snapshot_at(at: Timestamp) -> Document {
    doc! {"level": "snapshot", "atClusterTime": at}
}

/// A raw `find` on `test.c` with this read concern: the first batch's documents, the cursor id
/// and the cursor's `atClusterTime`.
async fn find_at(
    client: &Client,
    read_concern: Document,
    extra: Document,
) -> mongodb::error::Result<(Vec<Document>, i64, Option<Timestamp>)> {
    let mut cmd = doc! {"find": "c", "filter": {}, "readConcern": read_concern};
    cmd.extend(extra);
    let reply = client.database("test").run_command(cmd).await?;
    let cursor = reply.get_document("cursor").unwrap();
    let docs = cursor
        .get_array("firstBatch")
        .unwrap()
        .iter()
        .map(|d| d.as_document().unwrap().clone())
        .collect();
    Ok((
        docs,
        cursor.get_i64("id").unwrap(),
        cursor.get_timestamp("atClusterTime").ok(),
    ))
}

async fn docs_at(client: &Client, at: Timestamp) -> Vec<Document> {
    let (docs, id, reported) = find_at(client, snapshot_at(at), doc! {}).await.unwrap();
    assert_eq!(id, 0);
    assert_eq!(reported, Some(at));
    docs
}

#[tokio::test]
async fn a_read_at_a_cluster_time_sees_the_data_as_it_was() {
    let (server, client) = common::start().await;
    let t1 = write(
        &client,
        doc! {"insert": "c", "documents": [{"_id": 1, "v": 1}]},
    )
    .await;
    let t2 = write(
        &client,
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"v": 2}}}]},
    )
    .await;
    let t3 = write(
        &client,
        doc! {"insert": "c", "documents": [{"_id": 2, "v": 1}]},
    )
    .await;
    let t4 = write(
        &client,
        doc! {"delete": "c", "deletes": [{"q": {"_id": 1}, "limit": 1}]},
    )
    .await;
    let t5 = write(
        &client,
        doc! {"update": "c", "updates": [{"q": {"_id": 2}, "u": {"_id": 2, "v": 9}}]},
    )
    .await;
    assert_eq!(docs_at(&client, t1).await, [doc! {"_id": 1, "v": 1}]);
    assert_eq!(docs_at(&client, t2).await, [doc! {"_id": 1, "v": 2}]);
    assert_eq!(
        docs_at(&client, t3).await,
        [doc! {"_id": 1, "v": 2}, doc! {"_id": 2, "v": 1}]
    );
    // The deleted document is still there before its deletion, gone after.
    assert_eq!(docs_at(&client, t4).await, [doc! {"_id": 2, "v": 1}]);
    assert_eq!(docs_at(&client, t5).await, [doc! {"_id": 2, "v": 9}]);
    // Before the first write the collection was empty.
    let before = Timestamp {
        time: t1.time,
        increment: t1.increment - 1,
    };
    assert!(docs_at(&client, before).await.is_empty());
    // A filter and a lookup by _id read the same snapshot.
    let (by_id, _, _) = find_at(&client, snapshot_at(t3), doc! {"filter": {"_id": 1}})
        .await
        .unwrap();
    assert_eq!(by_id, [doc! {"_id": 1, "v": 2}]);
    let (matching, _, _) = find_at(&client, snapshot_at(t4), doc! {"filter": {"v": 1}})
        .await
        .unwrap();
    assert_eq!(matching, [doc! {"_id": 2, "v": 1}]);
    // The current state is unaffected.
    let now: Vec<Document> = client
        .database("test")
        .collection::<Document>("c")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(now, [doc! {"_id": 2, "v": 9}]);
    server.shutdown().await;
}

#[tokio::test]
async fn aggregate_and_distinct_read_the_snapshot() {
    let (server, client) = common::start().await;
    let t1 = write(
        &client,
        doc! {"insert": "c", "documents": [{"_id": 1, "k": "a"}, {"_id": 2, "k": "b"}]},
    )
    .await;
    write(
        &client,
        doc! {"delete": "c", "deletes": [{"q": {}, "limit": 0}]},
    )
    .await;
    write(
        &client,
        doc! {"insert": "c", "documents": [{"_id": 3, "k": "z"}]},
    )
    .await;
    let reply = common::command(
        &client,
        "test",
        doc! {
            "aggregate": "c",
            "pipeline": [{"$match": {"k": {"$in": ["a", "b", "z"]}}}, {"$count": "n"}],
            "cursor": {},
            "readConcern": snapshot_at(t1),
        },
    )
    .await;
    let cursor = reply.get_document("cursor").unwrap();
    assert_eq!(cursor.get_timestamp("atClusterTime").unwrap(), t1);
    assert_eq!(
        cursor.get_array("firstBatch").unwrap(),
        &vec![Bson::Document(doc! {"n": 2})]
    );
    let reply = common::command(
        &client,
        "test",
        doc! {"distinct": "c", "key": "k", "readConcern": snapshot_at(t1)},
    )
    .await;
    assert_eq!(
        reply.get_array("values").unwrap(),
        &vec![Bson::from("a"), Bson::from("b")]
    );
    assert_eq!(reply.get_timestamp("atClusterTime").unwrap(), t1);
    server.shutdown().await;
}

#[tokio::test]
async fn snapshot_without_a_time_reads_now_and_reports_the_time() {
    let (server, client) = common::start().await;
    let t1 = write(&client, doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    let (docs, _, at) = find_at(&client, doc! {"level": "snapshot"}, doc! {})
        .await
        .unwrap();
    assert_eq!(docs, [doc! {"_id": 1}]);
    assert_eq!(at, Some(t1));
    // Other read concerns read the current state and report no snapshot time.
    let (docs, _, at) = find_at(&client, doc! {"level": "majority"}, doc! {})
        .await
        .unwrap();
    assert_eq!(docs, [doc! {"_id": 1}]);
    assert_eq!(at, None);
    let err = find_at(
        &client,
        doc! {"level": "majority", "atClusterTime": t1},
        doc! {},
    )
    .await
    .unwrap_err();
    assert_eq!(code_of(&err), Some(72), "{err}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_time_older_than_the_retained_history_is_snapshot_too_old() {
    let (server, client) = common::start().await;
    write(&client, doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    // Before the server started: nothing is retained from then.
    let err = find_at(
        &client,
        snapshot_at(Timestamp {
            time: 1,
            increment: 1,
        }),
        doc! {},
    )
    .await
    .unwrap_err();
    assert_eq!(code_of(&err), Some(239), "{err}");
    match &*err.kind {
        ErrorKind::Command(c) => {
            assert_eq!(c.code_name, "SnapshotTooOld");
            assert!(
                c.message
                    .contains("older than the oldest available timestamp")
            );
        }
        other => panic!("{other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn without_snapshot_history_only_the_current_state_is_readable() {
    let (server, client) = common::start_with(Config {
        snapshot_history: Duration::ZERO,
        ..Config::default()
    })
    .await;
    let t1 = write(
        &client,
        doc! {"insert": "c", "documents": [{"_id": 1, "v": 1}]},
    )
    .await;
    assert_eq!(docs_at(&client, t1).await, [doc! {"_id": 1, "v": 1}]);
    let t2 = write(
        &client,
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"v": 2}}}]},
    )
    .await;
    let err = find_at(&client, snapshot_at(t1), doc! {})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(239), "{err}");
    assert_eq!(docs_at(&client, t2).await, [doc! {"_id": 1, "v": 2}]);
    // Nothing is kept for later pruning.
    let status = common::command(&client, "admin", doc! {"serverStatus": 1}).await;
    let history = status.get_document("snapshotHistory").unwrap();
    assert_eq!(history.get_i64("commits").unwrap(), 1);
    assert_eq!(history.get_i64("pendingPrune").unwrap(), 0);
    assert_eq!(history.get_timestamp("oldestTimestamp").unwrap(), t2);
    server.shutdown().await;
}

#[tokio::test]
async fn a_time_in_the_future_is_refused() {
    let (server, client) = common::start().await;
    let t1 = write(&client, doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    let later = Timestamp {
        time: t1.time + 3600,
        increment: 1,
    };
    let err = find_at(&client, snapshot_at(later), doc! {})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(72), "{err}");
    match &*err.kind {
        ErrorKind::Command(c) => assert!(
            c.message
                .contains("must not be greater than the current clusterTime"),
            "{}",
            c.message
        ),
        other => panic!("{other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn get_more_continues_in_the_snapshot() {
    let (server, client) = common::start().await;
    let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i, "v": 1}).collect();
    let t1 = write(&client, doc! {"insert": "c", "documents": docs}).await;
    write(
        &client,
        doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"v": 2}}, "multi": true}]},
    )
    .await;
    let (first, id, at) = find_at(&client, snapshot_at(t1), doc! {"batchSize": 2})
        .await
        .unwrap();
    assert_eq!(at, Some(t1));
    assert_eq!(first.len(), 2);
    assert_ne!(id, 0);
    // Writes between the batches do not show either.
    write(
        &client,
        doc! {"delete": "c", "deletes": [{"q": {"_id": {"$gte": 3}}, "limit": 0}]},
    )
    .await;
    let mut rest = Vec::new();
    let mut id = id;
    while id != 0 {
        let reply = common::command(
            &client,
            "test",
            doc! {"getMore": id, "collection": "c", "batchSize": 2},
        )
        .await;
        let cursor = reply.get_document("cursor").unwrap();
        assert_eq!(cursor.get_timestamp("atClusterTime").unwrap(), t1);
        for d in cursor.get_array("nextBatch").unwrap() {
            rest.push(d.as_document().unwrap().clone());
        }
        id = cursor.get_i64("id").unwrap();
    }
    let all: Vec<Document> = first.into_iter().chain(rest).collect();
    let expected: Vec<Document> = (0..5).map(|i| doc! {"_id": i, "v": 1}).collect();
    assert_eq!(all, expected);
    // The driver's cursor over the raw command pages through the same snapshot.
    let cursor = client
        .database("test")
        .run_cursor_command(doc! {"find": "c", "batchSize": 1, "readConcern": snapshot_at(t1)})
        .await
        .unwrap();
    let through_driver: Vec<Document> = cursor.try_collect().await.unwrap();
    assert_eq!(through_driver, expected);
    server.shutdown().await;
}

#[tokio::test]
async fn driver_snapshot_sessions_read_one_snapshot() {
    let (server, client) = common::start().await;
    let coll = client.database("test").collection::<Document>("c");
    let t1 = write(
        &client,
        doc! {"insert": "c", "documents": [{"_id": 1, "v": 1}]},
    )
    .await;
    let mut session = client.start_session().snapshot(true).await.unwrap();
    let first: Vec<Document> = coll
        .find(doc! {})
        .session(&mut session)
        .await
        .unwrap()
        .stream(&mut session)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(first, [doc! {"_id": 1, "v": 1}]);
    assert_eq!(session.snapshot_time(), Some(t1));
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 2}})
        .await
        .unwrap();
    // The session's later reads stay at its snapshot.
    let again: Vec<Document> = coll
        .find(doc! {})
        .session(&mut session)
        .await
        .unwrap()
        .stream(&mut session)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(again, [doc! {"_id": 1, "v": 1}]);
    let n = coll
        .count_documents(doc! {"v": 1})
        .session(&mut session)
        .await
        .unwrap();
    assert_eq!(n, 1);
    // A session can be opened at a chosen time.
    let mut at_t1 = client
        .start_session()
        .snapshot(true)
        .snapshot_time(t1)
        .await
        .unwrap();
    let old = coll
        .find_one(doc! {"_id": 1})
        .session(&mut at_t1)
        .await
        .unwrap();
    assert_eq!(old, Some(doc! {"_id": 1, "v": 1}));
    server.shutdown().await;
}

#[tokio::test]
async fn deleted_documents_kept_for_earlier_reads_leave_a_collection_empty() {
    let (server, client) = common::start().await;
    let coll = client.database("test").collection::<Document>("c");
    let t1 = write(&client, doc! {"insert": "c", "documents": [{"_id": 1}]}).await;
    coll.delete_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(docs_at(&client, t1).await, [doc! {"_id": 1}]);
    assert_eq!(coll.estimated_document_count().await.unwrap(), 0);
    // Index builds on an empty collection are one event per index.
    let mut stream = coll
        .watch()
        .show_expanded_events(true)
        .max_await_time(Duration::from_millis(100))
        .await
        .unwrap()
        .with_type::<Document>();
    common::command(
        &client,
        "test",
        doc! {"createIndexes": "c", "indexes": [
            {"key": {"a": 1}, "name": "a_1"},
            {"key": {"b": 1}, "name": "b_1"},
        ]},
    )
    .await;
    for name in ["a_1", "b_1"] {
        let built = common::next_event(&mut stream).await;
        assert_eq!(built.get_str("operationType").unwrap(), "createIndexes");
        let indexes = built
            .get_document("operationDescription")
            .unwrap()
            .get_array("indexes")
            .unwrap();
        assert_eq!(indexes.len(), 1);
        assert_eq!(
            indexes[0].as_document().unwrap().get_str("name").unwrap(),
            name
        );
    }
    server.shutdown().await;
}
