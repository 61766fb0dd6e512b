//! Change streams an operator's command reads itself: the current position of a collection's
//! stream, the keys changed after a checkpoint (reconcile's in-flight keys) and the events a
//! backfill's watermarks are seen among. Events come out as plain documents and positions as
//! the tokens the server sent; the driver's stream and resume token stay here.

use std::time::Duration;

use bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;

use super::Connection;
use super::errors::OperationError;
use handoff_domain::checkpoint::Mode;

/// Where a stream resumes: a checkpoint's token, as the server takes it, and its mode.
pub struct Resume {
    token: ResumeToken,
    mode: Mode,
}

impl Resume {
    /// `None` when `token` cannot be given to the server as a resume token.
    pub fn of(token: &Document, mode: Mode) -> Option<Resume> {
        let token = bson::deserialize_from_bson(Bson::Document(token.clone())).ok()?;
        Some(Resume { token, mode })
    }
}

/// A change stream an operator's command opened.
pub struct Events<'a> {
    connection: &'a Connection,
    stream: ChangeStream<Document>,
}

impl<'a> Events<'a> {
    /// `collection`'s stream from now, each read waiting at most `max_await` when given.
    pub async fn now(
        connection: &'a Connection,
        database: &str,
        collection: &str,
        max_await: Option<Duration>,
        what: &'static str,
    ) -> Result<Events<'a>, OperationError> {
        Events::of_collection(
            connection,
            database,
            collection,
            Vec::new(),
            max_await,
            None,
            what,
        )
        .await
    }

    /// `collection`'s events from `from` on, each projected to its key (`documentKey`) and
    /// operation (`operationType`), each read waiting at most `max_await`.
    pub async fn keys_after(
        connection: &'a Connection,
        database: &str,
        collection: &str,
        from: Resume,
        max_await: Duration,
        what: &'static str,
    ) -> Result<Events<'a>, OperationError> {
        let keys = vec![doc! { "$project": { "documentKey": 1, "operationType": 1 } }];
        Events::of_collection(
            connection,
            database,
            collection,
            keys,
            Some(max_await),
            Some(from),
            what,
        )
        .await
    }

    /// `collection`'s stream through `pipeline`, from now or from `from`.
    pub(crate) async fn of_collection(
        connection: &'a Connection,
        database: &str,
        collection: &str,
        pipeline: Vec<Document>,
        max_await: Option<Duration>,
        from: Option<Resume>,
        what: &'static str,
    ) -> Result<Events<'a>, OperationError> {
        let source = connection
            .database(database)
            .collection::<Document>(collection);
        let watch = source.watch().pipeline(pipeline);
        let watch = match max_await {
            Some(max_await) => watch.max_await_time(max_await),
            None => watch,
        };
        let watch = match from {
            None => watch,
            Some(from) => match from.mode {
                Mode::ResumeAfter => watch.resume_after(from.token),
                Mode::StartAfter => watch.start_after(from.token),
            },
        };
        let stream = watch.await.map_err(connection.failed(what))?;
        Ok(Events {
            connection,
            stream: stream.with_type::<Document>(),
        })
    }

    /// The events of `collections` in `database`'s stream from now, each projected to what a
    /// watermark's reader needs (`operationType`, `ns`, `documentKey`, `clusterTime`), each read
    /// waiting at most `max_await`.
    pub async fn of_collections(
        connection: &'a Connection,
        database: &str,
        collections: &[&str],
        max_await: Duration,
        what: &'static str,
    ) -> Result<Events<'a>, OperationError> {
        let stream = connection
            .database(database)
            .watch()
            .pipeline([
                doc! { "$match": { "ns.coll": { "$in": collections } } },
                doc! { "$project": { "operationType": 1, "ns": 1, "documentKey": 1, "clusterTime": 1 } },
            ])
            .max_await_time(max_await)
            .await
            .map_err(connection.failed(what))?;
        Ok(Events {
            connection,
            stream: stream.with_type::<Document>(),
        })
    }

    /// The stream's post-batch resume token as the server sent it (`None`: none yet; one that
    /// does not convert is told as null, which is no token either).
    pub fn token(&self) -> Option<Bson> {
        let token = self.stream.resume_token()?;
        Some(bson::serialize_to_bson(&token).unwrap_or(Bson::Null))
    }

    /// The next event, if one comes within the stream's await bound.
    pub async fn next(&mut self, what: &'static str) -> Result<Option<Document>, OperationError> {
        self.stream
            .next_if_any()
            .await
            .map_err(self.connection.failed(what))
    }

    /// Whether the stream can still give events (an invalidation ends it).
    pub fn is_alive(&self) -> bool {
        self.stream.is_alive()
    }
}
