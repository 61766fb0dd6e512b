//! The limit the batched runs are measured against: a plain loop on the official driver.

use std::time::Duration;

use bson::{Bson, Document, doc};
use futures_util::StreamExt;
use mongodb::Client;
use mongodb::change_stream::event::ResumeToken;
use mongodb::options::{
    FullDocumentType, InsertOneModel, ReadConcern, ReadPreference, SelectionCriteria,
    TransactionOptions, UpdateOneModel, WriteConcern, WriteModel,
};
use sha2::Digest;

use super::CHECKPOINTS;

/// The plain driver loop: the checkpoint read, the stream opened after it with the same options,
/// and per `BATCH_SIZE` events one transaction with the same compare-and-set and the same outbox
/// documents as handoff's, with the same concerns. No identity checks, no policy.
pub fn raw_loop() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let number = |name: &str| var(name).parse::<u32>().expect("a number");
    let (uri, db, consumer, outbox) = (
        var("MONGODB_URI"),
        var("SOURCE_DATABASE"),
        var("CONSUMER_ID"),
        var("OUTBOX_COLLECTION"),
    );
    let (events, batch) = (number("MAX_EVENTS"), number("BATCH_SIZE"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = Client::with_uri_str(&uri).await.expect("client");
        let db = client.database(&db);
        let source = format!("{}.orders", db.name());
        let checkpoints = db.collection::<Document>(CHECKPOINTS);
        let outbox = db.collection::<Document>(&outbox);
        let checkpoint = checkpoints
            .find_one(doc! { "_id": &consumer })
            .await
            .expect("checkpoint read")
            .expect("checkpoint");
        let mut token = checkpoint.get_document("token").expect("token").clone();
        let resume: ResumeToken =
            bson::deserialize_from_bson(Bson::Document(token.clone())).expect("token");
        let mut stream = db
            .collection::<Document>("orders")
            .watch()
            .full_document(FullDocumentType::UpdateLookup)
            .max_await_time(Duration::from_secs(1))
            .resume_after(resume)
            .await
            .expect("watch")
            .with_type::<Document>();
        let options = TransactionOptions::builder()
            .read_concern(ReadConcern::snapshot())
            .write_concern(WriteConcern::majority())
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .build();
        let mut session = client.start_session().await.expect("session");
        let mut done = 0;
        while done < events {
            let mut records = Vec::new();
            let mut last = token.clone();
            while records.len() < batch as usize && done + (records.len() as u32) < events {
                // An idle stream never ends: a missing event fails the run instead of hanging it.
                let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
                    .await
                    .expect("an event within 10 s")
                    .expect("an event")
                    .expect("event");
                last = event.get_document("_id").expect("token").clone();
                let text = handoff::domain::token::canonical_text(&last);
                let id = hex::encode(sha2::Sha256::digest(text.as_bytes()));
                records.push(doc! {
                    "_id": format!("{consumer}/{id}"),
                    "consumer": &consumer,
                    "source": &source,
                    "event": event,
                });
            }
            let count = records.len() as u32;
            session
                .start_transaction()
                .with_options(options.clone())
                .await
                .expect("transaction");
            // The compare-and-set and the records in one bulkWrite (the test server answers as
            // MongoDB 8.0), as handoff commits them there.
            let mut models: Vec<WriteModel> = vec![
                UpdateOneModel::builder()
                    .namespace(checkpoints.namespace())
                    .filter(doc! { "_id": &consumer, "token": &token, "source": &source })
                    .update(doc! { "$set": { "token": &last, "mode": "resumeAfter" } })
                    .build()
                    .into(),
            ];
            models.extend(records.into_iter().map(|record| {
                WriteModel::from(
                    InsertOneModel::builder()
                        .namespace(outbox.namespace())
                        .document(record)
                        .build(),
                )
            }));
            let written = client
                .bulk_write(models)
                .ordered(true)
                .session(&mut session)
                .await
                .expect("compare-and-set and outbox");
            assert_eq!(written.matched_count, 1, "checkpoint moved");
            session.commit_transaction().await.expect("commit");
            token = last;
            done += count;
        }
    });
}
