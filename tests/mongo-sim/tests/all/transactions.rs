use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bson::{Bson, Document, doc};
use futures_util::FutureExt;
use mongodb::error::{ErrorKind, TRANSIENT_TRANSACTION_ERROR};

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

#[tokio::test]
async fn commit_makes_writes_visible_at_once() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("c");
    coll.insert_one(doc! {"_id": "cp", "token": null})
        .await
        .unwrap();
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    let r = coll
        .update_one(
            doc! {"_id": "cp", "token": null},
            doc! {"$set": {"token": {"_data": "82"}}},
        )
        .session(&mut s)
        .await
        .unwrap();
    assert_eq!(r.matched_count, 1);
    coll.insert_one(doc! {"_id": "out-1"})
        .session(&mut s)
        .await
        .unwrap();
    // Inside: own writes visible. Outside: nothing yet.
    assert!(
        coll.find_one(doc! {"_id": "out-1"})
            .session(&mut s)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        coll.find_one(doc! {"_id": "out-1"})
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        coll.find_one(doc! {"_id": "cp"})
            .await
            .unwrap()
            .unwrap()
            .get("token"),
        Some(&Bson::Null)
    );
    s.commit_transaction().await.unwrap();
    assert!(
        coll.find_one(doc! {"_id": "out-1"})
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        coll.find_one(doc! {"_id": "cp"})
            .await
            .unwrap()
            .unwrap()
            .get_document("token")
            .unwrap(),
        &doc! {"_data": "82"}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn abort_discards_writes() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("c");
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    coll.insert_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap();
    s.abort_transaction().await.unwrap();
    assert!(coll.find_one(doc! {"_id": 1}).await.unwrap().is_none());
    // The id is free again.
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn reads_see_the_snapshot_at_transaction_start() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("snap");
    coll.insert_one(doc! {"_id": 1, "v": 1}).await.unwrap();
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    assert_eq!(
        coll.find_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .unwrap()
            .unwrap()
            .get_i32("v")
            .unwrap(),
        1
    );
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 2}})
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    assert_eq!(
        coll.find_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .unwrap()
            .unwrap()
            .get_i32("v")
            .unwrap(),
        1
    );
    assert!(
        coll.find_one(doc! {"_id": 2})
            .session(&mut s)
            .await
            .unwrap()
            .is_none()
    );
    // Writing the document that changed after the snapshot conflicts.
    let err = coll
        .update_one(doc! {"_id": 1}, doc! {"$set": {"v": 3}})
        .session(&mut s)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(112));
    assert!(err.contains_label(TRANSIENT_TRANSACTION_ERROR));
    // The transaction is gone: the next statement is NoSuchTransaction, also transient.
    let err = coll
        .find_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(251));
    assert!(err.contains_label(TRANSIENT_TRANSACTION_ERROR));
    let _ = s.abort_transaction().await;
    assert_eq!(
        coll.find_one(doc! {"_id": 1})
            .await
            .unwrap()
            .unwrap()
            .get_i32("v")
            .unwrap(),
        2
    );
    server.shutdown().await;
}

#[tokio::test]
async fn concurrent_transactions_conflict() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("wc");
    coll.insert_one(doc! {"_id": "cp", "n": 0}).await.unwrap();
    let mut a = client.start_session().await.unwrap();
    let mut b = client.start_session().await.unwrap();
    a.start_transaction().await.unwrap();
    b.start_transaction().await.unwrap();
    coll.update_one(doc! {"_id": "cp"}, doc! {"$inc": {"n": 1}})
        .session(&mut a)
        .await
        .unwrap();
    let err = coll
        .update_one(doc! {"_id": "cp"}, doc! {"$inc": {"n": 1}})
        .session(&mut b)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(112));
    assert!(err.contains_label(TRANSIENT_TRANSACTION_ERROR));
    // Inserting the same new _id in two transactions conflicts too.
    coll.insert_one(doc! {"_id": "new"})
        .session(&mut a)
        .await
        .unwrap();
    a.commit_transaction().await.unwrap();
    let _ = b.abort_transaction().await;
    assert_eq!(
        coll.find_one(doc! {"_id": "cp"})
            .await
            .unwrap()
            .unwrap()
            .get_i32("n")
            .unwrap(),
        1
    );
    let mut c = client.start_session().await.unwrap();
    c.start_transaction().await.unwrap();
    let err = coll
        .insert_one(doc! {"_id": "new"})
        .session(&mut c)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("11000") || matches!(&*err.kind, ErrorKind::Write(_)),
        "{err}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn non_transactional_write_waits_for_the_holder() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("wait");
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 10}})
        .session(&mut s)
        .await
        .unwrap();
    let outside = coll.clone();
    let waiter = tokio::spawn(async move {
        outside
            .update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
            .await
            .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the outside write must wait for the transaction"
    );
    s.commit_transaction().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        coll.find_one(doc! {"_id": 1})
            .await
            .unwrap()
            .unwrap()
            .get_i32("n")
            .unwrap(),
        11
    );
    server.shutdown().await;
}

#[tokio::test]
async fn unknown_transaction_is_no_such_transaction() {
    let (server, client) = common::start().await;
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![3; 16] })};
    let err = client
        .database("admin")
        .run_command(doc! {"commitTransaction": 1, "lsid": lsid.clone(), "txnNumber": 9i64, "autocommit": false})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(251));
    assert!(err.contains_label(TRANSIENT_TRANSACTION_ERROR));
    let err = client
        .database("tx")
        .run_command(doc! {"find": "c", "lsid": lsid, "txnNumber": 9i64, "autocommit": false})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(251));
    server.shutdown().await;
}

#[tokio::test]
async fn commit_is_idempotent_and_events_share_one_time() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("idem");
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    coll.insert_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 2})
        .session(&mut s)
        .await
        .unwrap();
    s.commit_transaction().await.unwrap();
    // A second commit of the same transaction succeeds (the driver retries commits).
    s.commit_transaction().await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
    server.shutdown().await;
}

#[tokio::test]
async fn convenient_api_retries_an_injected_write_conflict_once() {
    let (server, client) = common::start().await;
    let db = client.database("tx");
    let checkpoints = db.collection::<Document>("checkpoints");
    let outbox = db.collection::<Document>("outbox");
    checkpoints
        .insert_one(doc! {"_id": "c1", "token": null, "source": "tx.src"})
        .await
        .unwrap();
    client
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": {"times": 1},
            "data": {"failCommands": ["insert"], "errorCode": 112},
        })
        .await
        .unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut session = client.start_session().await.unwrap();
    session
        .start_transaction()
        .and_run(
            (checkpoints.clone(), outbox.clone(), attempts.clone()),
            |session, (checkpoints, outbox, attempts)| {
                async move {
                    attempts.fetch_add(1, Ordering::SeqCst);
                    let r = checkpoints
                        .update_one(
                            doc! {"_id": "c1", "token": null, "source": "tx.src"},
                            doc! {"$set": {"token": {"_data": "8201"}, "mode": "resumeAfter"}},
                        )
                        .session(&mut *session)
                        .await?;
                    assert_eq!(r.matched_count, 1);
                    outbox
                        .insert_one(doc! {"_id": "c1/e1", "event": {"k": 1}})
                        .session(&mut *session)
                        .await?;
                    Ok(())
                }
                .boxed()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "one failed attempt, one retry"
    );
    assert_eq!(outbox.count_documents(doc! {}).await.unwrap(), 1);
    assert_eq!(
        checkpoints
            .find_one(doc! {"_id": "c1"})
            .await
            .unwrap()
            .unwrap()
            .get_document("token")
            .unwrap(),
        &doc! {"_data": "8201"}
    );
    server.shutdown().await;
}

#[tokio::test]
async fn convenient_api_retries_a_real_conflict() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("race");
    coll.insert_one(doc! {"_id": "cp", "n": 0}).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = client.clone();
        let coll = coll.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let mut s = client.start_session().await.unwrap();
                s.start_transaction()
                    .and_run(coll.clone(), |s, coll| {
                        async move {
                            coll.update_one(doc! {"_id": "cp"}, doc! {"$inc": {"n": 1}})
                                .session(&mut *s)
                                .await?;
                            Ok(())
                        }
                        .boxed()
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        coll.find_one(doc! {"_id": "cp"})
            .await
            .unwrap()
            .unwrap()
            .get_i32("n")
            .unwrap(),
        40
    );
    server.shutdown().await;
}

#[tokio::test]
async fn abandoned_transactions_expire() {
    let config = mongo_sim::Config {
        transaction_lifetime: Duration::from_millis(300),
        ..Default::default()
    };
    let (server, client) = common::start_with(config).await;
    let coll = client.database("tx").collection::<Document>("abandoned");
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 10}})
        .session(&mut s)
        .await
        .unwrap();
    // The holder never commits; the outside write proceeds once the transaction expires.
    tokio::time::timeout(
        Duration::from_secs(5),
        coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}}),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        coll.find_one(doc! {"_id": 1})
            .await
            .unwrap()
            .unwrap()
            .get_i32("n")
            .unwrap(),
        1
    );
    let err = s.commit_transaction().await.unwrap_err();
    assert_eq!(code_of(&err), Some(251));
    server.shutdown().await;
}

/// A transactional update of `{_id: 1}` in `tx.held` from a new session succeeds at once: no
/// open transaction holds the document.
async fn document_is_free(client: &mongodb::Client) {
    let coll = client.database("tx").collection::<Document>("held");
    let mut other = client.start_session().await.unwrap();
    other.start_transaction().await.unwrap();
    let updated = coll
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
        .session(&mut other)
        .await;
    assert!(updated.is_ok(), "the document is still held: {updated:?}");
    other.commit_transaction().await.unwrap();
}

/// Opens a transaction on `session` that updates `{_id: 1}` in `tx.held`.
async fn hold_document(client: &mongodb::Client, session: &mut mongodb::ClientSession) {
    let coll = client.database("tx").collection::<Document>("held");
    session.start_transaction().await.unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 10}})
        .session(&mut *session)
        .await
        .unwrap();
    // While it is open, another transaction meets a write conflict.
    let mut other = client.start_session().await.unwrap();
    other.start_transaction().await.unwrap();
    let err = coll
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
        .session(&mut other)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(112));
}

#[tokio::test]
async fn end_sessions_aborts_the_open_transaction_of_those_sessions() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("held");
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    let mut holder = client.start_session().await.unwrap();
    hold_document(&client, &mut holder).await;
    common::command(
        &client,
        "admin",
        doc! {"endSessions": [holder.id().clone()]},
    )
    .await;
    document_is_free(&client).await;
    let doc = coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
    assert_eq!(
        doc.get_i32("n").unwrap(),
        1,
        "the ended transaction's write is gone"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_new_transaction_number_aborts_the_open_one_after_a_failed_commit() {
    let (server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("held");
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    let mut holder = client.start_session().await.unwrap();
    hold_document(&client, &mut holder).await;
    // The commit fails in front of the command: the transaction stays open on the server, and
    // the driver no longer allows abortTransaction.
    common::command(
        &client,
        "admin",
        doc! {"configureFailPoint": "failCommand", "mode": {"times": 1},
        "data": {"failCommands": ["commitTransaction"], "errorCode": 8}},
    )
    .await;
    holder.commit_transaction().await.unwrap_err();
    assert!(holder.abort_transaction().await.is_err());
    // A new transaction number on the same session aborts the old transaction.
    holder.start_transaction().await.unwrap();
    coll.find_one(doc! {"_id": 1})
        .session(&mut holder)
        .await
        .unwrap();
    holder.abort_transaction().await.unwrap();
    document_is_free(&client).await;
    server.shutdown().await;
}

#[tokio::test]
async fn get_parameter_reports_the_transaction_lifetime_limit() {
    let config = mongo_sim::Config {
        transaction_lifetime: Duration::from_secs(42),
        ..Default::default()
    };
    let (server, client) = common::start_with(config).await;
    let reply = common::command(
        &client,
        "admin",
        doc! {"getParameter": 1, "transactionLifetimeLimitSeconds": 1},
    )
    .await;
    assert_eq!(
        reply.get_i64("transactionLifetimeLimitSeconds").unwrap(),
        42
    );
    assert!(!reply.contains_key("featureCompatibilityVersion"));
    let all = common::command(&client, "admin", doc! {"getParameter": "*"}).await;
    assert_eq!(all.get_i64("transactionLifetimeLimitSeconds").unwrap(), 42);
    let unknown = client
        .database("admin")
        .run_command(doc! {"getParameter": 1, "noSuchParameter": 1})
        .await
        .unwrap_err();
    assert_eq!(code_of(&unknown), Some(72));
    server.shutdown().await;
}

#[tokio::test]
async fn commit_asking_more_members_than_the_set_has_is_an_unsatisfiable_write_concern() {
    use mongodb::error::{UNKNOWN_TRANSACTION_COMMIT_RESULT, WriteFailure};
    use mongodb::options::{Acknowledgment, WriteConcern};

    let (_server, client) = common::start().await;
    let coll = client.database("tx").collection::<Document>("wc");
    let mut s = client.start_session().await.unwrap();
    s.start_transaction()
        .write_concern(WriteConcern::builder().w(Acknowledgment::Nodes(10)).build())
        .await
        .unwrap();
    coll.insert_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap();
    let err = s.commit_transaction().await.unwrap_err();
    let code = match &*err.kind {
        ErrorKind::Write(WriteFailure::WriteConcernError(wce)) => Some(wce.code),
        _ => code_of(&err),
    };
    assert_eq!(code, Some(100), "{err}");
    assert!(!err.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT));
    assert!(!err.contains_label(TRANSIENT_TRANSACTION_ERROR));
    // The transaction committed all the same.
    assert!(coll.find_one(doc! {"_id": 1}).await.unwrap().is_some());
}

#[tokio::test]
async fn write_concerns_one_member_cannot_satisfy_are_reported_after_the_write() {
    let (_server, client) = common::start().await;
    let insert = |id: i32, w: Bson| {
        doc! {"insert": "wc", "documents": [{"_id": id}], "writeConcern": {"w": w}}
    };
    let reply = common::command(&client, "tx", insert(1, Bson::Int32(2))).await;
    assert_eq!(reply.get_i32("n").ok(), Some(1));
    let wce = reply.get_document("writeConcernError").unwrap();
    assert_eq!(wce.get_i32("code").ok(), Some(100));
    assert_eq!(
        wce.get_str("codeName").ok(),
        Some("UnsatisfiableWriteConcern")
    );

    let reply = common::command(&client, "tx", insert(2, Bson::String("dc".into()))).await;
    assert_eq!(reply.get_i32("n").ok(), Some(1));
    let wce = reply.get_document("writeConcernError").unwrap();
    assert_eq!(wce.get_i32("code").ok(), Some(79));

    for (id, w) in [(3, Bson::Int32(1)), (4, Bson::String("majority".into()))] {
        let reply = common::command(&client, "tx", insert(id, w)).await;
        assert!(!reply.contains_key("writeConcernError"), "{reply}");
    }
    let coll = client.database("tx").collection::<Document>("wc");
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 4);
}

async fn collection_names(client: &mongodb::Client) -> Vec<String> {
    client
        .database("ddl")
        .list_collection_names()
        .await
        .unwrap()
}

async fn index_names(client: &mongodb::Client) -> Vec<String> {
    client
        .database("ddl")
        .collection::<Document>("c")
        .list_index_names()
        .await
        .unwrap_or_default()
}

#[tokio::test]
async fn a_collection_created_in_a_transaction_appears_when_it_commits() {
    let (_server, client) = common::start().await;
    let db = client.database("ddl");

    // Explicitly, with an index.
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    db.create_collection("c").session(&mut s).await.unwrap();
    db.collection::<Document>("c")
        .create_index(
            mongodb::IndexModel::builder()
                .keys(doc! {"x": 1})
                .options(
                    mongodb::options::IndexOptions::builder()
                        .name("x_1".to_string())
                        .build(),
                )
                .build(),
        )
        .session(&mut s)
        .await
        .unwrap();
    assert!(collection_names(&client).await.is_empty());
    assert!(!index_names(&client).await.contains(&"x_1".to_string()));
    s.commit_transaction().await.unwrap();
    assert_eq!(collection_names(&client).await, vec!["c".to_string()]);
    assert!(index_names(&client).await.contains(&"x_1".to_string()));

    // A committed collection takes no new index inside a transaction.
    s.start_transaction().await.unwrap();
    let err = db
        .collection::<Document>("c")
        .create_index(mongodb::IndexModel::builder().keys(doc! {"y": 1}).build())
        .session(&mut s)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(263), "{err}");
    s.abort_transaction().await.ok();

    // Implicitly, by a first insert; gone again when the transaction aborts.
    let coll = db.collection::<Document>("d");
    s.start_transaction().await.unwrap();
    coll.insert_one(doc! {"_id": 1})
        .session(&mut s)
        .await
        .unwrap();
    assert_eq!(collection_names(&client).await, vec!["c".to_string()]);
    s.abort_transaction().await.unwrap();
    assert_eq!(collection_names(&client).await, vec!["c".to_string()]);

    // A write from outside waits for the transaction that is creating the collection.
    s.start_transaction().await.unwrap();
    coll.insert_one(doc! {"_id": 2})
        .session(&mut s)
        .await
        .unwrap();
    let outside = tokio::spawn({
        let coll = coll.clone();
        async move { coll.insert_one(doc! {"_id": 3}).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!outside.is_finished());
    s.commit_transaction().await.unwrap();
    outside.await.unwrap().unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
}
