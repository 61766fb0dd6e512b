//! The backends of a run, chosen in one place: a replica set (source and store through one
//! connection) or a recording replayed into an embedded store.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::inputs::Inputs;
use handoff_backend::redb_store::RedbStore;
use handoff_backend::replay::{Fixture, ReplaySource};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::history::{self, RunRecord};
use handoff_domain::position::Position;
use handoff_domain::{ChangeSource, CheckpointStore, StreamConfig};
use handoff_mongo::{Connection, MongoSource, MongoStore, Pool, window};

/// A run's source and store.
pub type Opened = (Box<dyn ChangeSource>, Arc<dyn CheckpointStore>);

/// Where a run's events come from and where its state goes.
pub trait Backends: Send {
    /// What can be done while the policy loads (reaching the deployment, opening a store).
    fn prepare(&mut self) -> Result<()>;
    /// The source and the store, once the policy is known to be usable, for a run that ends at
    /// `deadline`.
    fn open(&mut self, deadline: Instant) -> Result<Opened>;
    /// Where `consumer` stands now against the deployment (lag, oplog margin), read after the
    /// run and before [`Backends::close`]; `None` for a backend without a deployment.
    fn position(&mut self, _consumer: &str) -> Option<Position> {
        None
    }
    /// The consumer's recorded runs, read while the policy loaded (for the forecast); none for
    /// a backend that keeps no history.
    fn history(&self) -> &[RunRecord] {
        &[]
    }
    /// Called once the run ended, whatever its outcome.
    fn close(&mut self) {}
}

/// A MongoDB replica set: the watched collection's stream, and the checkpoint and records in
/// the same database.
pub struct Mongo {
    uri: String,
    inputs: Inputs,
    config: StreamConfig,
    connection: Option<Arc<Connection>>,
    /// The run's store, kept for the checkpoint's token it last read or committed.
    store: Option<Arc<MongoStore>>,
    /// The consumer's recorded runs.
    history: Vec<RunRecord>,
    /// The run follows the stream: a short await bound, so that what has arrived is committed
    /// soon after the stream goes quiet.
    follow: bool,
}

impl Mongo {
    /// For a run that follows the stream (`--follow`).
    pub fn following(mut self, follow: bool) -> Mongo {
        self.follow = follow;
        self
    }

    pub fn new(uri: &str, inputs: &Inputs, config: &StreamConfig) -> Mongo {
        Mongo {
            uri: uri.to_string(),
            inputs: inputs.clone(),
            config: config.clone(),
            connection: None,
            store: None,
            history: Vec::new(),
            follow: false,
        }
    }

    fn source(&self, connection: Arc<Connection>) -> MongoSource {
        let inputs = &self.inputs;
        let source = MongoSource::new(
            connection,
            &inputs.database,
            &inputs.collection,
            &inputs.collections(),
            &self.config,
        );
        if self.follow {
            source.with_await(handoff_mongo::FOLLOW_AWAIT)
        } else {
            source
        }
    }
}

impl Backends for Mongo {
    /// Connects, checks the deployment and that the source can be watched: all reads, done
    /// while the policy loads.
    /// The run history is read here too, off the run's path: a history that cannot be read
    /// leaves the forecast unknown, never the run failed.
    fn prepare(&mut self) -> Result<()> {
        let connection = Connection::connect_with(&self.uri, Pool::Single)?;
        self.connection = Some(connection.clone());
        self.source(connection.clone()).check_watchable()?;
        let inputs = &self.inputs;
        let read = handoff_mongo::operator::run_history(
            &connection,
            &inputs.database,
            &inputs.runs_collection,
            &inputs.consumer_id,
            history::READ_BACK as i64,
        );
        match connection.block_on(async { tokio::time::timeout(window::READ_WAIT, read).await }) {
            Ok(Ok(stored)) => self.history = history::records(&stored),
            Ok(Err(error)) => tracing::debug!(
                error = %handoff_domain::text::escape_untrusted(&error.text, 500),
                "the run history cannot be read; the forecast is unknown"
            ),
            Err(_) => tracing::debug!("reading the run history took too long"),
        }
        Ok(())
    }

    fn open(&mut self, deadline: Instant) -> Result<Opened> {
        let connection = self.connection.clone().ok_or_else(|| {
            HandoffError::Internal(anyhow::anyhow!("the connection was not prepared"))
        })?;
        connection.limit_to(deadline);
        let inputs = &self.inputs;
        // Before the first write: database and deployment streams then leave them out.
        connection.register_state(
            &inputs.database,
            &[
                &inputs.checkpoint_collection,
                &inputs.outbox_collection,
                &inputs.quarantine_collection,
                &inputs.runs_collection,
            ],
        )?;
        let source = self.source(connection.clone());
        let store = Arc::new(
            MongoStore::new(connection, &inputs.database, &inputs.collections()).keeping_runs(
                &inputs.database,
                &inputs.runs_collection,
                inputs.runs_keep,
            ),
        );
        self.store = Some(store.clone());
        Ok((Box::new(source), store))
    }

    /// The checkpoint's token is the one the run last read or committed, else read now.
    fn position(&mut self, consumer: &str) -> Option<Position> {
        let connection = self.connection.clone()?;
        let released = self.store.take().and_then(|store| store.known_token());
        let inputs = &self.inputs;
        // Each read within its own bound, a slow figure leaving the others known, and all of
        // them within two.
        let read = async {
            let token = match released {
                Some(token) => token,
                None => {
                    window::checkpoint_token(
                        &connection,
                        &inputs.database,
                        &inputs.checkpoint_collection,
                        consumer,
                    )
                    .await
                }
            };
            window::position(&connection, token.as_ref()).await
        };
        let position = connection
            .block_on(async { tokio::time::timeout(2 * window::READ_WAIT, read).await })
            .ok()?;
        tracing::debug!(
            lag_seconds = position.lag_seconds(),
            oplog_margin_seconds = position.oplog_margin_seconds(),
            "consumer position"
        );
        Some(position)
    }

    fn history(&self) -> &[RunRecord] {
        &self.history
    }

    /// The stream and the store are gone with the run; the connection then ends its sessions on
    /// the server, so no transaction outlives the run.
    fn close(&mut self) {
        if let Some(connection) = self.connection.take() {
            connection.close();
        }
    }
}

/// A recorded change stream, with the checkpoint and records in an embedded store on disk.
pub struct Replay {
    fixture: Option<Fixture>,
    state: PathBuf,
    lock_timeout: Duration,
    inputs: Inputs,
    /// An existing store, opened while the policy loads.
    opened: Option<Result<RedbStore>>,
}

impl Replay {
    /// Refuses a recording of another namespace than the one the inputs watch.
    pub fn new(
        fixture: Fixture,
        state: PathBuf,
        lock_timeout: Duration,
        inputs: &Inputs,
    ) -> Result<Replay> {
        if let Some(recorded) = &fixture.deployment
            && recorded.source != inputs.source()
        {
            return Err(HandoffError::BadInput(format!(
                "the fixture was recorded from {} but the inputs watch {}",
                recorded.source,
                inputs.source()
            )));
        }
        Ok(Replay {
            fixture: Some(fixture),
            state,
            lock_timeout,
            inputs: inputs.clone(),
            opened: None,
        })
    }

    fn open_store(&self) -> Result<RedbStore> {
        RedbStore::open(&self.state, &self.inputs.collections(), self.lock_timeout)
    }
}

impl Backends for Replay {
    /// An existing store is opened while the policy loads; its failure is reported once the
    /// policy is known to be usable.
    fn prepare(&mut self) -> Result<()> {
        if self.state.exists() {
            self.opened = Some(self.open_store());
        }
        Ok(())
    }

    /// A new store is created only now, so that a refused policy leaves nothing behind.
    fn open(&mut self, _deadline: Instant) -> Result<Opened> {
        let store = match self.opened.take() {
            Some(opened) => opened?,
            None => {
                if let Some(parent) = self.state.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(|e| {
                        HandoffError::BadInput(format!(
                            "cannot create the folder of the state store {}: {e}",
                            parent.display()
                        ))
                    })?;
                }
                self.open_store()?
            }
        };
        let fixture = self.fixture.take().ok_or_else(|| {
            HandoffError::Internal(anyhow::anyhow!("the recording was already replayed"))
        })?;
        Ok((
            Box::new(ReplaySource::new(Arc::new(fixture))),
            Arc::new(store),
        ))
    }
}
