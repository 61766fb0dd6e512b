//! `handoff deliver`: the consumer's outbox delivered to a sink, and `deliver dead`: its dead
//! records listed, replayed or discarded.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::json;

use super::args::{AuditArgs, DecidingArgs, EffectsArgs, TargetArgs, ViewArgs, reason_text};
use super::env;
use handoff::backend::mongo::Connection;
use handoff::backend::mongo::delivery::Names;
use handoff::backend::mongo::ledger::MongoLedger;
use handoff::backend::redb_store::RedbStore;
use handoff::deliver::engine::Watch;
use handoff::deliver::retry::Backoff;
use handoff::deliver::sink::Sink;
use handoff::deliver::sinks::projection::Projection;
use handoff::deliver::sinks::webhook::{Webhook, parse_secret};
use handoff::deliver::{Ended, Options, Report};
use handoff::domain::Collections;
use handoff::domain::delivery::{self, DEFAULT_DELIVERY, DEFAULT_LEDGER};
use handoff::domain::ledger::Ledger;
use handoff::domain::text::escape_untrusted;
use handoff::error::{HandoffError, Result};
use handoff::operate::dead::{self, Action, Selection};
use handoff::operate::delivery_status;
use handoff::output::live;
use handoff::output::live_delivery::DeliveryMetrics;

#[derive(Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = concat!(
        "Reads the consumer's outbox in hand-off order and makes each record's effect on one sink, \
keeping a ledger entry per record (pending, in_progress, failed, dead, succeeded, ignored) in \
--ledger-collection. Sinks:\n  \
mongodb:COLLECTION   a projection in the consumer's database (mongodb:DB.COLLECTION for \
another): the write, the ledger and nothing else in one transaction, exactly once; writes guarded \
by version (the event's cluster time): an older version never overwrites or revives a newer one\n  \
http://… https://…   a webhook signed the Standard Webhooks way (webhook-id = the event ID, stable \
across retries and restarts; webhook-timestamp; webhook-signature with the secret of \
--sink-secret-file or HANDOFF_SINK_SECRET): at least once, no redirects, certificates checked\n\
Effects: the policy's (--policy, contract 1.6: each record's request, or a refusal that makes it \
dead; what a failed attempt is), else the default's: a projection upserts the change's document \
by its key, deletes on delete events and ignores what has no document; a webhook posts every \
record as relaxed Extended JSON.\n\
Retries: timeouts, refused connections, 5xx, 408 and 429 are tried again with backoff and jitter \
(at least Retry-After) up to --max-attempts; other 4xx are dead at once. Records of one document \
key go in order; other keys go on in parallel, and a dead record holds back only its own key.\n\
A bounded delivery ends when nothing is due and nothing came for --max-wait-seconds (entries \
waiting for a retry stay for the next run); --follow keeps going until SIGTERM.\n\n\
Examples:\n  handoff deliver --sink mongodb:orders_view\n  \
HANDOFF_SINK_SECRET=whsec_… handoff deliver --delivery hooks --sink https://hooks.example.com/orders --follow\n  \
handoff deliver dead list --delivery hooks\n  \
handoff deliver dead replay --delivery hooks --all --reason \"receiver fixed\"\n\n",
        exit_codes!()
    )
)]
pub struct DeliverArgs {
    #[command(subcommand)]
    command: Option<DeliverCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum DeliverCommand {
    /// A delivery's dead records: list, replay, discard (audited).
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Compares a MongoDB projection with what the policy makes of the watched collection, by
    /// key and content (missing, orphan, stale; keys the delivery has not settled are in
    /// flight); --repair corrects them through the policy, audited.
    #[command(after_help = concat!(
        "Each source document, as a snapshot event, is decided by the consumer's policy \
(--policy, --policy-param, as for `handoff run`; its checkpoint must record the same policy) and \
each record it would hand off by the delivery's effects (the policy's `delivery` export, or the \
default's): an upsert says what the key holds, a delete that it holds nothing. Documents the \
policy skips or quarantines are held, records the effects refuse are refused: counted apart, \
never differences.\n\n\
Read-only unless --repair is given. Keys are printed as relaxed Extended JSON, never \
whole documents. Run the consumer and the delivery first: a change not handed off yet is a \
difference until it is. A repair reads each differing document again after a fresh stream \
position, asks the policy and the effects again, and writes their upserts and deletes under that \
position's cluster time as the version (a newer delivery write is left as it is), removes \
orphans, in transactions of 100 with an audit record.\n\n\
Examples:\n  handoff deliver reconcile --sink mongodb:orders_view\n  \
handoff deliver reconcile --sink mongodb:orders_view --repair --reason \"view restored from backup\"\n  \
handoff deliver reconcile --sink mongodb:orders_view --policy policy.wasm --json\n\n\
Exit 16 means differences were found; with --repair, exit 0 means they were corrected.\n\n",
        exit_codes!()
    ))]
    Reconcile(ReconcileArgs),
    /// Every delivery of the consumer: records open, dead, delivered and ignored, the sink, and
    /// the lag (how long the oldest unsettled record has waited). Read-only.
    #[command(after_help = concat!(
        "Example:\n  handoff deliver status --max-lag-seconds 300\n\n\
Exit 18 means a delivery's lag is over --max-lag-seconds; 17 that it holds dead records, with \
--fail-on-dead.\n\n",
        exit_codes!()
    ))]
    Status(StatusArgs),
}

#[derive(Args)]
struct StatusArgs {
    #[command(flatten)]
    delivery: DeliveryArgs,
    #[command(flatten)]
    view: ViewArgs,
    /// Exit 18 when a delivery's oldest unsettled record has waited longer than this.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    max_lag_seconds: Option<u64>,
    /// Exit 17 when a delivery holds dead records.
    #[arg(long)]
    fail_on_dead: bool,
}

#[derive(Args)]
struct ReconcileArgs {
    #[command(flatten)]
    delivery: DeliveryArgs,
    #[command(flatten)]
    audit: AuditArgs,
    /// The consumer's policy (as for `handoff run`): it decides what each source document is
    /// handed off as, and its `delivery` export (or the default's) what that does to the
    /// projection.
    #[command(flatten)]
    deciding: DecidingArgs,
    #[command(flatten)]
    view: ViewArgs,
    /// The projection: mongodb:COLLECTION or mongodb:DATABASE.COLLECTION.
    #[arg(long, env = env::SINK)]
    sink: String,
    /// Keys listed per kind of difference (counts are always complete).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    limit: u32,
    /// Documents read per round trip.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    chunk_size: u32,
    /// Correct every difference found (needs --reason).
    #[arg(long, requires = "reason")]
    repair: bool,
    /// Why the repair is made (1-500 printable characters), kept in the audit record.
    #[arg(long, requires = "repair", value_name = "TEXT")]
    reason: Option<String>,
}

#[derive(Subcommand)]
enum DeadCommand {
    /// Lists the dead records (table, or --json).
    List(ListArgs),
    /// Makes dead records pending again (attempts from zero): the next delivery tries them.
    /// Audited.
    Replay(ActArgs),
    /// Marks dead records ignored: never delivered. Audited.
    Discard(ActArgs),
}

/// Which delivery of which consumer.
#[derive(Args, Clone)]
struct DeliveryArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The delivery's name: one consumer may feed several deliveries, each with its own ledger
    /// entries and position (1-64 of A-Z a-z 0-9 _ . -).
    #[arg(long, env = env::DELIVERY, default_value = DEFAULT_DELIVERY)]
    delivery: String,
    /// Collection (table) of the delivery ledger, in the consumer's database.
    #[arg(long, env = env::LEDGER_COLLECTION, default_value = DEFAULT_LEDGER)]
    ledger_collection: String,
    /// The embedded state store whose outbox is delivered (as `handoff replay --state` left
    /// it), the ledger kept in it beside the outbox, instead of a deployment's (--uri is then
    /// not read). It must exist.
    #[arg(long, value_name = "PATH")]
    state: Option<std::path::PathBuf>,
    /// How long to wait for another process holding the state store, in milliseconds.
    #[arg(long, default_value_t = 10_000, requires = "state")]
    state_lock_timeout_ms: u64,
}

/// Where a delivery's outbox and ledger are: a deployment, or an embedded store.
enum Holder {
    Deployment(std::sync::Arc<Connection>),
    Embedded(RedbStore),
}

impl Holder {
    fn open(args: &DeliveryArgs) -> Result<Holder> {
        let Some(path) = &args.state else {
            return Ok(Holder::Deployment(Connection::connect(args.target.uri()?)?));
        };
        if !path.is_file() {
            return Err(HandoffError::BadInput(format!(
                "no state store at {} (`handoff replay --state` makes one)",
                escape_untrusted(&path.display().to_string(), 200)
            )));
        }
        let inputs = args.target.inputs()?;
        let collections = Collections {
            checkpoints: inputs.checkpoint_collection,
            outbox: inputs.outbox_collection,
            quarantine: inputs.quarantine_collection,
        };
        let store = RedbStore::open(
            path,
            &collections,
            Duration::from_millis(args.state_lock_timeout_ms),
        )?;
        Ok(Holder::Embedded(store))
    }

    fn ledger(&self) -> Box<dyn Ledger + '_> {
        match self {
            Holder::Deployment(connection) => Box::new(MongoLedger::new(connection)),
            Holder::Embedded(store) => Box::new(store.ledger()),
        }
    }

    /// Lists the state collections written in their database's registry first (a deployment's).
    fn register(&self, database: &str, collections: &[&str]) -> Result<()> {
        match self {
            Holder::Deployment(connection) => connection.register_state(database, collections),
            Holder::Embedded(_) => Ok(()),
        }
    }

    fn close(&self) {
        if let Holder::Deployment(connection) = self {
            connection.close();
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    delivery: DeliveryArgs,
    #[command(flatten)]
    effects: EffectsArgs,
    /// The sink: mongodb:COLLECTION, mongodb:DATABASE.COLLECTION, http://… or https://….
    #[arg(long, env = env::SINK)]
    sink: Option<String>,
    /// A file holding the webhook secret (`whsec_` and base64, as Standard Webhooks gives it);
    /// else HANDOFF_SINK_SECRET. Never printed or logged.
    #[arg(long, value_name = "FILE")]
    sink_secret_file: Option<std::path::PathBuf>,
    /// Seconds one webhook request may take, connection included (1-300).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    sink_timeout_seconds: u64,
    /// Keep delivering until SIGTERM (else: until drained).
    #[arg(
        long,
        env = env::FOLLOW,
        default_value = "false",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    follow: bool,
    /// End after this many records were settled (delivered, retried later, dead or ignored).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_records: Option<u64>,
    /// Idle seconds (nothing due, nothing new) before a bounded delivery ends, 1-3600.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
    max_wait_seconds: u64,
    /// End after this long whatever is left (e.g. 10m), the records in flight settled first.
    #[arg(long, env = env::MAX_DURATION, value_parser = humantime::parse_duration)]
    max_duration: Option<Duration>,
    /// Attempts of a record before it is dead, 1-1000.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_attempts: u32,
    /// Records delivered at once (different keys), 1-64.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    concurrency: u64,
    /// The most records in flight (claimed, not settled), 1-10000.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    max_in_flight: u64,
    /// The most MiB of records in flight (one record always goes), 1-4096.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    max_in_flight_mib: u64,
    /// Seconds a claim on a record lasts (a deliverer killed mid-attempt frees it then); more
    /// than twice --sink-timeout-seconds, at most 3600.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_seconds: u64,
    /// Whether a dead record holds back the later records of its key (so that they are never
    /// applied out of order). Other keys go on either way.
    #[arg(
        long,
        default_value = "true",
        value_name = "BOOL",
        value_parser = clap::value_parser!(bool),
        action = clap::ArgAction::Set
    )]
    hold_dead_keys: bool,
    /// The pause after a record's first failure, in ms (doubling, with jitter), 1-600000.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    retry_base_ms: u64,
    /// The longest pause between attempts, in seconds, 1-86400.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    retry_max_seconds: u64,
    /// Serve the delivery's metrics while it runs (delivered, retried, dead and ignored
    /// records, attempts, records and bytes in flight beside their bounds, the lag) in the
    /// OpenMetrics format at /metrics, with /healthz and /readyz: PORT (on 127.0.0.1) or
    /// HOST:PORT. Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
}

#[derive(Args)]
struct ListArgs {
    #[command(flatten)]
    delivery: DeliveryArgs,
    #[command(flatten)]
    view: ViewArgs,
    /// The most records listed, 1-10000.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    limit: u64,
}

#[derive(Args)]
struct ActArgs {
    #[command(flatten)]
    delivery: DeliveryArgs,
    #[command(flatten)]
    audit: AuditArgs,
    #[command(flatten)]
    view: ViewArgs,
    /// A dead record by its outbox `_id` or event ID (repeatable).
    #[arg(
        long = "id",
        value_name = "ID",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    ids: Vec<String>,
    /// Every dead record of the delivery.
    #[arg(long)]
    all: bool,
    /// Why (kept in the audit records), 1-500 printable characters.
    #[arg(long, value_name = "TEXT")]
    reason: String,
}

impl DeliveryArgs {
    /// The delivery's names, checked: nothing is read before they pass.
    fn names(&self) -> Result<Names> {
        names_of(&self.target, &self.delivery, &self.ledger_collection)
    }
}

/// The names of delivery `name` of the target's consumer with its ledger in `ledger`, checked:
/// nothing is read before they pass.
pub(crate) fn names_of(target: &TargetArgs, name: &str, ledger: &str) -> Result<Names> {
    let inputs = target.inputs()?;
    delivery::check_name(name)
        .map_err(|why| HandoffError::BadInput(format!("--delivery: {why}")))?;
    if !handoff::run::inputs::valid_name(ledger) {
        return Err(HandoffError::BadInput(
            "--ledger-collection must contain 1-63 letters, digits, underscores or hyphens and \
             start with a letter"
                .into(),
        ));
    }
    if [
        &inputs.collection,
        &inputs.checkpoint_collection,
        &inputs.outbox_collection,
        &inputs.quarantine_collection,
        &inputs.runs_collection,
    ]
    .iter()
    .any(|c| c.as_str() == ledger)
    {
        return Err(HandoffError::BadInput(
            "the ledger collection must be distinct from the source, checkpoint, outbox, \
             quarantine and runs collections"
                .into(),
        ));
    }
    Ok(Names {
        database: inputs.database,
        outbox: inputs.outbox_collection,
        ledger: ledger.to_string(),
        audit: handoff::operate::audit::DEFAULT_COLLECTION.into(),
        consumer: inputs.consumer_id,
        delivery: name.to_string(),
    })
}

/// A sink as the command line names it, checked before anything is read.
enum SinkSpec {
    Projection(String),
    Webhook { url: String, secret: Vec<u8> },
}

impl RunArgs {
    fn sink(&self, names: &Names) -> Result<SinkSpec> {
        let Some(sink) = self.sink.as_deref() else {
            return Err(HandoffError::BadInput(
                "--sink (HANDOFF_SINK) names where records go: mongodb:COLLECTION or an \
                 http(s):// URL"
                    .into(),
            ));
        };
        if let Some(target) = sink.strip_prefix("mongodb:") {
            return projection_target(target, names).map(SinkSpec::Projection);
        }
        if sink.starts_with("http://") || sink.starts_with("https://") {
            let text = match &self.sink_secret_file {
                Some(path) => std::fs::read_to_string(path).map_err(|e| {
                    HandoffError::BadInput(format!(
                        "--sink-secret-file {}: {}",
                        escape_untrusted(&path.display().to_string(), 200),
                        e.kind()
                    ))
                })?,
                None => std::env::var(env::SINK_SECRET).map_err(|_| {
                    HandoffError::BadInput(
                        "a webhook sink signs every request: give its secret with \
                         --sink-secret-file FILE or HANDOFF_SINK_SECRET"
                            .into(),
                    )
                })?,
            };
            let secret = parse_secret(&text)
                .map_err(|why| HandoffError::BadInput(format!("the webhook secret: {why}")))?;
            return Ok(SinkSpec::Webhook {
                url: sink.to_string(),
                secret,
            });
        }
        Err(HandoffError::BadInput(
            "--sink must start with mongodb:, http:// or https:// (the sink's text is not \
             repeated: it may hold a credential)"
                .into(),
        ))
    }

    fn options(&self, names: Names) -> Result<Options> {
        if self.lease_seconds <= 2 * self.sink_timeout_seconds {
            return Err(HandoffError::BadInput(format!(
                "--lease-seconds ({}) must be more than twice --sink-timeout-seconds ({}): a \
                 claim must outlast the attempt it covers",
                self.lease_seconds, self.sink_timeout_seconds
            )));
        }
        let deadline = self.max_duration.map(|d| Instant::now() + d);
        let owner = handoff::domain::Lease::new(Duration::from_secs(self.lease_seconds)).owner;
        Ok(Options {
            names,
            follow: self.follow,
            max_records: self.max_records,
            max_wait: Duration::from_secs(self.max_wait_seconds),
            max_attempts: self.max_attempts,
            concurrency: self.concurrency as usize,
            max_in_flight: self.max_in_flight as usize,
            max_in_flight_bytes: (self.max_in_flight_mib as usize) << 20,
            lease: Duration::from_secs(self.lease_seconds),
            hold_dead_lanes: self.hold_dead_keys,
            backoff: Backoff {
                base: Duration::from_millis(self.retry_base_ms),
                max: Duration::from_secs(self.retry_max_seconds),
            },
            owner,
            max_await: if self.follow {
                handoff::backend::mongo::FOLLOW_AWAIT
            } else {
                Duration::from_millis(50)
            },
            deadline,
        })
    }
}

/// The projection `mongodb:TARGET` names, as `DATABASE.COLLECTION`, checked.
fn projection_target(target: &str, names: &Names) -> Result<String> {
    let (database, collection) = match target.split_once('.') {
        Some((database, collection)) => (database, collection),
        None => (names.database.as_str(), target),
    };
    let database_ok = database == names.database || database_name(database);
    if !database_ok || !handoff::run::inputs::valid_name(collection) {
        return Err(HandoffError::BadInput(
            "--sink mongodb:COLLECTION (or mongodb:DATABASE.COLLECTION) takes a collection of \
             1-63 letters, digits, underscores or hyphens starting with a letter"
                .into(),
        ));
    }
    let state = handoff::domain::state::DEFAULT_NAMES.contains(&collection)
        || [&names.outbox, &names.ledger].contains(&&collection.to_string());
    if state && database == names.database {
        return Err(HandoffError::BadInput(
            "the projection must be a collection of its own, not one of handoff's state \
             collections"
                .into(),
        ));
    }
    Ok(format!("{database}.{collection}"))
}

/// A database name MongoDB takes (no `/\. "$` and no NUL, at most 63 bytes).
fn database_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '.' | ' ' | '"' | '$' | '\0') || c.is_control())
}

pub fn run(args: DeliverArgs) -> Result<super::Outcome> {
    match args.command {
        Some(DeliverCommand::Dead(command)) => dead(command).map(|()| super::Outcome::Done),
        Some(DeliverCommand::Reconcile(args)) => reconcile(args).map(|()| super::Outcome::Done),
        Some(DeliverCommand::Status(args)) => status(args).map(|()| super::Outcome::Done),
        None => deliver(&args.run),
    }
}

fn deliver(args: &RunArgs) -> Result<super::Outcome> {
    let names = args.delivery.names()?;
    if args.delivery.state.is_some() && args.follow {
        return Err(HandoffError::BadInput(
            "--follow waits for records another process writes, and an embedded state store is \
             held by one process at a time: deliver it bounded, after the run that wrote it"
                .into(),
        ));
    }
    let spec = args.sink(&names)?;
    if args.delivery.state.is_some() && matches!(spec, SinkSpec::Projection(_)) {
        return Err(HandoffError::BadInput(
            "a MongoDB projection commits its write with the ledger in one transaction of the \
             consumer's deployment: deliver an embedded store's outbox to a webhook (http:// or \
             https://)"
                .into(),
        ));
    }
    let options = args.options(names.clone())?;
    let stop = super::stop_signal()?;
    // Bound before anything is read or written: a bad or busy address refuses the delivery.
    let metrics = match &args.metrics_listen {
        Some(address) => {
            let metrics = DeliveryMetrics::new(
                &names.consumer,
                &names.delivery,
                options.max_in_flight,
                options.max_in_flight_bytes,
            );
            live::serve(live::listen_address(address)?, metrics.clone())?;
            Some(metrics)
        }
        None => None,
    };
    let mut effects = args.effects.load(&stop)?;
    let holder = Holder::open(&args.delivery)?;
    let started = Instant::now();
    let result = (|| {
        let sink: Box<dyn Sink> = match (&spec, &holder) {
            (SinkSpec::Projection(target), Holder::Deployment(connection)) => {
                let projection = Projection::new(connection.clone(), names.clone(), target);
                let (database, collection) = projection.namespace();
                connection.register_state(database, &[collection])?;
                Box::new(projection)
            }
            (SinkSpec::Projection(_), Holder::Embedded(_)) => {
                return Err(HandoffError::Internal(anyhow::anyhow!(
                    "a projection from an embedded store passed the checks"
                )));
            }
            (SinkSpec::Webhook { url, secret }, _) => Box::new(
                Webhook::new(
                    url,
                    secret.clone(),
                    Duration::from_secs(args.sink_timeout_seconds),
                )
                .map_err(HandoffError::BadInput)?,
            ),
        };
        holder.register(&names.database, &[&names.ledger])?;
        let ledger = holder.ledger();
        handoff::deliver::deliver(
            ledger.as_ref(),
            sink.as_ref(),
            effects.decides.as_mut(),
            &options,
            &stop,
            metrics.as_deref().map(|m| m as &dyn Watch),
        )
    })();
    holder.close();
    if let Some(metrics) = &metrics {
        metrics.ended();
    }
    let report = result?;
    print_outputs(
        &report,
        &names,
        &effects.decides.describe(),
        started.elapsed(),
    )?;
    if report.ended == Some(Ended::Stopped) {
        return Ok(super::Outcome::Stopped);
    }
    if report.dead_total > 0 {
        return Err(HandoffError::DeadRecords(format!(
            "{} dead records wait in delivery {} ({} went dead in this run); every other record \
             went on: `handoff deliver dead list` shows them, `deliver dead replay` or `discard` \
             settles them",
            report.dead_total,
            escape_untrusted(&names.delivery, 80),
            report.dead
        )));
    }
    Ok(super::Outcome::Done)
}

/// The outputs line and the metrics line, as `run` prints them for Kestra.
fn print_outputs(report: &Report, names: &Names, effects: &str, elapsed: Duration) -> Result<()> {
    let status = report.ended.map_or("DRAINED", Ended::as_str);
    let outputs = json!({
        "status": status,
        "consumer_id": names.consumer,
        "delivery": names.delivery,
        "effects": effects,
        "records_admitted": report.admitted,
        "attempts": report.attempts,
        "records_delivered": report.delivered,
        "records_superseded": report.superseded,
        "records_retried": report.retried,
        "records_dead": report.dead,
        "records_ignored": report.ignored,
        "open_records": report.open,
        "dead_records": report.dead_total,
        "delivery_lag_seconds": report.lag_seconds,
        "max_in_flight": report.max_in_flight,
        "outbox_sweeps": report.sweeps,
    });
    let tags = json!({ "consumer_id": names.consumer, "delivery": names.delivery });
    let metric = |name: &str, kind: &str, value: serde_json::Value| json!({ "name": name, "type": kind, "value": value, "tags": tags });
    let metrics = json!({ "metrics": [
        metric("records_delivered", "counter", json!(report.delivered)),
        metric("records_retried", "counter", json!(report.retried)),
        metric("records_dead", "counter", json!(report.dead)),
        metric("records_ignored", "counter", json!(report.ignored)),
        metric("delivery_lag", "timer", json!(report.lag_seconds.unwrap_or(0.0))),
        metric("duration", "timer", json!(elapsed.as_secs_f64())),
    ] });
    out!("::{}::\n::{}::", json!({ "outputs": outputs }), metrics)
}

fn dead(command: DeadCommand) -> Result<()> {
    match command {
        DeadCommand::List(args) => {
            let names = args.delivery.names()?;
            let holder = Holder::open(&args.delivery)?;
            let listed = dead::list(holder.ledger().as_ref(), &names, args.limit as usize);
            holder.close();
            let entries = listed?;
            if args.view.json {
                out!("{}", dead::to_json(&entries))
            } else {
                handoff::output::write_stdout(&dead::table(&entries))
            }
        }
        DeadCommand::Replay(args) => act(args, Action::Replay),
        DeadCommand::Discard(args) => act(args, Action::Discard),
    }
}

fn act(args: ActArgs, action: Action) -> Result<()> {
    let mut names = args.delivery.names()?;
    let inputs = args.delivery.target.inputs()?;
    names.audit = args.audit.collection(&inputs)?;
    let reason = reason_text("--reason", &args.reason)?;
    let selection = if args.all {
        Selection::All
    } else {
        Selection::Ids(args.ids.clone())
    };
    let command = format!(
        "deliver dead {} --delivery {}{}",
        action.as_str(),
        names.delivery,
        if args.all { " --all" } else { " --id …" }
    );
    let holder = Holder::open(&args.delivery)?;
    let changed = holder
        .register(&names.database, &[&names.ledger, &names.audit])
        .and_then(|()| {
            let ledger = holder.ledger();
            dead::change(
                ledger.as_ref(),
                &names,
                &selection,
                action,
                &reason,
                &command,
            )
        });
    holder.close();
    let changed = changed?;
    if args.view.json {
        out!(
            "{}",
            json!({ "action": action.as_str(), "changed": changed.changed, "not_dead": changed.not_dead })
        )?;
    } else {
        out!(
            "{} dead records {}",
            changed.changed,
            match action {
                Action::Replay => "made pending again (the next delivery tries them)",
                Action::Discard => "discarded (ignored)",
            }
        )?;
        for record in &changed.not_dead {
            out!("not dead, left as it is: {record}")?;
        }
    }
    if !changed.not_dead.is_empty() {
        return Err(HandoffError::Attention(format!(
            "{} of the records named are not dead (the others were changed)",
            changed.not_dead.len()
        )));
    }
    Ok(())
}

fn reconcile(args: ReconcileArgs) -> Result<()> {
    let mut names = args.delivery.names()?;
    let inputs = args.delivery.target.inputs()?;
    args.delivery.target.one_collection("deliver reconcile")?;
    names.audit = args.audit.collection(&inputs)?;
    let Some(target) = args.sink.strip_prefix("mongodb:") else {
        return Err(HandoffError::BadInput(
            "deliver reconcile compares a MongoDB projection: --sink mongodb:COLLECTION".into(),
        ));
    };
    let target = projection_target(target, &names)?;
    let (database, collection) = target.split_once('.').unwrap_or_default();
    let repair = match (&args.repair, &args.reason) {
        (true, Some(reason)) => Some(reason_text("--reason", reason)?),
        _ => None,
    };
    let options = handoff::operate::projection::Options {
        names: names.clone(),
        collection: inputs.collection.clone(),
        checkpoints: inputs.checkpoint_collection.clone(),
        projection: (database.to_string(), collection.to_string()),
        chunk_size: args.chunk_size,
        limit: args.limit as usize,
        repair,
        command: format!(
            "deliver reconcile --delivery {} --sink mongodb:{target}{}",
            names.delivery,
            if args.repair { " --repair" } else { "" }
        ),
    };
    // The policy before anything is read: one that cannot decide snapshot documents is refused.
    let stop = super::stop_signal()?;
    let deciding = args.deciding.load("deliver reconcile")?;
    let mut effects = deciding.effects(&stop)?;
    let connection = Connection::connect(args.delivery.target.uri()?)?;
    let snapshots = deciding.snapshots(
        handoff::session::RunKind::Repair,
        &names.consumer,
        &names.database,
        &inputs.collection,
        connection.deployment(),
    );
    let mut deciders = handoff::operate::projection::Deciders {
        snapshots: &snapshots,
        effects: effects.as_mut(),
    };
    let result = handoff::operate::projection::reconcile(&connection, &options, &mut deciders);
    connection.close();
    let report = result?;
    if args.view.json {
        out!("{}", report.to_json())?;
    } else {
        handoff::output::write_stdout(&report.human())?;
    }
    if report.differences() > 0 && report.repaired.is_none() {
        return Err(HandoffError::Attention(format!(
            "{} keys differ ({} missing, {} orphan, {} stale); `handoff deliver reconcile \
             --repair --reason TEXT` corrects them",
            report.differences(),
            report.missing.count,
            report.orphan.count,
            report.stale.count
        )));
    }
    Ok(())
}

fn status(args: StatusArgs) -> Result<()> {
    let names = args.delivery.names()?;
    let holder = Holder::open(&args.delivery)?;
    let found = delivery_status::deliveries(holder.ledger().as_ref(), &names);
    holder.close();
    let deliveries = found?;
    if args.view.json {
        let items: Vec<serde_json::Value> = deliveries.iter().map(|d| d.to_json()).collect();
        out!(
            "{}",
            json!({ "consumer_id": names.consumer, "deliveries": items })
        )?;
    } else {
        handoff::output::write_stdout(&delivery_status::table(&deliveries))?;
    }
    if let Some(max) = args.max_lag_seconds
        && let Some(lagging) = delivery_status::lag_alert(&deliveries, Duration::from_secs(max))
    {
        return Err(lagging);
    }
    if args.fail_on_dead
        && let Some(dead) = delivery_status::dead_alert(&deliveries)
    {
        return Err(dead);
    }
    Ok(())
}
