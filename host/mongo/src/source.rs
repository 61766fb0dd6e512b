//! The watched change stream, opened as the run's stream configuration says (the baseline's:
//! one collection with `fullDocument: updateLookup`) with the baseline's await bound, every call
//! bounded by the run's deadline.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Instant;

use bson::{Bson, Document, RawDocumentBuf, doc};
use futures_util::TryStreamExt;
use mongodb::Collection;
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;
use mongodb::options::{FullDocumentBeforeChangeType, FullDocumentType, ReadConcern};

use super::MAX_AWAIT;
use super::connection::Connection;
use super::errors::classify_stream;
use handoff_domain::config::{BeforeChange, FullDocument, Scope};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::state::{MAX_REGISTERED, REGISTRY, StateCollections, registered_names};
use handoff_domain::stream::check_bson;
use handoff_domain::text::did_you_mean;
use handoff_domain::{
    ChangeSource, Collections, Deployment, ServerError, Start, StreamConfig, StreamError,
};

/// The watched collection's (database's, deployment's) change stream.
pub struct MongoSource {
    connection: Arc<Connection>,
    collection: Collection<Document>,
    config: StreamConfig,
    /// The state collections known so far (a wide stream leaves them out).
    state: StateCollections,
    /// Events as the server encoded them: their size is known without encoding them again, and
    /// they are decoded once, directly.
    stream: Option<ChangeStream<RawDocumentBuf>>,
    clock: Instant,
    /// How long the server holds a `getMore` for new events (`maxAwaitTimeMS`).
    await_bound: std::time::Duration,
}

impl MongoSource {
    /// The stream `config` describes, around `collection` of `database`, leaving out handoff's
    /// state collections ([`handoff_domain::state`]) when it watches more than one collection.
    pub fn new(
        connection: Arc<Connection>,
        database: &str,
        collection: &str,
        own: &Collections,
        config: &StreamConfig,
    ) -> MongoSource {
        let state = StateCollections::new(
            database,
            &[
                own.checkpoints.as_str(),
                own.outbox.as_str(),
                own.quarantine.as_str(),
            ],
        );
        let collection = connection.database(database).collection(collection);
        MongoSource {
            connection,
            collection,
            config: config.clone(),
            state,
            stream: None,
            clock: Instant::now(),
            await_bound: MAX_AWAIT,
        }
    }

    /// Holds each `getMore` at most `bound` for new events (the baseline's is [`MAX_AWAIT`]).
    pub fn with_await(mut self, bound: std::time::Duration) -> MongoSource {
        self.await_bound = bound;
        self
    }

    /// For a wide stream, the registries of the databases it watches, read before it opens so
    /// that the server leaves out every state collection they list.
    fn read_registries(&mut self) -> std::result::Result<(), StreamError> {
        let databases = match self.config.scope {
            Scope::Collection => return Ok(()),
            Scope::Database => vec![self.collection.namespace().db],
            Scope::Deployment => {
                let listed: Vec<String> = self
                    .connection
                    .bounded(self.connection.client.list_database_names().into_future())
                    .map_err(|_| deadline_passed())?
                    .map_err(|e| classify_stream(&e, &self.connection.redactor))?;
                listed
                    .into_iter()
                    .filter(|name| !["admin", "config", "local"].contains(&name.as_str()))
                    .collect()
            }
        };
        let connection = self.connection.clone();
        let reads = databases.iter().map(|database| {
            let connection = connection.clone();
            async move { registry_names(&connection, database).await }
        });
        let registries = self
            .connection
            .bounded(futures_util::future::try_join_all(reads))
            .map_err(|_| deadline_passed())?
            .map_err(|e| classify_stream(&e, &self.connection.redactor))?;
        for (database, names) in databases.iter().zip(registries) {
            self.state.learn(database, names);
        }
        Ok(())
    }

    /// Refuses a source MongoDB opens no change stream on (a view, a time-series collection)
    /// before anything is written. `listCollections` with `nameOnly` and `authorizedCollections`
    /// needs no privilege beyond those on the collection itself; a server that still refuses it
    /// leaves the question to the stream's opening.
    pub fn check_watchable(&self) -> Result<()> {
        if self.config.scope != Scope::Collection {
            return Ok(());
        }
        let namespace = self.collection.namespace();
        let database = self.connection.database(&namespace.db);
        let command = doc! {
            "listCollections": 1,
            "filter": { "name": &namespace.coll },
            "nameOnly": true,
            "authorizedCollections": true,
        };
        let reply = self
            .connection
            .bounded(async { database.run_command(command).await })
            .map_err(|_| {
                HandoffError::Unavailable(
                    "the run deadline passed while checking the watched collection".into(),
                )
            })?;
        let reply = match reply.map_err(|e| classify_stream(&e, &self.connection.redactor)) {
            Ok(reply) => reply,
            Err(StreamError::Fatal(detail)) => {
                tracing::debug!(code = ?detail.code, "the collection's type could not be checked");
                return Ok(());
            }
            Err(other) => {
                return Err(HandoffError::Unavailable(format!(
                    "Cannot check the watched collection: {other}"
                )));
            }
        };
        let spec = reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .and_then(|batch| batch.first())
            .and_then(Bson::as_document);
        if spec.is_none() {
            self.warn_missing(&namespace.db, &namespace.coll);
        }
        let kind = spec
            .and_then(|spec| spec.get_str("type").ok())
            .unwrap_or("collection");
        // A stream that requires images fails at its first update without them: say so now.
        let requires = [
            (self.config.full_document == FullDocument::Required).then_some("--full-document"),
            (self.config.before_change == BeforeChange::Required)
                .then_some("--full-document-before-change"),
        ];
        if let Some(flag) = requires.iter().flatten().next()
            && spec.is_some()
            && kind == "collection"
            && self.records_images(&namespace.db, &namespace.coll) == Some(false)
        {
            return Err(HandoffError::ImageMissing(format!(
                "{flag} required needs the images MongoDB records only for a collection with \
                 changeStreamPreAndPostImages enabled, and {namespace} does not record them: \
                 enable it (db.runCommand({{collMod: \"{coll}\", changeStreamPreAndPostImages: \
                 {{enabled: true}}}})) or choose whenAvailable. Nothing was read or written",
                coll = namespace.coll
            )));
        }
        match kind {
            "view" => Err(HandoffError::BadInput(format!(
                "{namespace} is a view: MongoDB opens no change stream on a view. Watch the \
                 collection it reads from instead"
            ))),
            "timeseries" => Err(HandoffError::BadInput(format!(
                "{namespace} is a time-series collection: MongoDB opens no change stream on \
                 time-series collections. Watch a regular collection instead"
            ))),
            _ => Ok(()),
        }
    }
}

impl MongoSource {
    /// Whether the collection records pre- and post-images (`changeStreamPreAndPostImages`);
    /// `None` when its options cannot be read (`listCollections` without `nameOnly` needs that
    /// privilege on the database): the stream's first event without one says so instead.
    fn records_images(&self, database: &str, collection: &str) -> Option<bool> {
        let db = self.connection.database(database);
        let command = doc! { "listCollections": 1, "filter": { "name": collection } };
        let reply = self
            .connection
            .bounded(async { db.run_command(command).await })
            .ok()?
            .map_err(|_| tracing::debug!("the collection's options could not be read"))
            .ok()?;
        let spec = reply
            .get_document("cursor")
            .ok()?
            .get_array("firstBatch")
            .ok()?
            .first()?
            .as_document()?
            .clone();
        Some(
            spec.get_document("options")
                .ok()
                .and_then(|o| o.get_document("changeStreamPreAndPostImages").ok())
                .and_then(|o| o.get_bool("enabled").ok())
                .unwrap_or(false),
        )
    }

    /// A watched collection that does not exist is legitimate (the stream waits for its first
    /// write), but often a typo: a warning names the near databases or collections.
    fn warn_missing(&self, database: &str, collection: &str) {
        let connection = &self.connection;
        let names = connection.bounded(async {
            let databases = crate::operator::database_names(connection).await?;
            if !databases.iter().any(|d| d == database) {
                return Some((true, databases));
            }
            let collections = connection
                .database(database)
                .list_collection_names()
                .await
                .ok()?;
            Some((false, collections))
        });
        let Ok(Some((database_missing, known))) = names else {
            return;
        };
        // Names the server sent: only printable ones are suggested.
        let known = known
            .iter()
            .map(String::as_str)
            .filter(|k| !k.chars().any(handoff_domain::text::needs_escape));
        if database_missing {
            let hint = did_you_mean(database, known);
            tracing::warn!(
                database,
                "the database {database} does not exist{hint}: the run waits for its first write, \
                 and the consumer's state creates it"
            );
        } else {
            let hint = did_you_mean(collection, known);
            tracing::warn!(
                database,
                collection,
                "the collection {database}.{collection} does not exist{hint}: the run waits for \
                 its first write"
            );
        }
    }
}

/// The state collections the registry of `database` lists.
async fn registry_names(
    connection: &Connection,
    database: &str,
) -> mongodb::error::Result<Vec<String>> {
    let documents: Vec<Document> = connection
        .database(database)
        .collection::<Document>(REGISTRY)
        .find(doc! {})
        .projection(doc! { "_id": 1 })
        .limit(MAX_REGISTERED as i64)
        .await?
        .try_collect()
        .await?;
    Ok(registered_names(documents))
}

fn deadline_passed() -> StreamError {
    StreamError::Unavailable(ServerError {
        code: None,
        code_name: "RunDeadline".into(),
        message: "the run deadline passed while waiting for the change stream".into(),
    })
}

fn resume_token(token: Document) -> std::result::Result<ResumeToken, StreamError> {
    bson::deserialize_from_bson(Bson::Document(token)).map_err(|e| {
        StreamError::InvalidToken(ServerError {
            code: None,
            code_name: "InvalidResumeToken".into(),
            message: format!("the saved token is not a resume token: {e}"),
        })
    })
}

impl ChangeSource for MongoSource {
    fn deployment(&mut self) -> Result<Deployment> {
        Ok(self.connection.deployment.clone())
    }

    fn open(&mut self, start: Start<Document>) -> std::result::Result<(), StreamError> {
        self.read_registries()?;
        let stages = self.config.stages(&self.state);
        let database = self.connection.database(&self.collection.namespace().db);
        let watch = match self.config.scope {
            Scope::Collection => self.collection.watch(),
            Scope::Database => database.watch(),
            // The client's stream follows the URI's concerns: held to those of every other read.
            Scope::Deployment => self
                .connection
                .client
                .watch()
                .read_concern(ReadConcern::majority())
                .selection_criteria(super::primary()),
        };
        let mut watch = watch.pipeline(stages).max_await_time(self.await_bound);
        watch = match self.config.full_document {
            FullDocument::Default => watch,
            FullDocument::UpdateLookup => watch.full_document(FullDocumentType::UpdateLookup),
            FullDocument::WhenAvailable => watch.full_document(FullDocumentType::WhenAvailable),
            FullDocument::Required => watch.full_document(FullDocumentType::Required),
        };
        watch = match self.config.before_change {
            BeforeChange::Off => watch,
            BeforeChange::WhenAvailable => {
                watch.full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable)
            }
            BeforeChange::Required => {
                watch.full_document_before_change(FullDocumentBeforeChangeType::Required)
            }
        };
        let watch = match start {
            Start::Now => watch,
            Start::ResumeAfter(token) => watch.resume_after(resume_token(token)?),
            Start::StartAfter(token) => watch.start_after(resume_token(token)?),
        };
        let stream = self
            .connection
            .bounded(async { watch.await })
            .map_err(|_| deadline_passed())?
            .map_err(|e| classify_stream(&e, &self.connection.redactor))?;
        self.stream = Some(stream.with_type::<RawDocumentBuf>());
        tracing::debug!(scope = self.config.scope.as_str(), "change stream opened");
        Ok(())
    }

    fn next(&mut self) -> std::result::Result<Option<Document>, StreamError> {
        let Some(raw) = self.next_raw()? else {
            return Ok(None);
        };
        Document::try_from(raw.as_ref())
            .map(Some)
            .map_err(|e| not_bson(e.to_string()))
    }

    fn next_raw(&mut self) -> std::result::Result<Option<RawDocumentBuf>, StreamError> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(None);
        };
        let next = self
            .connection
            .bounded(stream.next_if_any())
            .map_err(|_| deadline_passed())?
            .map_err(|e| classify_stream(&e, &self.connection.redactor))?;
        let Some(raw) = next else {
            if !stream.is_alive() {
                // The server closed the stream (after an invalidate): nothing more will come, but
                // the await bound still holds so a policy's idle timer keeps its meaning.
                std::thread::sleep(self.await_bound);
            }
            return Ok(None);
        };
        // The event's bytes become the outbox record's: checked whole before anything reads them.
        check_bson(&raw).map_err(not_bson)?;
        Ok(Some(raw))
    }

    fn is_wide(&self) -> bool {
        self.config.scope != Scope::Collection
    }

    fn is_state(
        &mut self,
        database: &str,
        collection: &str,
    ) -> std::result::Result<bool, StreamError> {
        if !self.is_wide() {
            return Ok(false);
        }
        let connection = self.connection.clone();
        self.state.is_state(database, collection, |database| {
            connection
                .bounded(registry_names(&connection, database))
                .map_err(|_| deadline_passed())?
                .map_err(|e| classify_stream(&e, &connection.redactor))
        })
    }

    fn watermark(&self) -> Option<Document> {
        let token = self.stream.as_ref()?.resume_token()?;
        match bson::serialize_to_bson(&token) {
            Ok(Bson::Document(doc)) => Some(doc),
            _ => None,
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }
}

/// An event the server sent that is not well-formed BSON: the run stops, nothing is committed.
fn not_bson(error: String) -> StreamError {
    // The same event comes back on every retry: the stream cannot pass it.
    StreamError::Fatal(ServerError {
        code: None,
        code_name: String::new(),
        message: format!("the change stream returned an event that is not valid BSON: {error}"),
    })
}
