//! MongoDB through the official driver: the live change stream and the checkpoint + outbox
//! transaction.
//!
//! The driver is async; the policy runtime is not. A connection owns a small tokio runtime and
//! every trait method blocks on it, so the policy's host calls stay plain function calls.
//!
//! What the baseline task does, in its order: URI scheme check, a 3 s server selection timeout,
//! `hello` must name a replica set, `replSetGetConfig` must give `settings.replicaSetId`. The stream
//! uses `fullDocument: updateLookup` and a 1 s max await. Each commit is one transaction
//! (checkpoint compare-and-set on `{_id, token, source}` + one ordered `insertMany` of the outbox
//! records + one of the quarantine records), retried on `TransientTransactionError` and
//! `UnknownTransactionCommitResult` a bounded number of times; a failed attempt never leaves its
//! transaction open. Change events are kept as the BSON documents the server sent, never rebuilt
//! through JSON.
//!
//! Whatever the URI says, every read and write here goes to the primary, writes wait for a
//! majority, reads outside a transaction read majority-committed data and transactions read a
//! snapshot: the checkpoint and the outbox are only as safe as their weakest concern.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;
use mongodb::error::{
    Error as DriverError, ErrorKind, TRANSIENT_TRANSACTION_ERROR,
    UNKNOWN_TRANSACTION_COMMIT_RESULT, WriteFailure,
};
use mongodb::options::{
    ClientOptions, ConnectionString, DatabaseOptions, FullDocumentType, ReadConcern,
    ReadPreference, SelectionCriteria, TransactionOptions, WriteConcern,
};
use mongodb::{Client, ClientSession, Collection, Database};

use super::{
    BSON_OBJECT_TOO_LARGE, ChangeSource, CheckpointStore, Collections, Commit, CommitError,
    Deployment, Dump, ServerError, StreamError, StreamStart,
};
use crate::error::{HandoffError, Result};

/// The change stream's await bound (`maxAwaitTimeMS`), as the baseline sets it.
pub const MAX_AWAIT: Duration = Duration::from_secs(1);
/// Server selection timeout, as the baseline sets it.
pub const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts of one commit on `UnknownTransactionCommitResult`.
pub const TRANSACTION_ATTEMPTS: u32 = 5;
/// The server's `transactionLifetimeLimitSeconds` when it does not say (MongoDB's default).
pub const DEFAULT_TRANSACTION_LIFETIME: Duration = Duration::from_secs(60);
/// How much longer than the transaction lifetime a commit is retried on
/// `TransientTransactionError`: a transaction a killed run left open holds the checkpoint until
/// the server expires it, which its periodic reaper does a little after the lifetime.
pub const TRANSIENT_RETRY_MARGIN: Duration = Duration::from_secs(15);
/// How long closing the connection (ending its sessions) may take at the end of a run.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// MongoDB's document limit (`maxBsonObjectSize`).
pub const MAX_DOCUMENT_BYTES: usize = 16 * 1024 * 1024;

/// Majority-acknowledged writes.
fn majority_writes() -> WriteConcern {
    WriteConcern::majority()
}

/// The primary, whatever the URI's read preference.
fn primary() -> SelectionCriteria {
    SelectionCriteria::ReadPreference(ReadPreference::Primary)
}

/// Snapshot reads, majority writes, on the primary: every checkpoint and outbox transaction.
fn transaction_options() -> TransactionOptions {
    TransactionOptions::builder()
        .read_concern(ReadConcern::snapshot())
        .write_concern(majority_writes())
        .selection_criteria(primary())
        .build()
}

/// A client, its runtime, and the deployment identity checked at connection.
pub struct Connection {
    runtime: tokio::runtime::Runtime,
    client: Client,
    deployment: Deployment,
    redactor: Redactor,
    /// No call to the server outlives this instant (the run's deadline).
    deadline: std::sync::OnceLock<Instant>,
    /// The server's `transactionLifetimeLimitSeconds`.
    transaction_lifetime: Duration,
}

/// The run's deadline passed while a call to the server was under way.
#[derive(Debug)]
pub struct DeadlinePassed;

/// What an interrupted transaction means for the operator.
const DEADLINE_IN_COMMIT: &str = "the run deadline passed while a transaction was in flight; its outcome is unknown, \
     and the next run resumes from whatever was committed";

/// The fixed message for a URI the driver cannot parse: it echoes nothing of the URI.
pub const UNPARSABLE_URI: &str = "MONGODB_URI is not a valid MongoDB connection string";

/// Usernames shorter than this are left in text (a username is not a secret; redacting a letter
/// everywhere would only garble the message). Passwords and tokens are removed whatever their
/// length.
const MIN_REDACTED_USERNAME: usize = 3;

/// Removes a URI's credentials from any text before it is printed or logged.
///
/// The secrets come from the driver's own parse of the URI ([`ConnectionString`]): the username,
/// the password and every value of `authMechanismProperties` (e.g. `AWS_SESSION_TOKEN`). Each is
/// removed as parsed, fully percent-encoded (either hex case) and in every spelling the raw URI
/// uses for it (any mix of percent-encoded and literal characters). This build's driver refuses
/// `tlsCertificateKeyFilePassword` and `proxyPassword` (their features are off) and the AWS and
/// GSSAPI mechanisms, so a URI carrying them never parses and is never echoed at all.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// The redactor of a parsed connection string; `raw` is the URI as given.
    pub fn for_connection_string(parsed: &ConnectionString, raw: &str) -> Redactor {
        let mut plain: Vec<String> = Vec::new();
        if let Some(credential) = &parsed.credential {
            if let Some(user) = &credential.username
                && user.chars().count() >= MIN_REDACTED_USERNAME
            {
                plain.push(user.clone());
            }
            plain.extend(credential.password.iter().cloned());
            if let Some(properties) = &credential.mechanism_properties {
                for (_, value) in properties {
                    match value {
                        Bson::String(text) => plain.push(text.clone()),
                        other => plain.push(other.to_string()),
                    }
                }
            }
        }
        let mut secrets = Vec::new();
        for secret in plain.into_iter().filter(|s| !s.is_empty()) {
            secrets.extend(spellings_in(raw, &secret));
            // As a driver or server message would escape it, in either hex case.
            let escaped =
                percent_encoding::utf8_percent_encode(&secret, percent_encoding::NON_ALPHANUMERIC)
                    .to_string();
            if escaped != secret {
                secrets.push(lower_hex_escapes(&escaped));
                secrets.push(escaped);
            }
            secrets.push(secret);
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets }
    }

    /// Parses `uri` with the driver and builds its redactor; `None` when it does not parse.
    pub fn for_uri(uri: &str) -> Option<Redactor> {
        let parsed = ConnectionString::parse(uri).ok()?;
        Some(Redactor::for_connection_string(&parsed, uri))
    }

    pub fn clean(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }
}

/// `%3A` written `%3a`: the hex digits of every escape in lower case.
fn lower_hex_escapes(escaped: &str) -> String {
    let mut out = String::with_capacity(escaped.len());
    let mut after_percent = 0;
    for c in escaped.chars() {
        if after_percent > 0 {
            out.push(c.to_ascii_lowercase());
            after_percent -= 1;
        } else {
            out.push(c);
            if c == '%' {
                after_percent = 2;
            }
        }
    }
    out
}

/// Every substring of `raw` that percent-decodes to `secret` (each `%XX` taken as one byte), as
/// it is spelled in `raw`, when that spelling differs from `secret` itself.
fn spellings_in(raw: &str, secret: &str) -> Vec<String> {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let (raw_bytes, wanted) = (raw.as_bytes(), secret.as_bytes());
    let mut found = Vec::new();
    for start in 0..raw_bytes.len() {
        let (mut at, mut matched) = (start, 0);
        while matched < wanted.len() && at < raw_bytes.len() {
            let (byte, width) = match raw_bytes[at] {
                b'%' => {
                    match (
                        raw_bytes.get(at + 1).copied().and_then(hex),
                        raw_bytes.get(at + 2).copied().and_then(hex),
                    ) {
                        (Some(high), Some(low)) => (high << 4 | low, 3),
                        _ => (b'%', 1),
                    }
                }
                other => (other, 1),
            };
            if byte != wanted[matched] {
                break;
            }
            matched += 1;
            at += width;
        }
        if matched == wanted.len()
            && let Some(spelling) = raw.get(start..at)
            && spelling != secret
        {
            found.push(spelling.to_string());
        }
    }
    found
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
        ErrorKind::InsertMany(e) => match (&e.write_errors, &e.write_concern_error) {
            (Some(errors), _) if !errors.is_empty() => (
                Some(errors[0].code),
                errors[0].code_name.clone().unwrap_or_default(),
                errors[0].message.clone(),
            ),
            (_, Some(wce)) => (Some(wce.code), wce.code_name.clone(), wce.message.clone()),
            _ => (None, "DriverError".into(), error.to_string()),
        },
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
        Some(286) | Some(260) | Some(280) | Some(BSON_OBJECT_TOO_LARGE) => {
            StreamError::from_server(detail)
        }
        _ if detail.code_name == "BSONObjectTooLarge" => StreamError::TooLarge(detail),
        Some(_) if error.contains_label("NonResumableChangeStreamError") => {
            StreamError::Fatal(detail)
        }
        _ => StreamError::Unavailable(detail),
    }
}

/// A database handle that ignores the URI's concerns and read preference.
fn guarded_database(client: &Client, name: &str) -> Database {
    client.database_with_options(
        name,
        DatabaseOptions::builder()
            .selection_criteria(primary())
            .read_concern(ReadConcern::majority())
            .write_concern(majority_writes())
            .build(),
    )
}

/// Says (once, without values) which of the URI's concerns are overridden.
fn warn_about_overridden_concerns(parsed: &ConnectionString) {
    let mut ignored = Vec::new();
    if parsed
        .write_concern
        .as_ref()
        .is_some_and(|w| *w != majority_writes())
    {
        ignored.push("write concern");
    }
    if parsed
        .read_concern
        .as_ref()
        .is_some_and(|r| *r != ReadConcern::majority())
    {
        ignored.push("read concern");
    }
    if parsed
        .read_preference
        .as_ref()
        .is_some_and(|p| !matches!(p, ReadPreference::Primary))
    {
        ignored.push("read preference");
    }
    if !ignored.is_empty() {
        tracing::warn!(
            ignored = %ignored.join(", "),
            "the URI's concerns are ignored: checkpoint and outbox work always uses majority writes, \
             majority or snapshot reads and the primary"
        );
    }
}

/// A fixed message for a URI the driver parsed but cannot use: nothing of the URI is echoed.
fn unusable_uri(error: &DriverError) -> &'static str {
    match error.kind.as_ref() {
        ErrorKind::DnsResolve { .. } => {
            "MONGODB_URI cannot be used: the DNS records of its mongodb+srv host cannot be resolved"
        }
        _ => {
            "MONGODB_URI cannot be used: check its options (TLS files, authentication mechanism, option values)"
        }
    }
}

/// The server's `transactionLifetimeLimitSeconds` (`getParameter`), or MongoDB's default of
/// 60 s when the server does not allow or answer the question.
async fn transaction_lifetime(admin: &Database) -> Duration {
    let asked = admin
        .run_command(doc! { "getParameter": 1, "transactionLifetimeLimitSeconds": 1 })
        .await;
    let seconds = match &asked {
        Ok(reply) => match reply.get("transactionLifetimeLimitSeconds") {
            Some(Bson::Int32(n)) => u64::try_from(*n).ok(),
            Some(Bson::Int64(n)) => u64::try_from(*n).ok(),
            Some(Bson::Double(n)) if n.is_finite() && *n >= 0.0 => Some(*n as u64),
            _ => None,
        },
        Err(_) => None,
    };
    match seconds.filter(|s| *s > 0) {
        Some(seconds) => Duration::from_secs(seconds.min(24 * 3600)),
        None => {
            tracing::debug!("transactionLifetimeLimitSeconds unknown; assuming 60 s");
            DEFAULT_TRANSACTION_LIFETIME
        }
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
        // The driver's own parse (no DNS): a URI it refuses is not echoed, not even in part.
        let parsed = ConnectionString::parse(uri)
            .map_err(|_| HandoffError::BadInput(UNPARSABLE_URI.into()))?;
        let redactor = Redactor::for_connection_string(&parsed, uri);
        warn_about_overridden_concerns(&parsed);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mongodb")
            .enable_all()
            .build()
            .map_err(|e| HandoffError::Internal(e.into()))?;
        let mut options = runtime
            .block_on(async { ClientOptions::parse(parsed).await })
            .map_err(|e| HandoffError::BadInput(unusable_uri(&e).into()))?;
        options.server_selection_timeout = Some(SERVER_SELECTION_TIMEOUT);
        options.retry_writes = Some(true);
        options.app_name = Some("handoff".into());
        // The URI's concerns never apply: every handle below also sets its own.
        options.write_concern = Some(majority_writes());
        options.read_concern = Some(ReadConcern::majority());
        options.selection_criteria = Some(primary());
        // The driver spawns its monitors on the runtime it is created in.
        let _context = runtime.enter();
        let client = Client::with_options(options)
            .map_err(|e| HandoffError::BadInput(unusable_uri(&e).into()))?;
        let admin = guarded_database(&client, "admin");
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
        let transaction_lifetime = runtime.block_on(transaction_lifetime(&admin));
        tracing::info!(
            set_name = %set_name,
            transaction_lifetime_s = transaction_lifetime.as_secs(),
            "connected to the replica set"
        );
        Ok(Arc::new(Connection {
            runtime,
            client,
            deployment: Deployment {
                set_name,
                replica_set_id,
            },
            redactor,
            deadline: std::sync::OnceLock::new(),
            transaction_lifetime,
        }))
    }

    /// A database whose every operation goes to the primary with majority writes and majority
    /// reads, whatever the URI says.
    pub fn database(&self, name: &str) -> Database {
        guarded_database(&self.client, name)
    }

    /// How long a commit is retried on `TransientTransactionError`: long enough for the server to
    /// expire a transaction a killed run left open (the run's deadline still bounds it).
    pub fn transient_retry_window(&self) -> Duration {
        self.transaction_lifetime + TRANSIENT_RETRY_MARGIN
    }

    /// Ends the client's sessions on the server (`endSessions`, which also aborts any
    /// transaction one of them still holds) and closes its connections. Called at the end of
    /// every run, success or failure, once the stream and the store are dropped; it waits at
    /// most [`CLOSE_WAIT`].
    pub fn close(&self) {
        let client = self.client.clone();
        let closed = self
            .runtime
            .block_on(async move { tokio::time::timeout(CLOSE_WAIT, client.shutdown()).await });
        match closed {
            Ok(()) => tracing::debug!("MongoDB sessions ended and connections closed"),
            Err(_) => tracing::warn!(
                wait_s = CLOSE_WAIT.as_secs(),
                "closing the MongoDB connection took too long; the server expires what was not ended"
            ),
        }
    }

    pub fn deployment(&self) -> &Deployment {
        &self.deployment
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
        let collection = connection.database(database).collection(collection);
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
        let db = connection.database(database);
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

    /// One attempt of the transaction. Whatever fails, the attempt's transaction is not left
    /// open on the server.
    async fn attempt(&self, commit: &Commit<'_>) -> std::result::Result<(), Attempt> {
        let mut session = self
            .connection
            .client
            .start_session()
            .await
            .map_err(Attempt::from)?;
        session
            .start_transaction()
            .with_options(transaction_options())
            .await
            .map_err(Attempt::from)?;
        if let Err(failure) = self.statements(&mut session, commit).await {
            // The driver still holds the transaction as in progress: abort it on the server.
            let _ = session.abort_transaction().await;
            return Err(failure);
        }
        let committed = commit_with_retries(&mut session).await;
        if committed.is_err() {
            abandon(&mut session, &self.checkpoints).await;
        }
        committed
    }

    /// The compare-and-set and the record inserts, inside the session's transaction.
    async fn statements(
        &self,
        session: &mut ClientSession,
        commit: &Commit<'_>,
    ) -> std::result::Result<(), Attempt> {
        let expected = commit
            .expected
            .map_or(Bson::Null, |t| Bson::Document(t.clone()));
        let filter = doc! { "_id": &commit.consumer.consumer, "token": expected, "source": &commit.consumer.source };
        let update =
            doc! { "$set": { "token": commit.next.clone(), "mode": commit.mode.as_str() } };
        let changed = self
            .checkpoints
            .update_one(filter, update)
            .session(&mut *session)
            .await
            .map_err(Attempt::from)?;
        if changed.matched_count != 1 {
            return Err(Attempt::Final(CommitError::Conflict));
        }
        for (collection, records) in [
            (&self.outbox, &commit.outbox),
            (&self.quarantine, &commit.quarantine),
        ] {
            if records.is_empty() {
                continue;
            }
            if let Some(id) = oversized(records) {
                return Err(Attempt::Final(CommitError::TooLarge(id)));
            }
            if let Err(e) = collection
                .insert_many(records)
                .ordered(true)
                .session(&mut *session)
                .await
            {
                return Err(insert_failure(e, records));
            }
        }
        Ok(())
    }
}

/// The `_id` of the first record over the document limit, if any.
fn oversized(records: &[Document]) -> Option<String> {
    records.iter().find_map(|record| {
        let size = bson::serialize_to_vec(record).map_or(usize::MAX, |bytes| bytes.len());
        (size > MAX_DOCUMENT_BYTES).then(|| record_id(record))
    })
}

fn record_id(record: &Document) -> String {
    record.get_str("_id").unwrap_or("").to_string()
}

/// Classifies a failed `insertMany`: the failing record's `_id` for a duplicate key (11000) or a
/// record over the document limit (10334), a transient error to retry, or a driver error.
fn insert_failure(error: DriverError, records: &[Document]) -> Attempt {
    if error.contains_label(TRANSIENT_TRANSACTION_ERROR) {
        return Attempt::Transient(error);
    }
    let failed = match error.kind.as_ref() {
        ErrorKind::InsertMany(e) => e
            .write_errors
            .as_ref()
            .and_then(|errors| errors.first())
            .map(|w| (w.code, w.code_name.clone(), Some(w.index))),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some((w.code, w.code_name.clone(), None)),
        ErrorKind::Command(c) => Some((c.code, Some(c.code_name.clone()), None)),
        _ => None,
    };
    let id_at = |index: Option<usize>| {
        index
            .and_then(|i| records.get(i))
            .map(record_id)
            .unwrap_or_default()
    };
    match failed {
        Some((11000, _, index)) => Attempt::Final(CommitError::Duplicate(id_at(index))),
        Some((code, name, index))
            if code == BSON_OBJECT_TOO_LARGE || name.as_deref() == Some("BSONObjectTooLarge") =>
        {
            let id = match index {
                Some(_) => id_at(index),
                None => oversized(records).unwrap_or_default(),
            };
            Attempt::Final(CommitError::TooLarge(id))
        }
        _ => Attempt::Driver(error),
    }
}

/// `commitTransaction`, retried alone on `UnknownTransactionCommitResult`.
async fn commit_with_retries(session: &mut ClientSession) -> std::result::Result<(), Attempt> {
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

/// Ends on the server a transaction whose commit failed. Once a commit was attempted the driver
/// refuses `abortTransaction`; a new transaction number on the same session makes the server
/// abort the old transaction, and that new transaction, opened by a read, is then aborted. (A
/// transaction that did commit is not affected.) If the server cannot be reached now, the
/// session is ended when the connection closes, or the server expires the transaction.
async fn abandon(session: &mut ClientSession, checkpoints: &Collection<Document>) {
    if session
        .start_transaction()
        .with_options(transaction_options())
        .await
        .is_err()
    {
        return;
    }
    let ended = checkpoints
        .find_one(doc! { "_id": Bson::Null })
        .session(&mut *session)
        .await;
    let _ = session.abort_transaction().await;
    match ended {
        Ok(_) => tracing::debug!("the failed commit's transaction was ended on the server"),
        Err(_) => tracing::debug!(
            "the failed commit's transaction could not be ended now; the session ends at close"
        ),
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
        let window = self.connection.transient_retry_window();
        let retried = async {
            let started = Instant::now();
            let mut attempt: u32 = 0;
            loop {
                attempt += 1;
                match self.attempt(commit).await {
                    Ok(()) => return Ok(()),
                    Err(Attempt::Final(e)) => return Err(e),
                    Err(Attempt::Transient(e)) if started.elapsed() < window => {
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

    /// Redacts `text` with the redactor of `uri`, which must parse.
    fn cleaned(uri: &str, text: &str) -> String {
        Redactor::for_uri(uri)
            .unwrap_or_else(|| panic!("{uri} parses"))
            .clean(text)
    }

    #[test]
    fn password_and_username_never_survive_redaction() {
        let uri = "mongodb://app_user:s3cr%40t@db.example:27017/?replicaSet=rs0";
        let clean = cleaned(
            uri,
            "auth failed for app_user:s3cr%40t and s3cr@t at db.example",
        );
        assert!(!clean.contains("s3cr"), "{clean}");
        assert!(!clean.contains("app_user"), "{clean}");
        assert!(clean.contains("db.example"), "{clean}");
        assert_eq!(cleaned("mongodb://localhost/", "x"), "x");
    }

    #[test]
    fn a_password_with_uri_delimiters_is_redacted_in_every_spelling() {
        // The password is `p?a@s/s:w0rd#1`, percent-encoded as the URI rules require.
        let uri = "mongodb://alice:p%3Fa%40s%2Fs%3Aw0rd%231@db.example/admin?replicaSet=rs0";
        let parsed = ConnectionString::parse(uri).unwrap();
        let password = parsed
            .credential
            .as_ref()
            .unwrap()
            .password
            .clone()
            .unwrap();
        assert_eq!(password, "p?a@s/s:w0rd#1");
        let text = format!(
            "decoded {password} raw p%3Fa%40s%2Fs%3Aw0rd%231 lower p%3fa%40s%2fs%3aw0rd%231"
        );
        let clean = Redactor::for_connection_string(&parsed, uri).clean(&text);
        assert!(!clean.contains("w0rd"), "{clean}");
        assert_eq!(clean, "decoded *** raw *** lower ***");
    }

    #[test]
    fn a_password_spelled_with_needless_escapes_is_redacted_as_spelled() {
        // `%65` is a plain `e`: the raw URI spells the password differently from its value.
        let uri = "mongodb://alice:s%65cretPw@db.example/";
        let clean = cleaned(uri, "uri had s%65cretPw, value secretPw");
        assert_eq!(clean, "uri had ***, value ***");
    }

    #[test]
    fn every_auth_mechanism_property_is_redacted() {
        let uri = "mongodb://alice@db.example/?authMechanism=MONGODB-OIDC\
                   &authMechanismProperties=ENVIRONMENT:azure,TOKEN_RESOURCE:api%3A%2F%2FRes0urceSecret";
        let clean = cleaned(
            uri,
            "resource api://Res0urceSecret or api%3A%2F%2FRes0urceSecret in azure",
        );
        assert!(!clean.contains("Res0urceSecret"), "{clean}");
        assert!(!clean.contains("azure"), "{clean}");
    }

    #[test]
    fn uris_the_driver_refuses_get_no_redactor_and_a_fixed_message() {
        for uri in [
            // Session tokens and TLS key passwords: this build's driver refuses them at parse.
            "mongodb://AKIAEXAMPLE:s3cr3tKey@db.example/?authMechanism=MONGODB-AWS\
             &authMechanismProperties=AWS_SESSION_TOKEN:T0k3nValue",
            "mongodb://db.example/?tls=true&tlsCertificateKeyFile=/k.pem&tlsCertificateKeyFilePassword=K3yPass",
            "mongodb://alice:s3cr3t@/db",
            "mongodb://alice:p@s3cr3t@db.example/",
            "mongodb://alice:s3cr3t%@db.example/",
            "mongodb://alice:s3cr3t@db.example/?bogusOption=1",
        ] {
            assert!(Redactor::for_uri(uri).is_none(), "{uri} parsed");
            match Connection::connect(uri) {
                Err(HandoffError::BadInput(message)) => assert_eq!(message, UNPARSABLE_URI),
                Err(other) => panic!("{uri}: {other}"),
                Ok(_) => panic!("{uri}: connected"),
            }
        }
    }

    #[test]
    fn short_usernames_stay_but_short_passwords_go() {
        let clean = cleaned("mongodb://al:pw@db.example/", "al logged in with pw");
        assert_eq!(clean, "al logged in with ***");
    }
}
