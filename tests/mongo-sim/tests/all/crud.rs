use crate::common;

use bson::{Bson, Document, doc};
use futures_util::TryStreamExt;
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::ReturnDocument;

async fn ids(coll: &mongodb::Collection<Document>, filter: Document) -> Vec<Bson> {
    let mut out: Vec<Bson> = coll
        .find(filter)
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect::<Vec<Document>>()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.get("_id").cloned().unwrap())
        .collect();
    out.sort_by(mongo_sim::values::cmp_values);
    out
}

#[tokio::test]
async fn insert_and_find_with_filters() {
    let (server, client) = common::start().await;
    let coll = client.database("crud").collection::<Document>("items");
    coll.insert_many(vec![
        doc! {"_id": 1, "name": "a", "tags": ["x", "y"], "meta": {"k": 1, "v": "p"}},
        doc! {"_id": 2, "name": "b", "tags": ["y"], "meta": {"k": 2}, "opt": null},
        doc! {"_id": 3, "name": "c", "meta": {"k": 1, "v": "p"}, "list": [{"q": 1}, {"q": 2}]},
    ])
    .await
    .unwrap();
    assert_eq!(ids(&coll, doc! {"name": "b"}).await, vec![Bson::Int32(2)]);
    assert_eq!(
        ids(&coll, doc! {"meta.k": 1}).await,
        vec![Bson::Int32(1), Bson::Int32(3)]
    );
    assert_eq!(
        ids(&coll, doc! {"tags": "y"}).await,
        vec![Bson::Int32(1), Bson::Int32(2)]
    );
    assert_eq!(ids(&coll, doc! {"list.q": 2}).await, vec![Bson::Int32(3)]);
    // Embedded documents compare whole and in field order.
    assert_eq!(
        ids(&coll, doc! {"meta": {"k": 1, "v": "p"}}).await,
        vec![Bson::Int32(1), Bson::Int32(3)]
    );
    assert!(
        ids(&coll, doc! {"meta": {"v": "p", "k": 1}})
            .await
            .is_empty()
    );
    // null matches null and missing.
    assert_eq!(
        ids(&coll, doc! {"opt": null}).await,
        vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3)]
    );
    assert_eq!(ids(&coll, doc! {"tags": null}).await, vec![Bson::Int32(3)]);
    assert_eq!(
        ids(&coll, doc! {"opt": {"$exists": true}}).await,
        vec![Bson::Int32(2)]
    );
    assert_eq!(
        ids(&coll, doc! {"tags": {"$exists": false}}).await,
        vec![Bson::Int32(3)]
    );
    assert_eq!(
        ids(&coll, doc! {"_id": {"$in": [1, 3, 9]}}).await,
        vec![Bson::Int32(1), Bson::Int32(3)]
    );
    assert_eq!(
        ids(&coll, doc! {"name": {"$in": ["c", null]}}).await,
        vec![Bson::Int32(3)]
    );
    // Numbers compare across types.
    assert_eq!(ids(&coll, doc! {"_id": 2.0}).await, vec![Bson::Int32(2)]);
    let one = coll.find_one(doc! {"_id": 1i64}).await.unwrap().unwrap();
    assert_eq!(one.get_str("name").unwrap(), "a");
    assert!(coll.find_one(doc! {"_id": 42}).await.unwrap().is_none());
    let projected = coll
        .find_one(doc! {"_id": 1})
        .projection(doc! {"name": 1})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(projected, doc! {"_id": 1, "name": "a"});
    let sorted: Vec<Document> = coll
        .find(doc! {})
        .sort(doc! {"name": -1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(sorted[0].get_i32("_id").unwrap(), 3);
    // Reverse natural order: the last inserted first.
    let reversed: Vec<Document> = coll
        .find(doc! {})
        .sort(doc! {"$natural": -1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let order: Vec<i32> = reversed.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(order, [3, 2, 1]);
    assert_eq!(coll.count_documents(doc! {"meta.k": 1}).await.unwrap(), 2);
    assert_eq!(coll.estimated_document_count().await.unwrap(), 3);
    server.shutdown().await;
}

#[tokio::test]
async fn duplicate_id_is_error_11000() {
    let (server, client) = common::start().await;
    let coll = client.database("crud").collection::<Document>("dups");
    coll.insert_one(doc! {"_id": "k"}).await.unwrap();
    let err = coll.insert_one(doc! {"_id": "k"}).await.unwrap_err();
    match &*err.kind {
        ErrorKind::Write(WriteFailure::WriteError(we)) => assert_eq!(we.code, 11000),
        other => panic!("unexpected error {other:?}"),
    }
    // Generated ids are ObjectIds and come first.
    let r = coll.insert_one(doc! {"x": 1}).await.unwrap();
    assert!(matches!(r.inserted_id, Bson::ObjectId(_)));
    let d = coll.find_one(doc! {"x": 1}).await.unwrap().unwrap();
    assert_eq!(d.keys().next().unwrap(), "_id");
    server.shutdown().await;
}

#[tokio::test]
async fn update_operators_and_counts() {
    let (server, client) = common::start().await;
    let coll = client.database("crud").collection::<Document>("upd");
    coll.insert_many(vec![
        doc! {"_id": 1, "n": 1, "s": "a"},
        doc! {"_id": 2, "n": 5, "s": "a"},
    ])
    .await
    .unwrap();

    let r = coll
        .update_one(
            doc! {"_id": 1},
            doc! {"$set": {"s": "b", "deep.x": 1}, "$inc": {"n": 2}},
        )
        .await
        .unwrap();
    assert_eq!(
        (r.matched_count, r.modified_count, r.upserted_id.clone()),
        (1, 1, None)
    );
    assert_eq!(
        coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap(),
        doc! {"_id": 1, "n": 3, "s": "b", "deep": {"x": 1}}
    );

    // A no-op update matches but does not modify.
    let r = coll
        .update_one(doc! {"_id": 1}, doc! {"$set": {"s": "b"}})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 0));

    let r = coll
        .update_one(doc! {"_id": 1}, doc! {"$unset": {"deep": ""}})
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);
    assert_eq!(
        coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap(),
        doc! {"_id": 1, "n": 3, "s": "b"}
    );

    let r = coll
        .update_many(doc! {"s": {"$in": ["a", "b"]}}, doc! {"$inc": {"n": 1}})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (2, 2));

    let r = coll
        .replace_one(doc! {"_id": 2}, doc! {"only": true})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    assert_eq!(
        coll.find_one(doc! {"_id": 2}).await.unwrap().unwrap(),
        doc! {"_id": 2, "only": true}
    );

    let r = coll
        .update_one(doc! {"_id": 99}, doc! {"$set": {"a": 1}})
        .await
        .unwrap();
    assert_eq!(
        (r.matched_count, r.modified_count, r.upserted_id),
        (0, 0, None)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn upserts_with_set_on_insert() {
    let (server, client) = common::start().await;
    let coll = client
        .database("crud")
        .collection::<Document>("checkpoints");
    let update = doc! {"$setOnInsert": {"source": "db.coll", "token": null, "mode": "resumeAfter"}};
    let r = coll
        .update_one(doc! {"_id": "consumer"}, update.clone())
        .upsert(true)
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (0, 0));
    assert_eq!(r.upserted_id, Some(Bson::String("consumer".into())));
    let r = coll
        .update_one(doc! {"_id": "consumer"}, update)
        .upsert(true)
        .await
        .unwrap();
    assert_eq!(
        (r.matched_count, r.modified_count, r.upserted_id),
        (1, 0, None)
    );
    let d = coll
        .find_one(doc! {"_id": "consumer"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        d,
        doc! {"_id": "consumer", "source": "db.coll", "token": null, "mode": "resumeAfter"}
    );

    // Compare-and-set on the token, as the product does.
    let tok = doc! {"_data": "82AA"};
    let r = coll
        .update_one(
            doc! {"_id": "consumer", "token": null, "source": "db.coll"},
            doc! {"$set": {"token": tok.clone()}},
        )
        .await
        .unwrap();
    assert_eq!(r.matched_count, 1);
    let r = coll
        .update_one(
            doc! {"_id": "consumer", "token": null, "source": "db.coll"},
            doc! {"$set": {"token": tok.clone()}},
        )
        .await
        .unwrap();
    assert_eq!(r.matched_count, 0);
    let r = coll
        .update_one(
            doc! {"_id": "consumer", "token": tok.clone()},
            doc! {"$set": {"mode": "startAfter"}},
        )
        .await
        .unwrap();
    assert_eq!(r.matched_count, 1);

    // Upsert without _id in the filter generates one; equality fields seed the document.
    let r = coll
        .update_one(doc! {"k": "v", "n": {"$gt": 1}}, doc! {"$set": {"z": 1}})
        .upsert(true)
        .await
        .unwrap();
    let id = r.upserted_id.unwrap();
    assert!(matches!(id, Bson::ObjectId(_)));
    assert_eq!(
        coll.find_one(doc! {"_id": id.clone()})
            .await
            .unwrap()
            .unwrap(),
        doc! {"_id": id, "k": "v", "z": 1}
    );

    // Replacement upsert.
    let r = coll
        .replace_one(doc! {"_id": "r"}, doc! {"v": 1})
        .upsert(true)
        .await
        .unwrap();
    assert_eq!(r.upserted_id, Some(Bson::String("r".into())));
    server.shutdown().await;
}

#[tokio::test]
async fn update_errors() {
    let (server, client) = common::start().await;
    let coll = client.database("crud").collection::<Document>("errs");
    coll.insert_one(doc! {"_id": 1, "s": "x"}).await.unwrap();
    let err = coll
        .update_one(doc! {"_id": 1}, doc! {"$set": {"_id": 2}})
        .await
        .unwrap_err();
    assert!(
        matches!(&*err.kind, ErrorKind::Write(WriteFailure::WriteError(we)) if we.code == 66),
        "{err}"
    );
    let err = coll
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"s": 1}})
        .await
        .unwrap_err();
    assert!(
        matches!(&*err.kind, ErrorKind::Write(WriteFailure::WriteError(we)) if we.code == 14),
        "{err}"
    );
    let err = coll
        .update_one(doc! {"_id": 1}, doc! {"$bogus": {"s": 1}})
        .await
        .unwrap_err();
    assert!(
        matches!(&*err.kind, ErrorKind::Write(WriteFailure::WriteError(we)) if we.code == 9),
        "{err}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn deletes_and_find_and_modify() {
    let (server, client) = common::start().await;
    let coll = client.database("crud").collection::<Document>("del");
    coll.insert_many(
        (0..6)
            .map(|i| doc! {"_id": i, "even": i % 2 == 0})
            .collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    let r = coll.delete_one(doc! {"even": true}).await.unwrap();
    assert_eq!(r.deleted_count, 1);
    let r = coll.delete_many(doc! {"even": true}).await.unwrap();
    assert_eq!(r.deleted_count, 2);
    let r = coll.delete_many(doc! {"even": true}).await.unwrap();
    assert_eq!(r.deleted_count, 0);
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 3);
    let after = coll
        .find_one_and_update(doc! {"_id": 1}, doc! {"$set": {"seen": true}})
        .return_document(ReturnDocument::After)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, doc! {"_id": 1, "even": false, "seen": true});
    let before = coll
        .find_one_and_delete(doc! {"_id": 3})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(before.get_i32("_id").unwrap(), 3);
    // A deleted _id can be inserted again.
    coll.insert_one(doc! {"_id": 3}).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn retryable_write_applies_once() {
    let (server, client) = common::start().await;
    let db = client.database("crud");
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] })};
    let cmd = doc! {
        "update": "retry",
        "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}, "upsert": true}],
        "lsid": lsid.clone(),
        "txnNumber": 5i64,
    };
    let first = db.run_command(cmd.clone()).await.unwrap();
    let again = db.run_command(cmd).await.unwrap();
    assert_eq!(first.get_array("upserted").unwrap().len(), 1);
    assert_eq!(again.get_array("upserted").unwrap().len(), 1);
    let coll = db.collection::<Document>("retry");
    assert_eq!(
        coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap(),
        doc! {"_id": 1, "n": 1}
    );
    // The driver's own retryable writes work too.
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn many_concurrent_connections() {
    let (server, client) = common::start().await;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let coll = client.database("crud").collection::<Document>("conc");
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                coll.insert_one(doc! {"_id": format!("{t}-{i}")})
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let coll = client.database("crud").collection::<Document>("conc");
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 400);
    server.shutdown().await;
}

#[tokio::test]
async fn an_insert_over_16_mib_is_refused_with_bson_object_too_large() {
    let (server, client) = common::start().await;
    let mut raw = common::RawConn::connect(server.port()).await;
    let big = doc! {"_id": 1, "pad": "x".repeat(16 * 1024 * 1024)};
    let small = doc! {"_id": 2};
    let body = doc! {"insert": "big", "$db": "d", "ordered": true};
    let bytes = mongo_sim::wire::encode_op_msg_request(
        7,
        0,
        &body,
        &[("documents", &[small.clone(), big.clone()][..])],
    )
    .unwrap();
    raw.send(&bytes).await;
    let reply = raw.recv().await.expect("a reply");
    let (_, reply) = mongo_sim::wire::decode_op_msg_reply(&reply).unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 1, "{reply:?}");
    let errors = reply.get_array("writeErrors").unwrap();
    let error = errors[0].as_document().unwrap();
    assert_eq!(error.get_i32("index").unwrap(), 1);
    assert_eq!(error.get_i32("code").unwrap(), 10334);
    assert_eq!(error.get_str("codeName").unwrap(), "BSONObjectTooLarge");
    let coll = client.database("d").collection::<Document>("big");
    assert_eq!(ids(&coll, doc! {}).await, vec![Bson::Int32(2)]);
    server.shutdown().await;
}

#[tokio::test]
async fn pipeline_updates_apply_and_describe_their_changes() {
    let (_server, client) = common::start().await;
    let coll = client.database("crud").collection::<Document>("pipe");
    coll.insert_one(doc! {"_id": 1, "array": ["foo", {"a": "bar"}, 1, 2, 3], "n": 5, "gone": true})
        .await
        .unwrap();
    let stream = coll.watch().await.unwrap();
    let pipeline = vec![
        doc! {"$set": {"array": ["foo", {"a": "bar"}], "copy": "$n", "sub": {"x": 1}}},
        doc! {"$unset": ["gone"]},
    ];
    let r = coll.update_one(doc! {"_id": 1}, pipeline).await.unwrap();
    assert_eq!(r.modified_count, 1);
    assert_eq!(
        coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap(),
        doc! {"_id": 1, "array": ["foo", {"a": "bar"}], "n": 5, "copy": 5, "sub": {"x": 1}}
    );
    let event = common::next_event(&mut stream.with_type::<Document>()).await;
    let desc = event.get_document("updateDescription").unwrap();
    assert_eq!(
        desc.get_document("updatedFields").unwrap(),
        &doc! {"copy": 5, "sub": {"x": 1}}
    );
    assert_eq!(
        desc.get_array("removedFields").unwrap(),
        &vec![Bson::from("gone")]
    );
    assert_eq!(
        desc.get_array("truncatedArrays").unwrap(),
        &vec![Bson::Document(doc! {"field": "array", "newSize": 2})]
    );

    // An upsert starts from the filter; $replaceWith keeps the _id or fails with 66.
    coll.update_one(
        doc! {"_id": 2},
        vec![doc! {"$set": {"v": {"$literal": "$x"}}}],
    )
    .upsert(true)
    .await
    .unwrap();
    assert_eq!(
        coll.find_one(doc! {"_id": 2}).await.unwrap().unwrap(),
        doc! {"_id": 2, "v": "$x"}
    );
    let err = coll
        .update_one(doc! {"_id": 2}, vec![doc! {"$replaceWith": {"_id": 3}}])
        .await
        .unwrap_err();
    assert!(
        matches!(&*err.kind, ErrorKind::Write(WriteFailure::WriteError(we)) if we.code == 66),
        "{err}"
    );
    // Stages an update cannot use are refused.
    let err = coll
        .update_one(doc! {"_id": 2}, vec![doc! {"$group": {"_id": null}}])
        .await
        .unwrap_err();
    assert!(
        matches!(&*err.kind, ErrorKind::Write(WriteFailure::WriteError(we)) if we.code == 72)
            || matches!(&*err.kind, ErrorKind::Command(c) if c.code == 72),
        "{err}"
    );
}

#[tokio::test]
async fn type_finds_min_key_and_max_key_by_alias_and_number() {
    let (_server, client) = common::start().await;
    let coll = client.database("crud").collection::<Document>("bounds");
    coll.insert_many(vec![
        doc! {"_id": Bson::MinKey},
        doc! {"_id": 1},
        doc! {"_id": "a"},
        doc! {"_id": Bson::MaxKey},
    ])
    .await
    .unwrap();
    for (filter, expected) in [
        (doc! {"_id": {"$type": "minKey"}}, vec![Bson::MinKey]),
        (doc! {"_id": {"$type": -1}}, vec![Bson::MinKey]),
        (doc! {"_id": {"$type": "maxKey"}}, vec![Bson::MaxKey]),
        (doc! {"_id": {"$type": 127}}, vec![Bson::MaxKey]),
        (
            doc! {"_id": {"$type": ["maxKey", "minKey"]}},
            vec![Bson::MinKey, Bson::MaxKey],
        ),
        (
            doc! {"_id": {"$type": "minKey", "$gt": Bson::MinKey}},
            vec![],
        ),
    ] {
        assert_eq!(ids(&coll, filter.clone()).await, expected, "{filter}");
    }
    // In an aggregation's $match too.
    let matched: Vec<Document> = coll
        .aggregate(vec![doc! {"$match": {"_id": {"$type": "maxKey"}}}])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(matched, vec![doc! {"_id": Bson::MaxKey}]);
}
