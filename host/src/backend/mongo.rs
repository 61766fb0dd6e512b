//! MongoDB through the official driver: the live change stream and the checkpoint + outbox
//! transaction.
//!
//! The driver is async; the policy runtime is not. A connection owns a small tokio runtime and
//! every trait method blocks on it, so the policy's host calls stay plain function calls.
//!
//! What the baseline task does, in its order: URI scheme check, a 3 s server selection timeout,
//! `hello` must name a replica set, `replSetGetConfig` must give `settings.replicaSetId`. The stream
//! uses `fullDocument: updateLookup` and a 1 s max await. Each commit is one transaction
//! (checkpoint compare-and-set on `{_id, token, source}` + outbox insert), retried on
//! `TransientTransactionError` and `UnknownTransactionCommitResult` a bounded number of times.
//! Change events are kept as the BSON documents the server sent, never rebuilt through JSON.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;
use mongodb::error::{
    Error as DriverError, ErrorKind, TRANSIENT_TRANSACTION_ERROR,
    UNKNOWN_TRANSACTION_COMMIT_RESULT, WriteFailure,
};
use mongodb::options::{ClientOptions, FullDocumentType};
use mongodb::{Client, Collection};

use super::{
    ChangeSource, CheckpointStore, Collections, Commit, CommitError, Deployment, Dump, ServerError,
    StreamError, StreamStart,
};
use crate::error::{HandoffError, Result};

/// The change stream's await bound (`maxAwaitTimeMS`), as the baseline sets it.
pub const MAX_AWAIT: Duration = Duration::from_secs(1);
/// Server selection timeout, as the baseline sets it.
pub const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts of one commit on `UnknownTransactionCommitResult`.
pub const TRANSACTION_ATTEMPTS: u32 = 5;
/// How long one transaction is retried on `TransientTransactionError` (e.g. a write conflict with
/// a transaction that a killed run left open), with exponential backoff up to 1 s.
pub const TRANSIENT_RETRY_WINDOW: Duration = Duration::from_secs(15);

/// A client, its runtime, and the deployment identity checked at connection.
pub struct Connection {
    runtime: tokio::runtime::Runtime,
    client: Client,
    deployment: Deployment,
    redactor: Redactor,
    /// No call to the server outlives this instant (the run's deadline).
    deadline: std::sync::OnceLock<Instant>,
}

/// The run's deadline passed while a call to the server was under way.
#[derive(Debug)]
pub struct DeadlinePassed;

/// What an interrupted transaction means for the operator.
const DEADLINE_IN_COMMIT: &str = "the run deadline passed while a transaction was in flight; its outcome is unknown, \
     and the next run resumes from whatever was committed";

/// Removes a URI's credentials from any text before it is printed or logged.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    pub fn for_uri(uri: &str) -> Redactor {
        let mut secrets = Vec::new();
        if let Some((_, rest)) = uri.split_once("://") {
            let authority = rest.split(['/', '?']).next().unwrap_or("");
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                secrets.push(userinfo.to_string());
                for part in userinfo.split(':') {
                    if part.len() >= 3 {
                        secrets.push(part.to_string());
                        if let Ok(decoded) =
                            percent_encoding::percent_decode_str(part).decode_utf8()
                        {
                            secrets.push(decoded.into_owned());
                        }
                    }
                }
            }
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    pub fn clean(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in &self.secrets {
            if !secret.is_empty() {
                text = text.replace(secret.as_str(), "***");
            }
        }
        text
    }
}

/// The server's view of a driver error: code, code name and message (credentials removed).
fn server_error(error: &DriverError, redactor: &Redactor) -> ServerError {
    let (code, code_name, message) = match error.kind.as_ref() {
        ErrorKind::Command(e) => (Some(e.code), e.code_name.clone(), e.message.clone()),
        ErrorKind::Write(WriteFailure::WriteError(e)) => (
            Some(e.code),
            e.code_name.clone().unwrap_or_default(),
            e.message.clone(),
        ),
        ErrorKind::Write(WriteFailure::WriteConcernError(e)) => {
            (Some(e.code), e.code_name.clone(), e.message.clone())
        }
        ErrorKind::ServerSelection { message, .. } => {
            (None, "ServerSelectionError".into(), message.clone())
        }
        ErrorKind::Io(e) => (None, "NetworkError".into(), e.to_string()),
        ErrorKind::Authentication { message, .. } => {
            (None, "AuthenticationFailed".into(), message.clone())
        }
        _ => (None, "DriverError".into(), error.to_string()),
    };
    ServerError {
        code,
        code_name: if code_name.is_empty() {
            "MongoError".into()
        } else {
            code_name
        },
        message: redactor.clean(&message),
    }
}

fn classify_stream(error: &DriverError, redactor: &Redactor) -> StreamError {
    let detail = server_error(error, redactor);
    match detail.code {
        Some(286) | Some(260) | Some(280) => StreamError::from_server(detail),
        Some(_) if error.contains_label("NonResumableChangeStreamError") => {
            StreamError::Fatal(detail)
        }
        _ => StreamError::Unavailable(detail),
    }
}

/// Fails connection-time errors into the run's classes.
fn classify_connect(error: &DriverError, redactor: &Redactor) -> HandoffError {
    let detail = server_error(error, redactor);
    match error.kind.as_ref() {
        ErrorKind::Authentication { .. } => {
            HandoffError::Authentication(format!("MongoDB refused the credentials: {detail}"))
        }
        ErrorKind::Command(e) if e.code == 18 || e.code == 13 => {
            HandoffError::Authentication(format!("MongoDB refused the credentials: {detail}"))
        }
        _ => HandoffError::Unavailable(format!(
            "Cannot reach a MongoDB server (server selection timed out after {} s or the connection failed): {detail}",
            SERVER_SELECTION_TIMEOUT.as_secs()
        )),
    }
}

impl Connection {
    /// Connects and checks the deployment exactly as the baseline does. Nothing is written.
    pub fn connect(uri: &str) -> Result<Arc<Connection>> {
        if !(uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://")) {
            return Err(HandoffError::BadInput(
                "MONGODB_URI must be a MongoDB connection URI".into(),
            ));
        }
        let redactor = Redactor::for_uri(uri);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mongodb")
            .enable_all()
            .build()
            .map_err(|e| HandoffError::Internal(e.into()))?;
        let mut options = runtime
            .block_on(async { ClientOptions::parse(uri).await })
            .map_err(|e| {
                HandoffError::BadInput(format!(
                    "MONGODB_URI is not a valid MongoDB connection string: {}",
                    redactor.clean(&e.to_string())
                ))
            })?;
        options.server_selection_timeout = Some(SERVER_SELECTION_TIMEOUT);
        options.retry_writes = Some(true);
        options.app_name = Some("handoff".into());
        // The driver spawns its monitors on the runtime it is created in.
        let _context = runtime.enter();
        let client = Client::with_options(options).map_err(|e| {
            HandoffError::BadInput(format!(
                "MONGODB_URI is not usable: {}",
                redactor.clean(&e.to_string())
            ))
        })?;
        let admin = client.database("admin");
        let hello = runtime
            .block_on(async { admin.run_command(doc! { "hello": 1 }).await })
            .map_err(|e| classify_connect(&e, &redactor))?;
        let set_name = match hello.get_str("setName") {
            Ok(name) if !name.is_empty() => name.to_string(),
            _ => {
                return Err(HandoffError::BadInput(
                    "This blueprint requires a MongoDB replica set, not a standalone server or mongos".into(),
                ));
            }
        };
        let config = runtime
            .block_on(async { admin.run_command(doc! { "replSetGetConfig": 1 }).await })
            .map_err(|e| classify_connect(&e, &redactor))?;
        let replica_set_id = config
            .get_document("config")
            .ok()
            .and_then(|c| c.get_document("settings").ok())
            .and_then(|s| s.get("replicaSetId"))
            .map(|id| match id {
                Bson::ObjectId(oid) => oid.to_hex(),
                Bson::String(s) => s.clone(),
                other => other.to_string(),
            })
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                HandoffError::Mismatch(
                    "The replica set did not return replicaSetId; cannot pin the checkpoint to this deployment".into(),
                )
            })?;
        tracing::info!(set_name = %set_name, "connected to the replica set");
        Ok(Arc::new(Connection {
            runtime,
            client,
            deployment: Deployment {
                set_name,
                replica_set_id,
            },
            redactor,
            deadline: std::sync::OnceLock::new(),
        }))
    }

    pub fn deployment(&self) -> &Deployment {
        &self.deployment
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Bounds every later call to the server by `deadline` (set once, by the run).
    pub fn limit_to(&self, deadline: Instant) {
        let _ = self.deadline.set(deadline);
    }

    /// Runs `future`, giving up when the run's deadline passes.
    pub fn bounded<F: std::future::Future>(
        &self,
        future: F,
    ) -> std::result::Result<F::Output, DeadlinePassed> {
        match self.deadline.get() {
            None => Ok(self.runtime.block_on(future)),
            Some(deadline) => {
                let deadline = tokio::time::Instant::from_std(*deadline);
                // The timer needs the runtime's context, so it is made inside it.
                self.runtime
                    .block_on(async move { tokio::time::timeout_at(deadline, future).await })
                    .map_err(|_| DeadlinePassed)
            }
        }
    }
}

/// The watched collection's change stream.
pub struct MongoSource {
    connection: Arc<Connection>,
    collection: Collection<Document>,
    stream: Option<ChangeStream<Document>>,
    clock: Instant,
}

impl MongoSource {
    pub fn new(connection: Arc<Connection>, database: &str, collection: &str) -> MongoSource {
        let collection = connection.client.database(database).collection(collection);
        MongoSource {
            connection,
            collection,
            stream: None,
            clock: Instant::now(),
        }
    }
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

    fn open(&mut self, start: StreamStart) -> std::result::Result<(), StreamError> {
        let watch = self
            .collection
            .watch()
            .full_document(FullDocumentType::UpdateLookup)
            .max_await_time(MAX_AWAIT);
        let watch = match start {
            StreamStart::Now => watch,
            StreamStart::ResumeAfter(token) => watch.resume_after(resume_token(token)?),
            StreamStart::StartAfter(token) => watch.start_after(resume_token(token)?),
        };
        let stream = self
            .connection
            .bounded(async { watch.await })
            .map_err(|_| deadline_passed())?
            .map_err(|e| classify_stream(&e, &self.connection.redactor))?;
        self.stream = Some(stream.with_type::<Document>());
        Ok(())
    }

    fn next(&mut self) -> std::result::Result<Option<Document>, StreamError> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(None);
        };
        let next = self
            .connection
            .bounded(stream.next_if_any())
            .map_err(|_| deadline_passed())?
            .map_err(|e| classify_stream(&e, &self.connection.redactor))?;
        if next.is_none() && !stream.is_alive() {
            // The server closed the stream (after an invalidate): nothing more will come, but the
            // await bound still holds so a policy's idle timer keeps its meaning.
            std::thread::sleep(MAX_AWAIT);
        }
        Ok(next)
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

/// The checkpoint, outbox and quarantine collections.
pub struct MongoStore {
    connection: Arc<Connection>,
    checkpoints: Collection<Document>,
    outbox: Collection<Document>,
    quarantine: Collection<Document>,
}

impl MongoStore {
    pub fn new(
        connection: Arc<Connection>,
        database: &str,
        collections: &Collections,
    ) -> MongoStore {
        let db = connection.client.database(database);
        MongoStore {
            checkpoints: db.collection(&collections.checkpoints),
            outbox: db.collection(&collections.outbox),
            quarantine: db.collection(&collections.quarantine),
            connection,
        }
    }

    fn unavailable(&self, error: &DriverError) -> CommitError {
        CommitError::Unavailable(server_error(error, &self.connection.redactor).to_string())
    }

    /// One attempt of the transaction. `Err(Ok(e))` is a failure to retry, `Err(Err(e))` a final one.
    async fn attempt(&self, commit: &Commit<'_>) -> std::result::Result<(), Attempt> {
        let mut session = self
            .connection
            .client
            .start_session()
            .await
            .map_err(Attempt::from)?;
        session.start_transaction().await.map_err(Attempt::from)?;
        let expected = commit
            .expected
            .map_or(Bson::Null, |t| Bson::Document(t.clone()));
        let filter = doc! { "_id": &commit.consumer.consumer, "token": expected, "source": &commit.consumer.source };
        let update =
            doc! { "$set": { "token": commit.next.clone(), "mode": commit.mode.as_str() } };
        let changed = match self
            .checkpoints
            .update_one(filter, update)
            .session(&mut session)
            .await
        {
            Ok(changed) => changed,
            Err(e) => {
                let _ = session.abort_transaction().await;
                return Err(Attempt::from(e));
            }
        };
        if changed.matched_count != 1 {
            let _ = session.abort_transaction().await;
            return Err(Attempt::Final(CommitError::Conflict));
        }
        for (collection, records) in [
            (&self.outbox, &commit.outbox),
            (&self.quarantine, &commit.quarantine),
        ] {
            for record in records {
                if let Err(e) = collection.insert_one(record).session(&mut session).await {
                    let _ = session.abort_transaction().await;
                    if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
                        return Err(Attempt::Transient(e));
                    }
                    if matches!(e.kind.as_ref(), ErrorKind::Write(WriteFailure::WriteError(w)) if w.code == 11000)
                        || matches!(e.kind.as_ref(), ErrorKind::Command(c) if c.code == 11000)
                    {
                        let id = record.get_str("_id").unwrap_or("").to_string();
                        return Err(Attempt::Final(CommitError::Duplicate(id)));
                    }
                    return Err(Attempt::Driver(e));
                }
            }
        }
        let mut commits = 0;
        loop {
            commits += 1;
            match session.commit_transaction().await {
                Ok(()) => return Ok(()),
                Err(e)
                    if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT)
                        && commits < TRANSACTION_ATTEMPTS =>
                {
                    tracing::warn!(
                        attempt = commits,
                        "commit result unknown; retrying the commit"
                    );
                }
                Err(e) => return Err(Attempt::from(e)),
            }
        }
    }
}

enum Attempt {
    Transient(DriverError),
    Driver(DriverError),
    Final(CommitError),
}

impl From<DriverError> for Attempt {
    fn from(e: DriverError) -> Attempt {
        if e.contains_label(TRANSIENT_TRANSACTION_ERROR) {
            Attempt::Transient(e)
        } else {
            Attempt::Driver(e)
        }
    }
}

impl CheckpointStore for MongoStore {
    fn ensure_checkpoint(
        &self,
        consumer: &str,
        initial: Document,
    ) -> std::result::Result<Document, CommitError> {
        let mut on_insert = initial;
        on_insert.remove("_id");
        self.connection
            .bounded(async {
                self.checkpoints
                    .update_one(doc! { "_id": consumer }, doc! { "$setOnInsert": on_insert })
                    .upsert(true)
                    .await
                    .map_err(|e| self.unavailable(&e))?;
                self.checkpoints
                    .find_one(doc! { "_id": consumer })
                    .await
                    .map_err(|e| self.unavailable(&e))?
                    .ok_or_else(|| {
                        CommitError::Unavailable("the checkpoint vanished after its upsert".into())
                    })
            })
            .map_err(|_| {
                CommitError::Unavailable(
                    "the run deadline passed while loading the checkpoint".into(),
                )
            })?
    }

    fn commit(&self, commit: &Commit<'_>) -> std::result::Result<(), CommitError> {
        let retried = async {
            let started = Instant::now();
            let mut attempt: u32 = 0;
            loop {
                attempt += 1;
                match self.attempt(commit).await {
                    Ok(()) => return Ok(()),
                    Err(Attempt::Final(e)) => return Err(e),
                    Err(Attempt::Transient(e)) if started.elapsed() < TRANSIENT_RETRY_WINDOW => {
                        let code = server_error(&e, &self.connection.redactor).code;
                        tracing::warn!(attempt, ?code, "transient transaction error; retrying");
                        let backoff = Duration::from_millis(10 << attempt.min(7));
                        tokio::time::sleep(backoff.min(Duration::from_secs(1))).await;
                    }
                    Err(Attempt::Transient(e) | Attempt::Driver(e)) => {
                        return Err(self.unavailable(&e));
                    }
                }
            }
        };
        self.connection
            .bounded(retried)
            .map_err(|_| CommitError::Unavailable(DEADLINE_IN_COMMIT.into()))?
    }

    fn dump(&self, consumer: &str) -> std::result::Result<Dump, CommitError> {
        use futures_util::TryStreamExt;
        self.connection.block_on(async {
            let checkpoint = self
                .checkpoints
                .find_one(doc! { "_id": consumer })
                .await
                .map_err(|e| self.unavailable(&e))?;
            let mut records = Vec::new();
            for collection in [&self.outbox, &self.quarantine] {
                let found: Vec<Document> = collection
                    .find(doc! { "consumer": consumer })
                    .await
                    .map_err(|e| self.unavailable(&e))?
                    .try_collect()
                    .await
                    .map_err(|e| self.unavailable(&e))?;
                records.push(found);
            }
            let quarantine = records.pop().unwrap_or_default();
            let outbox = records.pop().unwrap_or_default();
            Ok(Dump {
                checkpoint,
                outbox,
                quarantine,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_survive_redaction() {
        let r = Redactor::for_uri("mongodb://app:s3cr%40t@db.example:27017/?replicaSet=rs0");
        let text = "auth failed for app:s3cr%40t and s3cr@t at db.example";
        let clean = r.clean(text);
        assert!(!clean.contains("s3cr"), "{clean}");
        assert!(clean.contains("db.example"));
        assert_eq!(Redactor::for_uri("mongodb://localhost/").clean("x"), "x");
    }
}
