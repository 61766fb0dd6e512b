//! Sharded-cluster mode (`Config { shards: K, .. }`): the server answers as a `mongos` in front
//! of K shards, each with its own history; change streams merge the shards' histories and
//! report only what every shard has applied past.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{Bson, Document, Timestamp, doc};
use common::{command, next_event, token_doc, token_hex, token_of};
use mongo_sim::{Config, ServerHandle};
use mongodb::Client;
use mongodb::error::ErrorKind;
use mongodb::event::EventHandler;
use mongodb::event::sdam::{SdamEvent, TopologyType};
use mongodb::options::ClientOptions;

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

fn sharded(shards: usize, noop: Duration) -> Config {
    Config {
        shards,
        noop_interval: noop,
        ..Config::default()
    }
}

/// A two-shard cluster whose idle shards write a no-op every 50 ms.
async fn start_two() -> (ServerHandle, Client) {
    common::start_with(sharded(2, Duration::from_millis(50))).await
}

async fn run(client: &Client, db: &str, cmd: Document) -> Result<Document, mongodb::error::Error> {
    client.database(db).run_command(cmd).await
}

/// The code of the command error `cmd` is refused with.
async fn refused(client: &Client, db: &str, cmd: Document) -> i32 {
    let err = run(client, db, cmd).await.expect_err("refused");
    code_of(&err).unwrap_or_else(|| panic!("not a command error: {err}"))
}

/// Shards `db.coll` by `key` through the mongos.
async fn shard(client: &Client, ns: &str, key: Document) {
    command(client, "admin", doc! {"shardCollection": ns, "key": key}).await;
}

fn ts_key(t: Timestamp) -> (u32, u32) {
    (t.time, t.increment)
}

/// Opens a change stream with a raw `aggregate`: (cursor id, first batch, post-batch token).
async fn open_stream(
    client: &Client,
    db: &str,
    target: Bson,
    spec: Document,
) -> (i64, Vec<Document>, Document) {
    let reply = command(
        client,
        db,
        doc! {"aggregate": target, "pipeline": [{"$changeStream": spec}], "cursor": {}},
    )
    .await;
    let cursor = reply.get_document("cursor").unwrap();
    (
        cursor.get_i64("id").unwrap(),
        batch(cursor, "firstBatch"),
        cursor.get_document("postBatchResumeToken").unwrap().clone(),
    )
}

fn batch(cursor: &Document, key: &str) -> Vec<Document> {
    cursor
        .get_array(key)
        .unwrap()
        .iter()
        .map(|b| b.as_document().unwrap().clone())
        .collect()
}

/// One `getMore` on a change stream: (batch, post-batch token).
async fn get_more(
    client: &Client,
    db: &str,
    coll: &str,
    id: i64,
    max_ms: i64,
) -> (Vec<Document>, Document) {
    let reply = command(
        client,
        db,
        doc! {"getMore": id, "collection": coll, "maxTimeMS": max_ms},
    )
    .await;
    let cursor = reply.get_document("cursor").unwrap();
    (
        batch(cursor, "nextBatch"),
        cursor.get_document("postBatchResumeToken").unwrap().clone(),
    )
}

#[tokio::test]
async fn answers_as_a_mongos_and_the_driver_sees_a_sharded_cluster() {
    let cluster_id = bson::oid::ObjectId::new();
    let server = mongo_sim::Server::start(Config {
        cluster_id: Some(cluster_id),
        ..sharded(2, Duration::from_millis(50))
    })
    .await
    .unwrap();
    assert_eq!(
        server.uri(),
        format!("mongodb://127.0.0.1:{}/", server.port())
    );
    assert!(!server.uri().contains("replicaSet"));

    let seen: Arc<Mutex<Vec<TopologyType>>> = Arc::default();
    let mut opts = ClientOptions::parse(server.uri()).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(5));
    let sink = seen.clone();
    opts.sdam_event_handler = Some(EventHandler::callback(move |e: SdamEvent| {
        if let SdamEvent::TopologyDescriptionChanged(c) = e {
            sink.lock().unwrap().push(c.new_description.topology_type());
        }
    }));
    let client = Client::with_options(opts).unwrap();
    command(&client, "admin", doc! {"ping": 1}).await;
    assert_eq!(
        seen.lock().unwrap().last().copied(),
        Some(TopologyType::Sharded)
    );

    let hello = command(&client, "admin", doc! {"hello": 1}).await;
    assert_eq!(hello.get_str("msg").unwrap(), "isdbgrid");
    assert!(hello.get_bool("isWritablePrimary").unwrap());
    assert!(hello.get_i32("logicalSessionTimeoutMinutes").is_ok());
    assert_eq!(hello.get_i32("maxWireVersion").unwrap(), 25);
    for absent in ["setName", "hosts", "me", "primary"] {
        assert!(!hello.contains_key(absent), "{absent} in {hello}");
    }

    for name in ["replSetGetConfig", "replSetGetStatus"] {
        assert_eq!(
            refused(&client, "admin", doc! {name: 1}).await,
            59,
            "{name}"
        );
    }
    assert_eq!(
        refused(&client, "local", doc! {"find": "oplog.rs"}).await,
        20
    );

    assert_eq!(server.cluster_id(), cluster_id);
    let version = client
        .database("config")
        .collection::<Document>("version")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(version, doc! {"_id": 1, "clusterId": cluster_id});

    let shards = command(&client, "admin", doc! {"listShards": 1}).await;
    let shards = shards.get_array("shards").unwrap();
    assert_eq!(shards.len(), 2);
    for (i, s) in shards.iter().enumerate() {
        let s = s.as_document().unwrap();
        assert_eq!(s.get_str("_id").unwrap(), format!("shard{i}"));
        assert_eq!(
            s.get_str("host").unwrap(),
            format!("shard{i}/{}", server.shard_host(i).unwrap())
        );
        assert_eq!(s.get_i32("state").unwrap(), 1);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_replica_set_is_unchanged() {
    let (server, client) = common::start().await;
    assert!(server.uri().contains("replicaSet=rs0"));
    let hello = command(&client, "admin", doc! {"hello": 1}).await;
    assert_eq!(hello.get_str("setName").unwrap(), "rs0");
    assert!(!hello.contains_key("msg"));
    assert_eq!(server.shard_count(), 0);
    assert_eq!(refused(&client, "admin", doc! {"listShards": 1}).await, 59);
}

#[tokio::test]
async fn hashed_documents_land_on_both_shards() {
    let (server, client) = start_two().await;
    shard(&client, "h.c", doc! {"_id": "hashed"}).await;
    let coll = client.database("h").collection::<Document>("c");
    let before = [0, 1].map(|i| server.shard_history(i).unwrap().len);
    let docs: Vec<Document> = (0..20).map(|i| doc! {"_id": i, "v": i}).collect();
    coll.insert_many(docs.clone()).await.unwrap();
    let mut per_shard = [0usize; 2];
    for d in &docs {
        let s = server.shard_of("h.c", d);
        let hash = mongo_sim::expression::hashed_index_key(d.get("_id").unwrap(), 0);
        assert_eq!(s, usize::from(hash >= 0), "{d}");
        per_shard[s] += 1;
    }
    assert!(per_shard[0] > 0 && per_shard[1] > 0, "{per_shard:?}");
    for i in 0..2 {
        assert_eq!(
            server.shard_history(i).unwrap().len - before[i],
            per_shard[i],
            "shard {i} records its own documents' inserts"
        );
    }
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 20);

    let config = client.database("config");
    let meta = config
        .collection::<Document>("collections")
        .find_one(doc! {"_id": "h.c"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(meta.get_document("key").unwrap(), &doc! {"_id": "hashed"});
    let mut chunks = config
        .collection::<Document>("chunks")
        .find(doc! {"ns": "h.c"})
        .await
        .unwrap();
    let mut owners = Vec::new();
    while chunks.advance().await.unwrap() {
        let c = chunks.deserialize_current().unwrap();
        owners.push(c.get_str("shard").unwrap().to_string());
    }
    assert_eq!(owners, ["shard0", "shard1"]);
    let databases = config
        .collection::<Document>("databases")
        .find_one(doc! {"_id": "h"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(databases.get_str("primary").unwrap(), "shard0");
}

#[tokio::test]
async fn unsharded_collections_live_on_their_primary_shard() {
    let (server, client) = start_two().await;
    command(
        &client,
        "admin",
        doc! {"enableSharding": "p", "primaryShard": "shard1"},
    )
    .await;
    let before = [0, 1].map(|i| server.shard_history(i).unwrap().len);
    client
        .database("p")
        .collection::<Document>("plain")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    assert_eq!(server.shard_of("p.plain", &doc! {"_id": 1}), 1);
    assert_eq!(server.shard_history(0).unwrap().len, before[0]);
    // The create event and the insert.
    assert_eq!(server.shard_history(1).unwrap().len, before[1] + 2);
    assert_eq!(
        refused(
            &client,
            "admin",
            doc! {"enableSharding": "q", "primaryShard": "shard9"}
        )
        .await,
        70
    );
    assert_eq!(
        refused(
            &client,
            "admin",
            doc! {"shardCollection": "p.bad", "key": {"a": -1}}
        )
        .await,
        2
    );
}

#[tokio::test]
async fn streams_merge_both_shards_in_cluster_time_order() {
    let (server, client) = start_two().await;
    shard(&client, "m.c", doc! {"x": 1}).await;
    let coll = client.database("m").collection::<Document>("c");
    let mut by_coll = coll.watch().await.unwrap().with_type::<Document>();
    let mut by_cluster = client.watch().await.unwrap().with_type::<Document>();
    // Negative x lives on shard0, [0, MaxKey) on shard1: alternate between them.
    let xs = [-1, 5, -2, 6, 7, -3];
    for (i, x) in xs.iter().enumerate() {
        coll.insert_one(doc! {"_id": i as i32, "x": *x})
            .await
            .unwrap();
    }
    let shards: Vec<usize> = xs
        .iter()
        .enumerate()
        .map(|(i, x)| server.shard_of("m.c", &doc! {"_id": i as i32, "x": *x}))
        .collect();
    assert_eq!(shards, [0, 1, 0, 1, 1, 0]);
    for stream in [&mut by_coll, &mut by_cluster] {
        let mut last: Option<Timestamp> = None;
        let mut last_token = String::new();
        for (i, x) in xs.iter().enumerate() {
            let e = next_event(stream).await;
            assert_eq!(e.get_str("operationType").unwrap(), "insert");
            assert_eq!(
                e.get_document("documentKey").unwrap(),
                &doc! {"x": *x, "_id": i as i32},
                "shard key first, then _id"
            );
            let t = e.get_timestamp("clusterTime").unwrap();
            assert!(last.is_none_or(|l| ts_key(l) < ts_key(t)));
            last = Some(t);
            let token = token_hex(&token_doc(&token_of(&e)));
            assert!(token > last_token);
            last_token = token;
        }
    }
}

#[tokio::test]
async fn an_idle_shard_holds_the_stream_back_until_it_writes() {
    // No-ops every hour: only a write moves a shard's applied time here.
    let (server, client) = common::start_with(sharded(2, Duration::from_secs(3600))).await;
    shard(&client, "i.c", doc! {"x": 1}).await;
    let (id, first, _) = open_stream(&client, "i", Bson::String("c".into()), doc! {}).await;
    assert!(first.is_empty());
    let reply = command(
        &client,
        "i",
        doc! {"insert": "c", "documents": [{"_id": 1, "x": -5}]},
    )
    .await;
    let t1 = reply.get_timestamp("operationTime").unwrap();
    assert_eq!(server.shard_history(0).unwrap().applied, t1);
    assert!(ts_key(server.shard_history(1).unwrap().applied) < ts_key(t1));

    // shard1 has not applied past the insert: the batch is empty and the post-batch token
    // stays before the event.
    let (events, pbrt) = get_more(&client, "i", "c", id, 300).await;
    assert!(events.is_empty(), "{events:?}");
    let held = token_hex(&pbrt);

    // A write on shard1 moves its applied time past the first insert, which now comes; the
    // second insert (on shard1) waits in turn for shard0.
    command(
        &client,
        "i",
        doc! {"insert": "c", "documents": [{"_id": 2, "x": 50}]},
    )
    .await;
    let ids = |events: &[Document]| -> Vec<i32> {
        events
            .iter()
            .map(|e| {
                e.get_document("documentKey")
                    .unwrap()
                    .get_i32("_id")
                    .unwrap()
            })
            .collect()
    };
    let (events, pbrt) = get_more(&client, "i", "c", id, 5000).await;
    assert_eq!(ids(&events), [1]);
    let first_token = token_hex(events[0].get_document("_id").unwrap());
    assert!(held < first_token, "the held-back token precedes the event");
    assert_eq!(events[0].get_timestamp("clusterTime").unwrap(), t1);
    let held = token_hex(&pbrt);
    assert!(held >= first_token);

    let (events, _) = get_more(&client, "i", "c", id, 300).await;
    assert!(events.is_empty(), "{events:?}");
    command(
        &client,
        "i",
        doc! {"insert": "c", "documents": [{"_id": 3, "x": -50}]},
    )
    .await;
    let (events, _) = get_more(&client, "i", "c", id, 5000).await;
    assert_eq!(ids(&events), [2]);
    assert!(held < token_hex(events[0].get_document("_id").unwrap()));
}

#[tokio::test]
async fn an_idle_shard_releases_the_stream_with_its_periodic_noop() {
    let (server, client) = common::start_with(sharded(2, Duration::from_millis(150))).await;
    shard(&client, "n.c", doc! {"x": 1}).await;
    let (id, _, _) = open_stream(&client, "n", Bson::String("c".into()), doc! {}).await;
    let idle_len = server.shard_history(1).unwrap().len;
    let reply = command(
        &client,
        "n",
        doc! {"insert": "c", "documents": [{"_id": 1, "x": -5}]},
    )
    .await;
    let t1 = reply.get_timestamp("operationTime").unwrap();
    let mut seen = Vec::new();
    let mut held_tokens = Vec::new();
    while seen.is_empty() {
        let (events, pbrt) = get_more(&client, "n", "c", id, 5000).await;
        if events.is_empty() {
            held_tokens.push(token_hex(&pbrt));
            assert!(held_tokens.len() < 20, "the event never came");
        }
        seen = events;
    }
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].get_timestamp("clusterTime").unwrap(), t1);
    // While held back, the post-batch token never passed the unreported event.
    let event_token = token_hex(seen[0].get_document("_id").unwrap());
    assert!(held_tokens.iter().all(|t| *t < event_token));
    // It came because shard1 applied past it without writing anything: a no-op.
    let idle = server.shard_history(1).unwrap();
    assert!(ts_key(idle.applied) > ts_key(t1));
    assert_eq!(idle.len, idle_len, "shard1 wrote nothing");
}

#[tokio::test]
async fn history_lost_on_the_busy_shard_fails_the_resume() {
    let (server, client) = common::start_with(Config {
        history_limit: 5,
        ..sharded(2, Duration::from_millis(50))
    })
    .await;
    shard(&client, "l.c", doc! {"x": 1}).await;
    let coll = client.database("l").collection::<Document>("c");
    let mut stream = coll.watch().await.unwrap().with_type::<Document>();
    coll.insert_one(doc! {"_id": 0, "x": 10}).await.unwrap(); // shard1
    let on_idle = next_event(&mut stream).await;
    let idle_token = token_of(&on_idle);
    let idle_time = on_idle.get_timestamp("clusterTime").unwrap();
    // The live stream keeps up (reading each event before the next write), so it is not lost.
    let mut last = on_idle;
    for i in 1..=10 {
        coll.insert_one(doc! {"_id": i, "x": -i}).await.unwrap(); // shard0
        last = next_event(&mut stream).await;
    }
    let busy = server.shard_history(0).unwrap();
    let idle = server.shard_history(1).unwrap();
    assert_eq!(busy.len, 5);
    assert!(
        ts_key(busy.first.unwrap()) > ts_key(idle_time),
        "shard0 evicted past it"
    );
    assert!(
        ts_key(idle.first.unwrap()) <= ts_key(idle_time)
            && ts_key(idle.last.unwrap()) >= ts_key(idle_time),
        "shard1 still holds the event"
    );

    let err = coll
        .watch()
        .resume_after(idle_token)
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(code_of(&err), Some(286), "{err}");
    let err = coll
        .watch()
        .start_at_operation_time(idle_time)
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(code_of(&err), Some(286), "{err}");
    // A point both shards still cover resumes.
    let mut resumed = coll
        .watch()
        .resume_after(token_of(&last))
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 100, "x": 100}).await.unwrap();
    let next = next_event(&mut resumed).await;
    assert_eq!(
        next.get_document("documentKey").unwrap(),
        &doc! {"x": 100, "_id": 100}
    );
}

#[tokio::test]
async fn a_multi_shard_transaction_is_atomic_and_contiguous() {
    let (server, client) = start_two().await;
    shard(&client, "t.c", doc! {"x": 1}).await;
    let coll = client.database("t").collection::<Document>("c");
    let mut stream = client.watch().await.unwrap().with_type::<Document>();
    coll.insert_one(doc! {"_id": "before", "x": 1})
        .await
        .unwrap();

    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    let statements = [(1, -1), (2, 7), (3, -2), (4, 8)];
    for (id, x) in statements {
        coll.insert_one(doc! {"_id": id, "x": x})
            .session(&mut session)
            .await
            .unwrap();
    }
    // Nothing is visible outside the transaction before it commits.
    assert_eq!(
        coll.count_documents(doc! {"x": {"$ne": 1}}).await.unwrap(),
        0
    );
    session.commit_transaction().await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 5);
    coll.insert_one(doc! {"_id": "after", "x": -9})
        .await
        .unwrap();

    let first = next_event(&mut stream).await;
    assert_eq!(
        first
            .get_document("documentKey")
            .unwrap()
            .get_str("_id")
            .unwrap(),
        "before"
    );
    let mut txn_events = Vec::new();
    for _ in statements {
        txn_events.push(next_event(&mut stream).await);
    }
    let last = next_event(&mut stream).await;
    assert_eq!(
        last.get_document("documentKey")
            .unwrap()
            .get_str("_id")
            .unwrap(),
        "after"
    );
    let commit_time = txn_events[0].get_timestamp("clusterTime").unwrap();
    let lsid = txn_events[0].get_document("lsid").unwrap().clone();
    for (e, (id, x)) in txn_events.iter().zip(statements) {
        assert_eq!(
            e.get_document("documentKey").unwrap(),
            &doc! {"x": x, "_id": id},
            "statement order"
        );
        assert_eq!(e.get_timestamp("clusterTime").unwrap(), commit_time);
        assert_eq!(e.get_document("lsid").unwrap(), &lsid);
        assert_eq!(e.get_i64("txnNumber").unwrap(), 1);
    }
    // Both participants recorded their part at the one commit time.
    for (i, expected) in [(0, "shard0"), (1, "shard1")] {
        let owners: Vec<usize> = statements
            .iter()
            .map(|(id, x)| server.shard_of("t.c", &doc! {"_id": *id, "x": *x}))
            .collect();
        assert!(owners.contains(&i), "{expected} takes part");
    }
    for i in 0..2 {
        let h = server.shard_history(i).unwrap();
        assert!(ts_key(h.first.unwrap()) <= ts_key(commit_time));
        assert!(ts_key(h.last.unwrap()) >= ts_key(commit_time));
    }
}

#[tokio::test]
async fn start_at_operation_time_and_start_after_a_drop() {
    let (_server, client) = start_two().await;
    shard(&client, "d.c", doc! {"x": 1}).await;
    let db = client.database("d");
    let coll = db.collection::<Document>("c");
    coll.insert_one(doc! {"_id": 0, "x": -1}).await.unwrap();
    let reply = command(
        &client,
        "d",
        doc! {"insert": "c", "documents": [{"_id": 1, "x": 3}]},
    )
    .await;
    let t1 = reply.get_timestamp("operationTime").unwrap();
    coll.insert_one(doc! {"_id": 2, "x": -2}).await.unwrap();

    let mut from_t1 = coll
        .watch()
        .start_at_operation_time(t1)
        .await
        .unwrap()
        .with_type::<Document>();
    let ids: Vec<i32> = [
        next_event(&mut from_t1).await,
        next_event(&mut from_t1).await,
    ]
    .iter()
    .map(|e| {
        e.get_document("documentKey")
            .unwrap()
            .get_i32("_id")
            .unwrap()
    })
    .collect();
    assert_eq!(ids, [1, 2], "from t1 on, across both shards");

    let mut stream = coll.watch().await.unwrap().with_type::<Document>();
    coll.drop().await.unwrap();
    let dropped = next_event(&mut stream).await;
    assert_eq!(dropped.get_str("operationType").unwrap(), "drop");
    let invalidate = next_event(&mut stream).await;
    assert_eq!(invalidate.get_str("operationType").unwrap(), "invalidate");
    // The drop is recorded on both shards but reported once: the database stream sees one.
    let mut by_db = db
        .watch()
        .start_at_operation_time(dropped.get_timestamp("clusterTime").unwrap())
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 9}).await.unwrap();
    assert_eq!(
        next_event(&mut by_db)
            .await
            .get_str("operationType")
            .unwrap(),
        "drop"
    );
    assert_eq!(
        next_event(&mut by_db)
            .await
            .get_str("operationType")
            .unwrap(),
        "insert"
    );
    let unsharded = client
        .database("config")
        .collection::<Document>("collections")
        .find_one(doc! {"_id": "d.c"})
        .await
        .unwrap();
    assert!(unsharded.is_none(), "the drop unshards the collection");

    let mut after = coll
        .watch()
        .start_after(token_of(&invalidate))
        .await
        .unwrap()
        .with_type::<Document>();
    let e = next_event(&mut after).await;
    assert_eq!(e.get_str("operationType").unwrap(), "insert");
    assert_eq!(e.get_document("documentKey").unwrap(), &doc! {"_id": 9});
}

#[tokio::test]
async fn a_snapshot_read_at_a_cluster_time_spans_the_shards() {
    let (_server, client) = start_two().await;
    shard(&client, "s.c", doc! {"x": 1}).await;
    let reply = command(
        &client,
        "s",
        doc! {"insert": "c", "documents": [{"_id": 1, "x": -1, "v": 1}, {"_id": 2, "x": 1, "v": 1}]},
    )
    .await;
    let t1 = reply.get_timestamp("operationTime").unwrap();
    command(
        &client,
        "s",
        doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"v": 2}}, "multi": true}]},
    )
    .await;
    command(
        &client,
        "s",
        doc! {"delete": "c", "deletes": [{"q": {"_id": 1}, "limit": 1}]},
    )
    .await;
    let reply = command(
        &client,
        "s",
        doc! {"find": "c", "sort": {"_id": 1}, "readConcern": {"level": "snapshot", "atClusterTime": t1}},
    )
    .await;
    let cursor = reply.get_document("cursor").unwrap();
    assert_eq!(cursor.get_timestamp("atClusterTime").unwrap(), t1);
    assert_eq!(
        batch(cursor, "firstBatch"),
        [
            doc! {"_id": 1, "x": -1, "v": 1},
            doc! {"_id": 2, "x": 1, "v": 1}
        ]
    );
    let now = command(&client, "s", doc! {"find": "c"}).await;
    assert_eq!(
        batch(now.get_document("cursor").unwrap(), "firstBatch"),
        [doc! {"_id": 2, "x": 1, "v": 2}]
    );
}

#[tokio::test]
async fn each_shard_listener_serves_its_own_oplog() {
    let (server, client) = start_two().await;
    shard(&client, "o.c", doc! {"x": 1}).await;
    let coll = client.database("o").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "x": -1}).await.unwrap();
    coll.insert_one(doc! {"_id": 2, "x": 1}).await.unwrap();
    for i in 0..2 {
        let shard_client = common::client_for(&server.shard_uri(i).unwrap()).await;
        let hello = command(&shard_client, "admin", doc! {"hello": 1}).await;
        assert_eq!(hello.get_str("setName").unwrap(), format!("shard{i}"));
        let status = command(&shard_client, "admin", doc! {"replSetGetStatus": 1}).await;
        let applied = status
            .get_document("optimes")
            .unwrap()
            .get_document("appliedOpTime")
            .unwrap()
            .get_timestamp("ts")
            .unwrap();
        assert!(ts_key(applied) >= ts_key(server.shard_history(i).unwrap().last.unwrap()));
        let reply = command(
            &shard_client,
            "local",
            doc! {"find": "oplog.rs", "filter": {"op": "i"}},
        )
        .await;
        let inserted: Vec<Bson> = batch(reply.get_document("cursor").unwrap(), "firstBatch")
            .iter()
            .map(|e| e.get_document("o").unwrap().get("_id").unwrap().clone())
            .collect();
        assert_eq!(inserted, [Bson::Int32(i as i32 + 1)], "shard {i}");
        // Its entries, one batch at a time.
        let reply = command(
            &shard_client,
            "local",
            doc! {"find": "oplog.rs", "batchSize": 1},
        )
        .await;
        let cursor = reply.get_document("cursor").unwrap();
        assert_eq!(batch(cursor, "firstBatch")[0].get_str("op").unwrap(), "c");
        let id = cursor.get_i64("id").unwrap();
        assert_ne!(id, 0);
        let more = command(
            &shard_client,
            "local",
            doc! {"getMore": id, "collection": "oplog.rs"},
        )
        .await;
        let rest = batch(more.get_document("cursor").unwrap(), "nextBatch");
        let ops: Vec<&str> = rest.iter().map(|e| e.get_str("op").unwrap()).collect();
        // The database's primary shard (shard0) also notes the sharding as a no-op entry.
        let expected: &[&str] = if i == 0 { &["n", "i"] } else { &["i"] };
        assert_eq!(ops, expected, "shard {i}");
        assert_eq!(refused(&shard_client, "o", doc! {"find": "c"}).await, 20);
    }
}

#[tokio::test]
async fn fail_points_work_through_the_mongos() {
    let (_server, client) = start_two().await;
    command(
        &client,
        "admin",
        doc! {
            "configureFailPoint": "failCommand",
            "mode": {"times": 1},
            "data": {"failCommands": ["insert"], "errorCode": 11600},
        },
    )
    .await;
    // The retryable write is retried by the driver after the injected error.
    client
        .database("f")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    let n = client
        .database("f")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn stream_options_and_ddl_events_work_through_the_mongos() {
    let (server, client) = start_two().await;
    let db = client.database("x");
    let mut expanded = db
        .watch()
        .show_expanded_events(true)
        .await
        .unwrap()
        .with_type::<Document>();
    // Sharding a missing collection creates it on both shards; the stream reports it once.
    shard(&client, "x.c", doc! {"k": 1}).await;
    let coll = db.collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "k": -1, "v": 0})
        .await
        .unwrap();
    let created = next_event(&mut expanded).await;
    assert_eq!(created.get_str("operationType").unwrap(), "create");
    let sharded_event = next_event(&mut expanded).await;
    assert_eq!(
        sharded_event.get_str("operationType").unwrap(),
        "shardCollection"
    );
    assert_eq!(
        sharded_event
            .get_document("operationDescription")
            .unwrap()
            .get_document("shardKey")
            .unwrap(),
        &doc! {"k": 1}
    );
    assert_eq!(
        next_event(&mut expanded)
            .await
            .get_str("operationType")
            .unwrap(),
        "insert"
    );
    for i in 0..2 {
        let h = server.shard_history(i).unwrap();
        assert_eq!(h.first, Some(created.get_timestamp("clusterTime").unwrap()));
    }

    let mut filtered = coll
        .watch()
        .pipeline([doc! {"$match": {"documentKey.k": {"$gte": 0}}}])
        .full_document(mongodb::options::FullDocumentType::UpdateLookup)
        .await
        .unwrap()
        .with_type::<Document>();
    coll.insert_one(doc! {"_id": 2, "k": 5, "v": 0})
        .await
        .unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 1}})
        .await
        .unwrap();
    coll.update_one(doc! {"_id": 2}, doc! {"$set": {"v": 2}})
        .await
        .unwrap();
    let ins = next_event(&mut filtered).await;
    assert_eq!(
        ins.get_document("documentKey").unwrap(),
        &doc! {"k": 5, "_id": 2}
    );
    let upd = next_event(&mut filtered).await;
    assert_eq!(upd.get_str("operationType").unwrap(), "update");
    assert_eq!(
        upd.get_document("documentKey").unwrap(),
        &doc! {"k": 5, "_id": 2}
    );
    assert_eq!(
        upd.get_document("fullDocument").unwrap(),
        &doc! {"_id": 2, "k": 5, "v": 2}
    );
    coll.delete_one(doc! {"_id": 2}).await.unwrap();
    let del = next_event(&mut filtered).await;
    assert_eq!(del.get_str("operationType").unwrap(), "delete");
    assert_eq!(
        del.get_document("documentKey").unwrap(),
        &doc! {"k": 5, "_id": 2},
        "a delete's documentKey keeps the shard key"
    );

    // dropDatabase is recorded on every shard; a database stream sees it (and its
    // invalidate) once.
    let mut by_db = db.watch().await.unwrap().with_type::<Document>();
    db.drop().await.unwrap();
    let mut ops = Vec::new();
    loop {
        let e = next_event(&mut by_db).await;
        let op = e.get_str("operationType").unwrap().to_string();
        ops.push(op.clone());
        if op == "invalidate" {
            break;
        }
    }
    assert_eq!(ops, ["drop", "dropDatabase", "invalidate"]);
}

#[tokio::test]
async fn a_shards_fail_points_are_its_own() {
    let (server, client) = start_two().await;
    let shard1 = common::client_for(&server.shard_uri(1).unwrap()).await;
    let shard0 = common::client_for(&server.shard_uri(0).unwrap()).await;
    run(
        &shard1,
        "admin",
        doc! {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": {"failCommands": ["find"], "errorCode": 13},
        },
    )
    .await
    .unwrap();
    let oplog = doc! {"find": "oplog.rs", "limit": 1};
    assert_eq!(refused(&shard1, "local", oplog.clone()).await, 13);
    // Shard 0 and the mongos are untouched.
    run(&shard0, "local", oplog.clone()).await.unwrap();
    client
        .database("d")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap();
    let off = run(
        &shard1,
        "admin",
        doc! {"configureFailPoint": "failCommand", "mode": "off"},
    )
    .await
    .unwrap();
    assert_eq!(off.get_i64("count").unwrap(), 1);
    run(&shard1, "local", oplog).await.unwrap();
}
