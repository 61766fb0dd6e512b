//! `bulkWrite` (MongoDB 8.0) through the official driver's `Client::bulk_write`: operations across
//! namespaces, per-operation results, ordered failures, transactions, and its absence on 7.0.

use crate::common;

use bson::{Document, doc};
use mongo_sim::Config;
use mongodb::error::{ErrorKind, PartialBulkWriteResult};
use mongodb::options::{DeleteOneModel, InsertOneModel, UpdateOneModel, WriteModel};

fn insert(ns: mongodb::Namespace, document: Document) -> WriteModel {
    InsertOneModel::builder()
        .namespace(ns)
        .document(document)
        .build()
        .into()
}

fn update(ns: mongodb::Namespace, filter: Document, update: Document) -> WriteModel {
    UpdateOneModel::builder()
        .namespace(ns)
        .filter(filter)
        .update(update)
        .build()
        .into()
}

#[tokio::test]
async fn operations_on_several_collections_in_one_command() {
    let (server, client) = common::start().await;
    let db = client.database("bulk");
    let (a, b) = (
        db.collection::<Document>("a"),
        db.collection::<Document>("b"),
    );
    a.insert_one(doc! {"_id": 1, "v": 0}).await.unwrap();
    server.clear_received_commands();
    let result = client
        .bulk_write(vec![
            update(a.namespace(), doc! {"_id": 1}, doc! {"$set": {"v": 1}}),
            update(a.namespace(), doc! {"_id": 9}, doc! {"$set": {"v": 1}}),
            insert(b.namespace(), doc! {"_id": "x"}),
            insert(b.namespace(), doc! {"_id": "y"}),
            DeleteOneModel::builder()
                .namespace(b.namespace())
                .filter(doc! {"_id": "x"})
                .build()
                .into(),
        ])
        .verbose_results()
        .await
        .unwrap();
    assert_eq!(result.summary.matched_count, 1);
    assert_eq!(result.summary.modified_count, 1);
    assert_eq!(result.summary.inserted_count, 2);
    assert_eq!(result.summary.deleted_count, 1);
    assert_eq!(result.update_results[&0].matched_count, 1);
    assert_eq!(result.update_results[&1].matched_count, 0);
    assert_eq!(result.delete_results[&4].deleted_count, 1);
    assert_eq!(
        a.find_one(doc! {"_id": 1}).await.unwrap().unwrap(),
        doc! {"_id": 1, "v": 1}
    );
    assert_eq!(b.count_documents(doc! {}).await.unwrap(), 1);
    // One command, on `admin`.
    let sent: Vec<Document> = server
        .received_commands()
        .into_iter()
        .filter(|c| c.get_str("command").ok() == Some("bulkWrite"))
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].get_str("db").ok(), Some("admin"));
}

#[tokio::test]
async fn an_ordered_bulk_write_stops_at_its_first_error() {
    let (_server, client) = common::start().await;
    let coll = client.database("bulk").collection::<Document>("items");
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let error = client
        .bulk_write(vec![
            insert(coll.namespace(), doc! {"_id": 1}),
            insert(coll.namespace(), doc! {"_id": 2}),
            insert(coll.namespace(), doc! {"_id": 3}),
        ])
        .await
        .unwrap_err();
    let ErrorKind::BulkWrite(failure) = error.kind.as_ref() else {
        panic!("{error:?}");
    };
    assert_eq!(failure.write_errors.len(), 1, "{failure:?}");
    assert_eq!(failure.write_errors[&1].code, 11000);
    match &failure.partial_result {
        Some(PartialBulkWriteResult::Summary(summary)) => assert_eq!(summary.inserted_count, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
}

#[tokio::test]
async fn an_unordered_bulk_write_reports_every_error() {
    let (_server, client) = common::start().await;
    let coll = client.database("bulk").collection::<Document>("items");
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    let error = client
        .bulk_write(vec![
            insert(coll.namespace(), doc! {"_id": 2}),
            insert(coll.namespace(), doc! {"_id": 3}),
            insert(coll.namespace(), doc! {"_id": 2}),
        ])
        .ordered(false)
        .await
        .unwrap_err();
    let ErrorKind::BulkWrite(failure) = error.kind.as_ref() else {
        panic!("{error:?}");
    };
    let mut failed: Vec<usize> = failure.write_errors.keys().copied().collect();
    failed.sort();
    assert_eq!(failed, [0, 2]);
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
}

#[tokio::test]
async fn a_failed_operation_aborts_the_transaction() {
    let (_server, client) = common::start().await;
    let db = client.database("bulk");
    let (checkpoints, outbox) = (
        db.collection::<Document>("checkpoints"),
        db.collection::<Document>("outbox"),
    );
    checkpoints
        .insert_one(doc! {"_id": "c", "token": 1})
        .await
        .unwrap();
    outbox.insert_one(doc! {"_id": "taken"}).await.unwrap();

    // Committed: the compare-and-set and a record together.
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    let result = client
        .bulk_write(vec![
            update(
                checkpoints.namespace(),
                doc! {"_id": "c", "token": 1},
                doc! {"$set": {"token": 2}},
            ),
            insert(outbox.namespace(), doc! {"_id": "r1"}),
        ])
        .session(&mut session)
        .await
        .unwrap();
    assert_eq!(result.matched_count, 1);
    session.commit_transaction().await.unwrap();
    assert_eq!(outbox.count_documents(doc! {}).await.unwrap(), 2);

    // A duplicate key in the second insert: nothing of the transaction stays, and it is over.
    session.start_transaction().await.unwrap();
    let error = client
        .bulk_write(vec![
            update(
                checkpoints.namespace(),
                doc! {"_id": "c", "token": 2},
                doc! {"$set": {"token": 3}},
            ),
            insert(outbox.namespace(), doc! {"_id": "r2"}),
            insert(outbox.namespace(), doc! {"_id": "taken"}),
        ])
        .session(&mut session)
        .await
        .unwrap_err();
    let ErrorKind::BulkWrite(failure) = error.kind.as_ref() else {
        panic!("{error:?}");
    };
    assert_eq!(failure.write_errors[&2].code, 11000);
    let commit = session.commit_transaction().await.unwrap_err();
    assert!(
        matches!(commit.kind.as_ref(), ErrorKind::Command(c) if c.code == 251),
        "{commit:?}"
    );
    assert_eq!(
        checkpoints
            .find_one(doc! {"_id": "c"})
            .await
            .unwrap()
            .unwrap(),
        doc! {"_id": "c", "token": 2}
    );
    assert_eq!(outbox.count_documents(doc! {}).await.unwrap(), 2);
}

#[tokio::test]
async fn a_server_before_8_0_has_no_bulk_write() {
    let (server, client) = common::start_with(Config {
        max_wire_version: 21,
        ..Config::default()
    })
    .await;
    let coll = client.database("bulk").collection::<Document>("items");
    // The driver refuses before it sends anything.
    let error = client
        .bulk_write(vec![insert(coll.namespace(), doc! {"_id": 1})])
        .await
        .unwrap_err();
    assert!(
        matches!(error.kind.as_ref(), ErrorKind::IncompatibleServer { .. }),
        "{error:?}"
    );
    // Sent anyway, the command is unknown, as on MongoDB 7.0.
    let reply = client
        .database("admin")
        .run_command(doc! {
            "bulkWrite": 1,
            "ops": [{"insert": 0, "document": {"_id": 1}}],
            "nsInfo": [{"ns": "bulk.items"}],
        })
        .await
        .unwrap_err();
    assert!(
        matches!(reply.kind.as_ref(), ErrorKind::Command(c) if c.code == 59),
        "{reply:?}"
    );
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 0);
    let build = client
        .database("admin")
        .run_command(doc! {"buildInfo": 1})
        .await
        .unwrap();
    assert_eq!(build.get_str("version").ok(), Some("7.0.0"));
    drop(server);
}

#[tokio::test]
async fn malformed_bulk_writes_are_refused() {
    let (_server, client) = common::start().await;
    let admin = client.database("admin");
    for (command, code) in [
        // Not on admin.
        (
            doc! {"bulkWrite": 1, "ops": [{"insert": 0, "document": {}}], "nsInfo": [{"ns": "bulk.items"}]},
            13,
        ),
        // An operation naming a namespace that is not listed.
        (
            doc! {"bulkWrite": 1, "ops": [{"insert": 1, "document": {}}], "nsInfo": [{"ns": "bulk.items"}]},
            2,
        ),
        // An invalid namespace.
        (
            doc! {"bulkWrite": 1, "ops": [{"insert": 0, "document": {}}], "nsInfo": [{"ns": "nodot"}]},
            73,
        ),
        // No operations.
        (
            doc! {"bulkWrite": 1, "ops": [], "nsInfo": [{"ns": "bulk.items"}]},
            2,
        ),
        // An unknown operation.
        (
            doc! {"bulkWrite": 1, "ops": [{"upsert": 0}], "nsInfo": [{"ns": "bulk.items"}]},
            9,
        ),
    ] {
        let target = if code == 13 {
            client.database("bulk")
        } else {
            admin.clone()
        };
        let reply = target.run_command(command.clone()).await;
        let failed_with = match &reply {
            Err(e) => match e.kind.as_ref() {
                ErrorKind::Command(c) => Some(c.code),
                _ => None,
            },
            Ok(reply) => reply
                .get_document("cursor")
                .ok()
                .and_then(|c| c.get_array("firstBatch").ok())
                .and_then(|batch| batch.first())
                .and_then(|entry| entry.as_document())
                .and_then(|entry| entry.get_i32("code").ok()),
        };
        assert_eq!(failed_with, Some(code), "{command}: {reply:?}");
    }
    let coll = client.database("bulk").collection::<Document>("items");
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 0);
}

#[tokio::test]
async fn an_older_feature_compatibility_version_turns_bulk_write_off() {
    let (_server, client) = common::start().await;
    let admin = client.database("admin");
    let coll = client.database("bulk").collection::<Document>("items");
    let fcv = |reply: Document| {
        reply
            .get_document("featureCompatibilityVersion")
            .unwrap()
            .get_str("version")
            .unwrap()
            .to_string()
    };
    let asked = doc! {"getParameter": 1, "featureCompatibilityVersion": 1};
    assert_eq!(fcv(admin.run_command(asked.clone()).await.unwrap()), "8.0");
    // Refused without confirmation, or to a version the release cannot run at.
    for command in [
        doc! {"setFeatureCompatibilityVersion": "7.0"},
        doc! {"setFeatureCompatibilityVersion": "8.1", "confirm": true},
        doc! {"setFeatureCompatibilityVersion": "6.0", "confirm": true},
        doc! {"setFeatureCompatibilityVersion": "seven", "confirm": true},
    ] {
        assert!(
            admin.run_command(command.clone()).await.is_err(),
            "{command}"
        );
    }
    assert_eq!(fcv(admin.run_command(asked.clone()).await.unwrap()), "8.0");
    admin
        .run_command(doc! {"setFeatureCompatibilityVersion": "7.0", "confirm": true})
        .await
        .unwrap();
    assert_eq!(fcv(admin.run_command(asked).await.unwrap()), "7.0");
    // The driver still sees 8.0 and sends bulkWrite; the server refuses it, writing nothing.
    let error = client
        .bulk_write(vec![insert(coll.namespace(), doc! {"_id": 1})])
        .await
        .unwrap_err();
    assert!(
        matches!(error.kind.as_ref(), ErrorKind::Command(c) if c.code == 115),
        "{error:?}"
    );
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 0);
}
