//! A backfill's reads and writes: its state document, the watermarks in the signal collection
//! and the database stream they are seen in, the consumer's checkpoint started at the stream's
//! current position, the chunks' documents, and each chunk's commit through the transaction
//! runner. The watermark logic itself is the command's (`operate::backfill`).

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{Bson, Document, RawDocumentBuf, doc};
use mongodb::error::Error as DriverError;
use mongodb::options::ReturnDocument;
use mongodb::{ClientSession, Database};

use super::Connection;
use super::errors::{OperationError, duplicate_key};
use super::events::Events;
use super::operator::{self, First};
use super::transaction::{self, Decision, Failure};
use handoff_domain::checkpoint::Mode;

/// Where a backfill reads and writes.
#[derive(Debug, Clone)]
pub struct Names {
    pub database: String,
    /// The watched collection.
    pub collection: String,
    pub consumer: String,
    pub checkpoints: String,
    pub outbox: String,
    pub quarantine: String,
    pub signals: String,
    pub states: String,
    pub audit: String,
}

/// One of a chunk's two watermarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watermark {
    Low,
    High,
}

/// How a chunk's commit writes the state document.
pub enum StateWrite<'a> {
    /// None is saved yet: insert it (one saved meanwhile is a conflict).
    Insert,
    /// Replace the one this filter matches (none matching is a conflict).
    Replace(&'a Document),
}

/// What one chunk's transaction writes.
pub struct ChunkCommit<'a> {
    pub state: StateWrite<'a>,
    /// The state document to write, made again for each attempt (it says when it was written).
    pub next: &'a dyn Fn() -> Document,
    pub outbox: &'a [RawDocumentBuf],
    pub quarantine: &'a [RawDocumentBuf],
    /// The invocation's audit record, in its first transaction.
    pub audit: Option<&'a Document>,
}

/// A consumer's backfill on one connection.
pub struct Store<'a> {
    connection: &'a Connection,
    names: Names,
    db: Database,
}

/// Why a chunk's statements stopped.
enum Statement {
    Conflict,
    Driver(DriverError),
}

impl<'a> Store<'a> {
    pub fn new(connection: &'a Connection, names: Names) -> Store<'a> {
        let db = connection.database(&names.database);
        Store {
            connection,
            names,
            db,
        }
    }

    /// The consumer's saved state document, if any.
    pub async fn saved(&self) -> Result<Option<Document>, OperationError> {
        let n = &self.names;
        operator::consumer_document(
            self.connection,
            &n.database,
            &n.states,
            &n.consumer,
            "reading the backfill state",
        )
        .await
    }

    /// Removes the watermarks a killed invocation left behind.
    pub async fn clear_watermarks(&self) -> Result<(), OperationError> {
        let n = &self.names;
        self.db
            .collection::<Document>(&n.signals)
            .delete_many(doc! { "consumer": &n.consumer, "kind": { "$in": ["low", "high"] } })
            .await
            .map(|_| ())
            .map_err(self.connection.failed("clearing old watermarks"))
    }

    /// The database's change stream, from now, filtered to the source and the signal
    /// collections, keeping only what the watermark logic reads.
    pub async fn watermark_stream(
        &self,
        max_await: Duration,
    ) -> Result<Events<'a>, OperationError> {
        let n = &self.names;
        Events::of_collections(
            self.connection,
            &n.database,
            &[&n.collection, &n.signals],
            max_await,
            "opening the database's change stream",
        )
        .await
    }

    /// The consumer's checkpoint, `on_insert` stored first when there is none (an upsert).
    pub async fn upsert_checkpoint(
        &self,
        on_insert: Document,
    ) -> Result<Option<Document>, OperationError> {
        self.db
            .collection::<Document>(&self.names.checkpoints)
            .find_one_and_update(
                doc! { "_id": &self.names.consumer },
                doc! { "$setOnInsert": on_insert },
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .map_err(self.connection.failed("loading the consumer's checkpoint"))
    }

    /// The post-batch resume token of the source's stream opened now, as the server sent it.
    pub async fn source_token(&self) -> Result<Option<Bson>, OperationError> {
        let n = &self.names;
        let stream = Events::now(
            self.connection,
            &n.database,
            &n.collection,
            None,
            "opening the source's change stream",
        )
        .await?;
        Ok(stream.token())
    }

    /// Sets the consumer's checkpoint of `source` to `token` (mode resumeAfter) if its token is
    /// still null; whether it was.
    pub async fn start_checkpoint(
        &self,
        source: &str,
        token: Document,
    ) -> Result<bool, OperationError> {
        let changed = self
            .db
            .collection::<Document>(&self.names.checkpoints)
            .update_one(
                doc! { "_id": &self.names.consumer, "source": source, "token": Bson::Null },
                doc! {
                    "$set": { "token": token, "mode": Mode::ResumeAfter.as_str() },
                    "$inc": { "revision": 1_i64 },
                },
            )
            .await
            .map_err(
                self.connection
                    .failed("saving the consumer's starting position"),
            )?;
        Ok(changed.matched_count == 1)
    }

    /// The consumer's checkpoint as stored.
    pub async fn checkpoint(&self) -> Result<Option<Document>, OperationError> {
        let n = &self.names;
        operator::consumer_document(
            self.connection,
            &n.database,
            &n.checkpoints,
            &n.consumer,
            "loading the consumer's checkpoint",
        )
        .await
    }

    /// The server's estimate of the source's size.
    pub async fn estimated_count(&self) -> Result<u64, OperationError> {
        let n = &self.names;
        operator::estimated_count(
            self.connection,
            &n.database,
            &n.collection,
            "counting the source's documents",
        )
        .await
    }

    /// Writes chunk `chunk`'s `which` watermark under `id`.
    pub async fn write_watermark(
        &self,
        which: Watermark,
        id: ObjectId,
        chunk: i64,
    ) -> Result<(), OperationError> {
        let (kind, what) = match which {
            Watermark::Low => ("low", "writing the low watermark"),
            Watermark::High => ("high", "writing the high watermark"),
        };
        self.db
            .collection::<Document>(&self.names.signals)
            .insert_one(
                doc! { "_id": id, "consumer": &self.names.consumer, "kind": kind, "chunk": chunk },
            )
            .await
            .map(|_| ())
            .map_err(self.connection.failed(what))
    }

    /// Removes watermarks that have served, if the server is there to do it: the signal
    /// collection need not grow with the backfill.
    pub async fn remove_watermarks(&self, ids: &[ObjectId]) {
        let _ = self
            .db
            .collection::<Document>(&self.names.signals)
            .delete_many(doc! { "_id": { "$in": ids } })
            .await;
    }

    /// The first `limit` source documents `filter` matches, by `_id`.
    pub async fn rows(
        &self,
        filter: Document,
        limit: u32,
    ) -> Result<Vec<Document>, OperationError> {
        let n = &self.names;
        let first = First { limit, batch: None };
        operator::documents(
            self.connection,
            &n.database,
            &n.collection,
            filter,
            Some(first),
            "reading the chunk",
        )
        .await
    }

    /// The chunk's records, the state's write and the audit record, in one transaction through
    /// the transaction runner; refused (nothing written) when the state is not the one the
    /// commit expects.
    pub async fn commit(&self, chunk: &ChunkCommit<'_>) -> Result<(), Failure<(), OperationError>> {
        let retries = std::sync::atomic::AtomicU32::new(0);
        let states = self.db.collection::<Document>(&self.names.states);
        transaction::run(
            self.connection,
            &states,
            &retries,
            async |session| match self.statements(session, chunk).await {
                Ok(()) => Ok(Decision::Commit(())),
                Err(Statement::Conflict) => Ok(Decision::Refuse(())),
                Err(Statement::Driver(e)) => Err(e),
            },
        )
        .await
        .map_err(|failure| failure.described("committing the chunk", self.connection))
    }

    async fn statements(
        &self,
        session: &mut ClientSession,
        chunk: &ChunkCommit<'_>,
    ) -> Result<(), Statement> {
        let n = &self.names;
        let states = self.db.collection::<Document>(&n.states);
        match chunk.state {
            StateWrite::Insert => {
                let inserted = states
                    .insert_one((chunk.next)())
                    .session(&mut *session)
                    .await;
                match inserted {
                    Ok(_) => {}
                    Err(e) if duplicate_key(&e) => return Err(Statement::Conflict),
                    Err(e) => return Err(Statement::Driver(e)),
                }
            }
            StateWrite::Replace(filter) => {
                let changed = states
                    .replace_one(filter.clone(), (chunk.next)())
                    .session(&mut *session)
                    .await
                    .map_err(Statement::Driver)?;
                if changed.matched_count != 1 {
                    return Err(Statement::Conflict);
                }
            }
        }
        for (collection, records) in [(&n.outbox, chunk.outbox), (&n.quarantine, chunk.quarantine)]
        {
            if !records.is_empty() {
                self.db
                    .collection::<RawDocumentBuf>(collection)
                    .insert_many(records)
                    .ordered(true)
                    .session(&mut *session)
                    .await
                    .map_err(Statement::Driver)?;
            }
        }
        if let Some(audit) = chunk.audit {
            self.db
                .collection::<Document>(&n.audit)
                .insert_one(audit)
                .session(&mut *session)
                .await
                .map_err(Statement::Driver)?;
        }
        Ok(())
    }
}
