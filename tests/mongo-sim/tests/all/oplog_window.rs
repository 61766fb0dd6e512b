//! `local.oplog.rs`: the window of retained history as operator tools read it, and
//! `replSetGetStatus`'s view of the current cluster time.

use crate::common;

use bson::{Bson, Document, Timestamp, doc};
use futures_util::TryStreamExt;
use mongo_sim::Config;
use mongodb::error::ErrorKind;
use mongodb::{Client, Collection};

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

fn oplog(client: &Client) -> Collection<Document> {
    client.database("local").collection("oplog.rs")
}

/// The oldest (`direction` 1) or newest (-1) oplog entry, projected on `ts` and `wall`, read
/// as operators read it.
async fn edge(client: &Client, direction: i32) -> Document {
    let found: Vec<Document> = oplog(client)
        .find(doc! {})
        .projection(doc! {"ts": 1, "wall": 1})
        .sort(doc! {"$natural": direction})
        .limit(1)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

/// Inserts `{_id: id}` into `test.c` and returns the write's cluster time.
async fn insert_at(client: &Client, id: i32) -> Timestamp {
    let reply = common::command(
        client,
        "test",
        doc! {"insert": "c", "documents": [{"_id": id}]},
    )
    .await;
    reply.get_timestamp("operationTime").unwrap()
}

async fn all_entries(client: &Client, filter: Document, direction: i32) -> Vec<Document> {
    oplog(client)
        .find(filter)
        .sort(doc! {"$natural": direction})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_empty_history_shows_one_no_op_at_the_current_cluster_time() {
    let (server, client) = common::start().await;
    let hello = common::command(&client, "admin", doc! {"hello": 1}).await;
    let now = hello.get_timestamp("operationTime").unwrap();
    let entries = all_entries(&client, doc! {}, 1).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].get_str("op").unwrap(), "n");
    assert_eq!(entries[0].get_timestamp("ts").unwrap(), now);
    assert_eq!(entries[0].get_i64("t").unwrap(), 1);
    let oldest = edge(&client, 1).await;
    let newest = edge(&client, -1).await;
    assert_eq!(oldest, newest);
    assert_eq!(
        oldest.keys().collect::<Vec<_>>(),
        vec!["ts", "wall"],
        "{oldest}"
    );
    assert_eq!(
        oldest.get_datetime("wall").unwrap().timestamp_millis(),
        i64::from(now.time) * 1000
    );
    server.shutdown().await;
}

#[tokio::test]
async fn the_oldest_and_newest_entries_are_the_first_and_last_writes() {
    let (server, client) = common::start().await;
    let coll = client.database("test").collection::<Document>("c");
    let mut stream = coll.watch().await.unwrap().with_type::<Document>();
    let mut times = Vec::new();
    for id in 0..3 {
        times.push(insert_at(&client, id).await);
    }
    // The change events carry the same cluster times.
    for (id, ts) in times.iter().enumerate() {
        let event = common::next_event(&mut stream).await;
        assert_eq!(event.get_timestamp("clusterTime").unwrap(), *ts, "{id}");
    }
    let oldest = edge(&client, 1).await;
    let newest = edge(&client, -1).await;
    assert_eq!(oldest.get_timestamp("ts").unwrap(), times[0]);
    assert_eq!(newest.get_timestamp("ts").unwrap(), times[2]);
    assert!(oldest.get_datetime("wall").is_ok());
    assert!(
        newest.get_datetime("wall").unwrap().timestamp_millis() / 1000 >= i64::from(times[2].time)
    );
    // The newest entry is the current cluster time.
    let hello = common::command(&client, "admin", doc! {"hello": 1}).await;
    assert_eq!(
        hello
            .get_document("$clusterTime")
            .unwrap()
            .get_timestamp("clusterTime")
            .unwrap(),
        times[2]
    );
    // The whole oplog: the collection's creation, then the inserts.
    let entries = all_entries(&client, doc! {}, 1).await;
    let ops: Vec<&str> = entries.iter().map(|e| e.get_str("op").unwrap()).collect();
    assert_eq!(ops, ["c", "i", "i", "i"]);
    assert_eq!(entries[0].get_str("ns").unwrap(), "test.$cmd");
    assert_eq!(
        entries[0]
            .get_document("o")
            .unwrap()
            .get_str("create")
            .unwrap(),
        "c"
    );
    for (entry, id) in entries[1..].iter().zip(0..) {
        assert_eq!(entry.get_str("ns").unwrap(), "test.c");
        assert_eq!(entry.get_document("o").unwrap(), &doc! {"_id": id});
        assert!(matches!(entry.get("ui"), Some(Bson::Binary(_))));
        assert_eq!(entry.get_i64("t").unwrap(), 1);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn eviction_moves_the_oldest_entry_forward() {
    let (server, client) = common::start_with(Config {
        history_limit: 3,
        ..Config::default()
    })
    .await;
    let mut times = Vec::new();
    for id in 0..2 {
        times.push(insert_at(&client, id).await);
    }
    // create + two inserts: all retained.
    assert_eq!(
        edge(&client, 1).await.get_timestamp("ts").unwrap(),
        times[0]
    );
    for id in 2..6 {
        times.push(insert_at(&client, id).await);
        // Only the last three writes remain: the window starts at the third newest.
        let oldest = edge(&client, 1).await.get_timestamp("ts").unwrap();
        assert_eq!(oldest, times[times.len() - 3], "after insert {id}");
        let newest = edge(&client, -1).await.get_timestamp("ts").unwrap();
        assert_eq!(newest, *times.last().unwrap());
    }
    let entries = all_entries(&client, doc! {}, 1).await;
    let ids: Vec<i32> = entries
        .iter()
        .map(|e| e.get_document("o").unwrap().get_i32("_id").unwrap())
        .collect();
    assert_eq!(ids, [3, 4, 5]);
    server.shutdown().await;
}

#[tokio::test]
async fn a_filter_on_ts_and_reverse_order() {
    let (server, client) = common::start().await;
    let mut times = Vec::new();
    for id in 0..5 {
        times.push(insert_at(&client, id).await);
    }
    let since: Vec<Timestamp> = all_entries(&client, doc! {"ts": {"$gte": times[2]}}, 1)
        .await
        .iter()
        .map(|e| e.get_timestamp("ts").unwrap())
        .collect();
    assert_eq!(since, &times[2..]);
    let after: Vec<Timestamp> = all_entries(&client, doc! {"ts": {"$gt": times[2]}}, -1)
        .await
        .iter()
        .map(|e| e.get_timestamp("ts").unwrap())
        .collect();
    assert_eq!(after, [times[4], times[3]]);
    let between = all_entries(
        &client,
        doc! {"ts": {"$gt": times[0], "$lte": times[2]}, "op": "i"},
        1,
    )
    .await;
    assert_eq!(between.len(), 2);
    // A raw find with a limit and sort on ts (the same order) and an exact time.
    let reply = common::command(
        &client,
        "local",
        doc! {"find": "oplog.rs", "filter": {"ts": times[3]}, "sort": {"ts": -1}, "limit": 1},
    )
    .await;
    let batch = reply
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch.len(), 1);
    let only = batch[0].as_document().unwrap();
    assert_eq!(only.get_timestamp("ts").unwrap(), times[3]);
    assert_eq!(
        only.get_document("o").unwrap().get_i32("_id").unwrap(),
        3,
        "{only}"
    );
    assert_eq!(
        oplog(&client)
            .count_documents(doc! {"op": "i"})
            .await
            .unwrap(),
        5
    );
    // The collection's creation and the five inserts.
    assert_eq!(oplog(&client).estimated_document_count().await.unwrap(), 6);
    server.shutdown().await;
}

#[tokio::test]
async fn entries_describe_updates_deletes_transactions_and_commands() {
    let (server, client) = common::start().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "a": 1, "b": 1})
        .await
        .unwrap();
    let start = edge(&client, -1).await.get_timestamp("ts").unwrap();
    coll.update_one(
        doc! {"_id": 1},
        doc! {"$set": {"a": 2}, "$unset": {"b": ""}},
    )
    .await
    .unwrap();
    coll.replace_one(doc! {"_id": 1}, doc! {"x": 1})
        .await
        .unwrap();
    coll.delete_one(doc! {"_id": 1}).await.unwrap();
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    coll.insert_one(doc! {"_id": 2})
        .session(&mut session)
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 3})
        .session(&mut session)
        .await
        .unwrap();
    session.commit_transaction().await.unwrap();
    coll.drop().await.unwrap();
    let entries = all_entries(&client, doc! {"ts": {"$gt": start}}, 1).await;
    let ops: Vec<&str> = entries.iter().map(|e| e.get_str("op").unwrap()).collect();
    assert_eq!(ops, ["u", "u", "d", "c", "c"], "{entries:?}");
    let update = &entries[0];
    assert_eq!(update.get_document("o2").unwrap(), &doc! {"_id": 1});
    assert_eq!(
        update.get_document("o").unwrap(),
        &doc! {"$v": 2, "diff": {"u": {"a": 2}, "d": {"b": false}}}
    );
    assert_eq!(
        entries[1].get_document("o").unwrap(),
        &doc! {"_id": 1, "x": 1}
    );
    assert_eq!(entries[2].get_document("o").unwrap(), &doc! {"_id": 1});
    let txn = &entries[3];
    assert_eq!(txn.get_str("ns").unwrap(), "admin.$cmd");
    assert!(txn.get_document("lsid").is_ok());
    assert!(txn.get_i64("txnNumber").is_ok());
    let ops = txn
        .get_document("o")
        .unwrap()
        .get_array("applyOps")
        .unwrap();
    let inner: Vec<&Document> = ops.iter().map(|o| o.as_document().unwrap()).collect();
    assert_eq!(inner.len(), 2);
    assert_eq!(inner[0].get_str("op").unwrap(), "i");
    assert_eq!(inner[1].get_document("o").unwrap(), &doc! {"_id": 3});
    assert_eq!(entries[4].get_str("ns").unwrap(), "test.$cmd");
    assert_eq!(entries[4].get_document("o").unwrap(), &doc! {"drop": "c"});
    // Entries keep MongoDB's field order.
    assert_eq!(
        update.keys().collect::<Vec<_>>(),
        ["op", "ns", "ui", "o", "o2", "ts", "t", "v", "wall"]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn writes_to_the_oplog_are_refused() {
    let (server, client) = common::start().await;
    let oplog = oplog(&client);
    let err = oplog.insert_one(doc! {"op": "n"}).await.unwrap_err();
    assert_eq!(code_of(&err), Some(73), "{err}");
    let err = oplog.delete_many(doc! {}).await.unwrap_err();
    assert_eq!(code_of(&err), Some(73), "{err}");
    let err = oplog
        .update_many(doc! {}, doc! {"$set": {"x": 1}})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(73), "{err}");
    let err = oplog.drop().await.unwrap_err();
    assert_eq!(code_of(&err), Some(73), "{err}");
    // Nothing was written: still the single no-op.
    let entries = all_entries(&client, doc! {}, 1).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].get_str("op").unwrap(), "n");
    server.shutdown().await;
}

#[tokio::test]
async fn repl_set_get_status_reports_the_current_cluster_time() {
    let (server, client) = common::start().await;
    let ts = insert_at(&client, 1).await;
    let status = common::command(&client, "admin", doc! {"replSetGetStatus": 1}).await;
    let committed = status
        .get_document("optimes")
        .unwrap()
        .get_document("lastCommittedOpTime")
        .unwrap();
    assert_eq!(committed.get_timestamp("ts").unwrap(), ts);
    assert_eq!(committed.get_i64("t").unwrap(), 1);
    let member = status.get_array("members").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(
        member
            .get_datetime("optimeDate")
            .unwrap()
            .timestamp_millis(),
        i64::from(ts.time) * 1000
    );
    assert_eq!(
        member
            .get_document("optime")
            .unwrap()
            .get_timestamp("ts")
            .unwrap(),
        ts
    );
    assert_eq!(status.get_timestamp("operationTime").unwrap(), ts);
    let newest = edge(&client, -1).await.get_timestamp("ts").unwrap();
    assert_eq!(newest, ts);
    server.shutdown().await;
}
