use crate::common;

use bson::{Bson, Document, doc, oid::ObjectId};
use futures_util::TryStreamExt;
use mongo_sim::{Config, ServerHandle};
use mongodb::error::ErrorKind;

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

#[tokio::test]
async fn hello_reports_a_replica_set_primary() {
    let (server, client) = common::start().await;
    let hello = client
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    assert!(hello.get_bool("isWritablePrimary").unwrap());
    assert!(!hello.get_bool("secondary").unwrap());
    assert_eq!(hello.get_str("setName").unwrap(), "rs0");
    let me = format!("127.0.0.1:{}", server.port());
    assert_eq!(
        hello.get_array("hosts").unwrap(),
        &vec![Bson::String(me.clone())]
    );
    assert_eq!(hello.get_str("primary").unwrap(), me);
    assert_eq!(hello.get_str("me").unwrap(), me);
    assert_eq!(hello.get_i32("maxBsonObjectSize").unwrap(), 16_777_216);
    assert_eq!(hello.get_i32("maxMessageSizeBytes").unwrap(), 48_000_000);
    assert_eq!(hello.get_i32("maxWriteBatchSize").unwrap(), 100_000);
    assert_eq!(hello.get_i32("maxWireVersion").unwrap(), 25);
    assert_eq!(hello.get_i32("minWireVersion").unwrap(), 0);
    assert_eq!(hello.get_i32("logicalSessionTimeoutMinutes").unwrap(), 30);
    assert!(hello.get_object_id("electionId").is_ok());
    assert!(hello.get_document("lastWrite").is_ok());
    assert!(hello.get_datetime("localTime").is_ok());
    assert!(hello.get("connectionId").is_some());
    assert!(hello.get("topologyVersion").is_none());
    assert!(hello.get("compression").is_none());
    assert!(hello.get_timestamp("operationTime").is_ok());
    assert!(hello.get_document("$clusterTime").is_ok());
    let legacy = client
        .database("admin")
        .run_command(doc! {"isMaster": 1})
        .await
        .unwrap();
    assert!(legacy.get_bool("ismaster").unwrap());
    server.shutdown().await;
}

#[tokio::test]
async fn direct_connection_and_advertised_host() {
    let config = Config {
        advertised_host: Some("localhost:1".into()),
        ..Config::default()
    };
    let server = mongo_sim::Server::start(config).await.unwrap();
    let hello_host = server.host_port();
    assert_eq!(hello_host, "localhost:1");
    // The advertised host is unreachable, but a direct connection still works.
    let client = common::client_for(&format!(
        "mongodb://127.0.0.1:{}/?directConnection=true",
        server.port()
    ))
    .await;
    let hello = client
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    assert_eq!(
        hello.get_array("hosts").unwrap(),
        &vec![Bson::String("localhost:1".into())]
    );
    client
        .database("d")
        .collection::<Document>("c")
        .insert_one(doc! {"x": 1})
        .await
        .unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn ping_build_info_and_repl_set_config() {
    let id = ObjectId::parse_str("65f0a1b2c3d4e5f601234567").unwrap();
    let (server, client) = common::start_with(Config {
        replica_set_id: Some(id),
        set_name: "rsx".into(),
        ..Config::default()
    })
    .await;
    assert_eq!(server.replica_set_id(), id);
    assert!(server.uri().ends_with("/?replicaSet=rsx"));
    let admin = client.database("admin");
    admin.run_command(doc! {"ping": 1}).await.unwrap();
    let info = admin.run_command(doc! {"buildInfo": 1}).await.unwrap();
    assert!(info.get_str("version").unwrap().starts_with("8."));
    let config = admin
        .run_command(doc! {"replSetGetConfig": 1})
        .await
        .unwrap();
    let config = config.get_document("config").unwrap();
    assert_eq!(config.get_str("_id").unwrap(), "rsx");
    assert_eq!(
        config
            .get_document("settings")
            .unwrap()
            .get_object_id("replicaSetId")
            .unwrap(),
        id
    );
    server.shutdown().await;
}

#[tokio::test]
async fn replica_set_id_is_fixed_per_server() {
    let (server, client) = common::start().await;
    let admin = client.database("admin");
    let a = admin
        .run_command(doc! {"replSetGetConfig": 1})
        .await
        .unwrap();
    let b = admin
        .run_command(doc! {"replSetGetConfig": 1})
        .await
        .unwrap();
    let get = |d: &Document| {
        d.get_document("config")
            .unwrap()
            .get_document("settings")
            .unwrap()
            .get_object_id("replicaSetId")
            .unwrap()
    };
    assert_eq!(get(&a), get(&b));
    assert_eq!(get(&a), server.replica_set_id());
    server.shutdown().await;
}

#[tokio::test]
async fn standalone_refuses_replica_set_features() {
    let (server, client) = common::start_with(Config {
        standalone: true,
        ..Config::default()
    })
    .await;
    assert!(server.uri().contains("directConnection=true"));
    let admin = client.database("admin");
    let hello = admin.run_command(doc! {"hello": 1}).await.unwrap();
    assert!(hello.get("setName").is_none());
    assert!(hello.get_bool("isWritablePrimary").unwrap());
    let err = admin
        .run_command(doc! {"replSetGetConfig": 1})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(76));
    let coll = client.database("d").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let err = coll.watch().await.unwrap_err();
    assert_eq!(code_of(&err), Some(40573));
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    let err = coll
        .insert_one(doc! {"_id": 2})
        .session(&mut session)
        .await
        .unwrap_err();
    assert!(
        code_of(&err) == Some(20) || err.to_string().contains("Transaction"),
        "{err}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn collection_lifecycle_commands() {
    let (server, client) = common::start().await;
    let db = client.database("life");
    db.create_collection("a").await.unwrap();
    let err = db.create_collection("a").await.unwrap_err();
    assert_eq!(code_of(&err), Some(48));
    db.collection::<Document>("b")
        .insert_one(doc! {"x": 1})
        .await
        .unwrap();
    let mut names = db.list_collection_names().await.unwrap();
    names.sort();
    assert_eq!(names, vec!["a", "b"]);
    let specs: Vec<_> = db
        .list_collections()
        .filter(doc! {"name": "a"})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(specs.len(), 1);
    // Dropping a missing collection answers NamespaceNotFound, which the driver ignores.
    db.collection::<Document>("missing").drop().await.unwrap();
    let raw = db.run_command(doc! {"drop": "missing"}).await.unwrap_err();
    assert_eq!(code_of(&raw), Some(26));
    client
        .database("admin")
        .run_command(doc! {"renameCollection": "life.b", "to": "life.c"})
        .await
        .unwrap();
    let mut names = db.list_collection_names().await.unwrap();
    names.sort();
    assert_eq!(names, vec!["a", "c"]);
    assert_eq!(
        db.collection::<Document>("c")
            .count_documents(doc! {})
            .await
            .unwrap(),
        1
    );
    db.collection::<Document>("a").drop().await.unwrap();
    assert_eq!(db.list_collection_names().await.unwrap(), vec!["c"]);
    let dbs = client.list_database_names().await.unwrap();
    assert!(dbs.contains(&"life".to_string()));
    db.drop().await.unwrap();
    assert!(db.list_collection_names().await.unwrap().is_empty());
    server.shutdown().await;
}

/// Views and time-series collections: listed with their type, and no change stream opens on
/// them (CommandNotSupportedOnView, as MongoDB answers).
#[tokio::test]
async fn views_and_time_series_collections_have_their_type_and_no_change_stream() {
    let (server, client) = common::start().await;
    let db = client.database("kinds");
    db.run_command(doc! {"create": "readings", "timeseries": {"timeField": "at"}})
        .await
        .unwrap();
    db.run_command(doc! {"create": "recent", "viewOn": "orders", "pipeline": []})
        .await
        .unwrap();
    db.create_collection("orders").await.unwrap();
    let bad = db
        .run_command(doc! {"create": "broken", "timeseries": {"metaField": "m"}})
        .await
        .unwrap_err();
    assert_eq!(code_of(&bad), Some(2));
    for (name, kind) in [
        ("readings", "timeseries"),
        ("recent", "view"),
        ("orders", "collection"),
    ] {
        let reply = db
            .run_command(doc! {
                "listCollections": 1,
                "filter": {"name": name},
                "nameOnly": true,
                "authorizedCollections": true,
            })
            .await
            .unwrap();
        let batch = reply
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap();
        assert_eq!(batch.len(), 1, "{name}");
        let spec = batch[0].as_document().unwrap();
        assert_eq!(spec.get_str("type").unwrap(), kind, "{name}");
        let watched = db.collection::<Document>(name).watch().await;
        if kind == "collection" {
            assert!(watched.is_ok(), "{name}");
        } else {
            assert_eq!(code_of(&watched.unwrap_err()), Some(166), "{name}");
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn end_sessions_and_kill_cursors() {
    let (server, client) = common::start().await;
    let coll = client.database("d").collection::<Document>("c");
    let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i}).collect();
    coll.insert_many(docs).await.unwrap();
    let first = client
        .database("d")
        .run_command(doc! {"find": "c", "batchSize": 2})
        .await
        .unwrap();
    let id = first.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    let killed = client
        .database("d")
        .run_command(doc! {"killCursors": "c", "cursors": [id]})
        .await
        .unwrap();
    assert_eq!(
        killed.get_array("cursorsKilled").unwrap(),
        &vec![Bson::Int64(id)]
    );
    // A cursor the driver iterates to the end across batches.
    let all: Vec<Document> = coll
        .find(doc! {})
        .batch_size(3)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 10);
    let session = client.start_session().await.unwrap();
    let lsid = session.id().clone();
    drop(session);
    client
        .database("admin")
        .run_command(doc! {"endSessions": [lsid]})
        .await
        .unwrap();
    server.shutdown().await;
}

#[test]
fn start_blocking_serves_until_dropped() {
    let server = ServerHandle::start_blocking(Config::default()).unwrap();
    let port = server.port();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    drop(server);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test]
async fn received_commands_note_concerns_and_read_preference_but_no_documents() {
    let (server, _) = common::start().await;
    let uri = format!(
        "{}&w=1&readConcernLevel=local&readPreference=secondaryPreferred",
        server.uri()
    );
    let client = common::client_for(&uri).await;
    let coll = client.database("d").collection::<Document>("c");
    server.clear_received_commands();
    coll.insert_many(vec![doc! {"_id": 1, "secret": "s3cr3t"}, doc! {"_id": 2}])
        .await
        .unwrap();
    coll.find_one(doc! {}).await.unwrap();
    let received = server.received_commands();
    let insert = received
        .iter()
        .find(|c| c.get_str("command").ok() == Some("insert"))
        .expect("the insert was noted");
    assert_eq!(insert.get_str("db").unwrap(), "d");
    assert!(
        insert.get_str("app").is_err(),
        "the client named no application"
    );
    assert_eq!(insert.get_str("collection").unwrap(), "c");
    assert_eq!(insert.get_i64("documents").unwrap(), 2);
    assert_eq!(insert.get_document("writeConcern").unwrap(), &doc! {"w": 1});
    assert!(!format!("{received:?}").contains("s3cr3t"));
    let find = received
        .iter()
        .find(|c| c.get_str("command").ok() == Some("find"))
        .expect("the find was noted");
    assert_eq!(
        find.get_document("readConcern").unwrap(),
        &doc! {"level": "local"}
    );
    assert_eq!(
        find.get_document("$readPreference")
            .unwrap()
            .get_str("mode")
            .unwrap(),
        "secondaryPreferred"
    );
    server.shutdown().await;
}
