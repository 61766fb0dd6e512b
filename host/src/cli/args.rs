//! Arguments shared by the commands: the baseline's inputs and the policy's sandbox.

use clap::Args;

use crate::cli::env;
use handoff::domain::config::{Scope, Watched};
use handoff::error::{HandoffError, Result};
use handoff::run::inputs::{Inputs, RawInputs};
use handoff::session::OutboxOptions;

mod policy;
mod stream;
pub use policy::{DecidingArgs, EffectsArgs, KeepEventArgs, PolicyArgs, parse_params};
pub use stream::StreamArgs;

/// Where a consumer's state lives, from flags or the baseline's environment variables.
#[derive(Args, Clone, Debug)]
pub struct ConsumerArgs {
    /// Stable consumer identity.
    #[arg(long, env = env::CONSUMER_ID, default_value = "orders-to-outbox")]
    pub consumer_id: String,
    /// Collection (table) of the checkpoint.
    #[arg(
        long,
        env = env::CHECKPOINT_COLLECTION,
        default_value = handoff::domain::deployment::DEFAULT_CHECKPOINTS
    )]
    pub checkpoint_collection: String,
    /// Collection (table) of the outbox.
    #[arg(
        long,
        env = env::OUTBOX_COLLECTION,
        default_value = handoff::domain::deployment::DEFAULT_OUTBOX
    )]
    pub outbox_collection: String,
    /// Collection (table) of quarantined events (policies that refuse poison events write there).
    #[arg(
        long,
        env = env::QUARANTINE_COLLECTION,
        default_value = "kestra_change_quarantine"
    )]
    pub quarantine_collection: String,
    /// Collection (table) of the run history: one record per run, which `status` reads for its
    /// forecast and charts.
    #[arg(
        long,
        env = env::RUNS_COLLECTION,
        default_value = handoff::domain::history::DEFAULT_RUNS
    )]
    pub runs_collection: String,
}

impl ConsumerArgs {
    /// The inputs `run` validates, with these names and the source and limits given.
    fn raw_inputs(
        &self,
        database: &str,
        collection: &str,
        max_events: &str,
        max_wait_seconds: &str,
    ) -> RawInputs {
        RawInputs {
            database: database.to_string(),
            collection: collection.to_string(),
            consumer_id: self.consumer_id.clone(),
            checkpoint_collection: self.checkpoint_collection.clone(),
            outbox_collection: self.outbox_collection.clone(),
            quarantine_collection: self.quarantine_collection.clone(),
            runs_collection: self.runs_collection.clone(),
            runs_keep: handoff::domain::history::DEFAULT_KEEP,
            max_events: max_events.to_string(),
            max_wait_seconds: max_wait_seconds.to_string(),
        }
    }
}

/// The baseline task's inputs, from flags or its environment variables (defaults: the flow's).
#[derive(Args, Clone, Debug)]
pub struct InputArgs {
    /// Database of the watched collection and of the checkpoint and outbox collections
    /// [default: change_demo; replay: the recording's own].
    #[arg(long, env = env::SOURCE_DATABASE)]
    pub database: Option<String>,
    /// The watched collection [default: orders; replay: the recording's own].
    #[arg(long, env = env::SOURCE_COLLECTION)]
    pub collection: Option<String>,
    #[command(flatten)]
    pub consumer: ConsumerArgs,
    /// Events per run, 1-500.
    #[arg(long, env = env::MAX_EVENTS, default_value = "50")]
    pub max_events: String,
    /// Idle seconds before the run ends, 1-30.
    #[arg(long, env = env::MAX_WAIT_SECONDS, default_value = "10")]
    pub max_wait_seconds: String,
    /// Run records kept per consumer in the run history (the oldest are replaced), 1-100000.
    #[arg(long, env = env::RUNS_KEEP, default_value_t = handoff::domain::history::DEFAULT_KEEP)]
    pub runs_keep: u32,
    #[command(flatten)]
    pub keep: KeepEventArgs,
    /// Write an outbox record for each invalidation of the stream (its `_id` the invalidate
    /// event's ID, `marker: "invalidate"`), so that readers see where the stream restarted.
    #[arg(
        long,
        env = env::INVALIDATE_MARKER,
        default_value = "false",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub invalidate_marker: bool,
}

/// The flow's watched database and collection, where neither a flag nor a variable names one.
pub const DEFAULT_DATABASE: &str = "change_demo";
pub const DEFAULT_COLLECTION: &str = "orders";

impl InputArgs {
    /// Takes the database and collection a recording names (`db.coll` of its `$deployment` line)
    /// where neither a flag nor a variable gave them.
    pub fn default_source(&mut self, recorded: &str) {
        if let Some((database, collection)) = recorded.split_once('.') {
            self.database.get_or_insert_with(|| database.to_string());
            self.collection
                .get_or_insert_with(|| collection.to_string());
        }
    }

    pub fn validate(&self) -> Result<Inputs> {
        let mut raw = self.consumer.raw_inputs(
            self.database.as_deref().unwrap_or(DEFAULT_DATABASE),
            self.collection.as_deref().unwrap_or(DEFAULT_COLLECTION),
            &self.max_events,
            &self.max_wait_seconds,
        );
        raw.runs_keep = self.runs_keep;
        raw.validate()
    }

    pub fn outbox(&self) -> OutboxOptions {
        OutboxOptions {
            keep_event: self.keep.outbox_keep_event,
            invalidate_marker: self.invalidate_marker,
        }
    }
}

/// The longest reason `--accept-config-change` takes.
const MAX_REASON: usize = 500;

/// An operator's reason (kept in the checkpoint or an audit record): 1-500 printable
/// characters, trimmed. Control characters, line and paragraph separators, zero-width
/// characters and bidirectional controls are refused: the record must read as it was written.
pub fn reason_text(flag: &str, reason: &str) -> Result<String> {
    let reason = reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON {
        return Err(HandoffError::BadInput(format!(
            "{flag} needs a reason of 1-{MAX_REASON} printable characters"
        )));
    }
    if let Some(c) = reason
        .chars()
        .find(|c| handoff::domain::text::needs_escape(*c))
    {
        return Err(HandoffError::BadInput(format!(
            "{flag} holds the character U+{:04X}: a reason takes no control, line or paragraph \
             separator, zero-width or bidirectional-control characters",
            c as u32
        )));
    }
    Ok(reason.to_string())
}

/// What a snapshot run (`backfill`, `reconcile`) is given: the consumer it looks at, where its
/// audit records go, how its result is shown and the policy that decides its documents.
#[derive(Args, Clone, Debug)]
pub struct SnapshotRunArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub audit: AuditArgs,
    #[command(flatten)]
    pub view: ViewArgs,
    #[command(flatten)]
    pub deciding: DecidingArgs,
}

/// How `reconcile` and `recover` compare the collection with the outbox.
#[derive(Args, Clone, Debug)]
pub struct CompareArgs {
    /// Keys listed per kind of difference (counts are always complete).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub limit: u32,
    /// Source documents (and outbox records) read per round trip.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub chunk_size: u32,
    /// The most keys changed after the position compared from (the checkpoint) that are
    /// accepted; more is an error (run the consumer first; `recover` again then completes its
    /// repair).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub max_in_flight: u32,
}

/// The consumer an operator command looks at: the deployment, the watched collection and the
/// consumer's collections, from the same flags and environment variables as `run`.
#[derive(Args, Clone, Debug)]
pub struct TargetArgs {
    /// The replica set's connection string (never printed or logged).
    #[arg(long, env = env::MONGODB_URI, hide_env_values = true)]
    pub uri: Option<String>,
    /// Database of the watched collection and of the consumer's collections.
    #[arg(long, env = env::SOURCE_DATABASE, default_value = "change_demo")]
    pub database: String,
    /// The watched collection.
    #[arg(long, env = env::SOURCE_COLLECTION, default_value = "orders")]
    pub collection: String,
    /// What the consumer's stream watches, as `run --scope` says: collection, database (every
    /// collection of --database) or deployment (--database then only holds the consumer's state).
    #[arg(
        long,
        env = env::STREAM_SCOPE,
        default_value = "collection",
        value_name = "SCOPE"
    )]
    pub scope: String,
    #[command(flatten)]
    pub consumer: ConsumerArgs,
}

/// Where acting commands record what they did.
#[derive(Args, Clone, Debug)]
pub struct AuditArgs {
    /// Collection of the audit records (who changed what, from what, to what, why).
    #[arg(
        long,
        env = env::AUDIT_COLLECTION,
        default_value = handoff::operate::audit::DEFAULT_COLLECTION
    )]
    pub audit_collection: String,
}

/// How a reading command prints: a human view, or one JSON document for machines.
#[derive(Args, Clone, Debug)]
pub struct ViewArgs {
    /// Print one JSON document on stdout instead of the human view.
    #[arg(long)]
    pub json: bool,
}

impl TargetArgs {
    /// The consumer whose checkpoint an audited command moves, its audit records going to
    /// `audit`.
    pub fn moved<'a>(
        &self,
        inputs: &'a handoff::run::Inputs,
        audit: &'a str,
    ) -> Result<handoff::operate::reset::Target<'a>> {
        Ok(handoff::operate::reset::Target {
            scope: self.scope()?,
            database: &inputs.database,
            collection: &inputs.collection,
            consumer: &inputs.consumer_id,
            checkpoints: &inputs.checkpoint_collection,
            audit,
        })
    }

    /// `--scope`, checked.
    pub fn scope(&self) -> Result<Scope> {
        Scope::parse(&self.scope).ok_or_else(|| {
            HandoffError::BadInput(format!(
                "--scope {:?} is not one of collection, database, deployment",
                handoff::domain::text::escape_untrusted(&self.scope, 40)
            ))
        })
    }

    /// Refuses a consumer of a database or deployment for a command that compares or copies
    /// one collection's documents (`what`), naming the commands that serve such a consumer.
    pub fn one_collection(&self, what: &str) -> Result<()> {
        let scope = self.scope()?;
        if scope == Scope::Collection {
            return Ok(());
        }
        let flags = self.flags(&self.inputs()?, scope);
        Err(HandoffError::BadInput(format!(
            "{what} compares or copies the documents of one collection, and this consumer streams \
             a whole {} (--scope {}): no one collection's documents describe its outbox. Look at \
             it with `handoff status {flags}`; to hand off a stretch of history again, move its \
             checkpoint back with `handoff checkpoint reset {flags} --to-time <time> --reason \
             '<why>'`",
            scope.as_str(),
            scope.as_str(),
        )))
    }

    /// How an operator command names this consumer (`--database D --collection C
    /// --consumer-id X`, with `--scope` and the collections that are not the defaults).
    pub fn flags(&self, inputs: &Inputs, scope: Scope) -> String {
        handoff::output::target_flags(
            &inputs.consumer_id,
            Some(&Watched {
                scope,
                database: inputs.database.clone(),
                collection: inputs.collection.clone(),
            }),
            Some(&inputs.collections()),
        )
    }

    /// The names checked as `run` checks them (nothing is read before they pass).
    /// The connection string, which the command needs.
    pub fn uri(&self) -> Result<&str> {
        self.uri.as_deref().ok_or_else(|| {
            HandoffError::BadInput(
                "--uri (MONGODB_URI) names the deployment: a mongodb:// or mongodb+srv:// \
                 connection string"
                    .into(),
            )
        })
    }

    pub fn inputs(&self) -> Result<Inputs> {
        self.consumer
            .raw_inputs(&self.database, &self.collection, "1", "1")
            .validate()
    }
}

impl AuditArgs {
    /// The audit collection's name, checked like the others and distinct from them.
    pub fn collection(&self, inputs: &Inputs) -> Result<String> {
        let name = &self.audit_collection;
        if !handoff::run::inputs::valid_name(name) {
            return Err(HandoffError::BadInput(
                "AUDIT_COLLECTION must contain 1-63 letters, digits, underscores or hyphens and start with a letter"
                    .into(),
            ));
        }
        if [
            &inputs.collection,
            &inputs.checkpoint_collection,
            &inputs.outbox_collection,
            &inputs.quarantine_collection,
        ]
        .contains(&name)
        {
            return Err(HandoffError::BadInput(
                "The audit collection must be distinct from the source, checkpoint, outbox and quarantine collections"
                    .into(),
            ));
        }
        Ok(name.clone())
    }
}

#[cfg(test)]
mod tests;
