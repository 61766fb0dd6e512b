//! The environment variables `handoff` reads, each named once here: the clap arguments, the
//! logging set-up and the test suites' clean environment take their names from this file.
//!
//! The baseline task's own names stay as they were (`MONGODB_URI`, `SOURCE_DATABASE`, …); every
//! variable handoff added is prefixed `HANDOFF_`. Names earlier releases read without the prefix
//! are still read (see [`FORMER`]), with a warning.

// The baseline task's names.
pub const MONGODB_URI: &str = "MONGODB_URI";
pub const SOURCE_DATABASE: &str = "SOURCE_DATABASE";
pub const SOURCE_COLLECTION: &str = "SOURCE_COLLECTION";
pub const CONSUMER_ID: &str = "CONSUMER_ID";
pub const CHECKPOINT_COLLECTION: &str = "CHECKPOINT_COLLECTION";
pub const OUTBOX_COLLECTION: &str = "OUTBOX_COLLECTION";
pub const MAX_EVENTS: &str = "MAX_EVENTS";
pub const MAX_WAIT_SECONDS: &str = "MAX_WAIT_SECONDS";

// handoff's own.
pub const POLICY: &str = "HANDOFF_POLICY";
pub const LOG: &str = "HANDOFF_LOG";
pub const LOG_FORMAT: &str = "HANDOFF_LOG_FORMAT";
pub const OUTPUTS_FILE: &str = "HANDOFF_OUTPUTS_FILE";
#[allow(dead_code)] // read by the runtime crate
pub const CACHE_DIR: &str = handoff::runtime::cache::CACHE_DIR_VARIABLE;
#[allow(dead_code)] // read by the operator commands' crate
pub const OPERATOR: &str = handoff::operate::audit::OPERATOR_VARIABLE;
pub const QUARANTINE_COLLECTION: &str = "HANDOFF_QUARANTINE_COLLECTION";
pub const AUDIT_COLLECTION: &str = "HANDOFF_AUDIT_COLLECTION";
pub const RUNS_COLLECTION: &str = "HANDOFF_RUNS_COLLECTION";
pub const RUNS_KEEP: &str = "HANDOFF_RUNS_KEEP";
pub const SIGNAL_COLLECTION: &str = "HANDOFF_SIGNAL_COLLECTION";
pub const BACKFILL_STATE_COLLECTION: &str = "HANDOFF_BACKFILL_STATE_COLLECTION";
pub const OUTBOX_KEEP_EVENT: &str = "HANDOFF_OUTBOX_KEEP_EVENT";
pub const INVALIDATE_MARKER: &str = "HANDOFF_INVALIDATE_MARKER";
pub const STREAM_SCOPE: &str = "HANDOFF_STREAM_SCOPE";
pub const PIPELINE: &str = "HANDOFF_PIPELINE";
pub const FULL_DOCUMENT: &str = "HANDOFF_FULL_DOCUMENT";
pub const FULL_DOCUMENT_BEFORE_CHANGE: &str = "HANDOFF_FULL_DOCUMENT_BEFORE_CHANGE";
pub const ACCEPT_CONFIG_CHANGE: &str = "HANDOFF_ACCEPT_CONFIG_CHANGE";
pub const LEASE_SECONDS: &str = "HANDOFF_LEASE_SECONDS";
pub const PARTITION: &str = "HANDOFF_PARTITION";
pub const SPLIT_LARGE_EVENTS: &str = "HANDOFF_SPLIT_LARGE_EVENTS";
pub const FOLLOW: &str = "HANDOFF_FOLLOW";
pub const MAX_DURATION: &str = "HANDOFF_MAX_DURATION";
pub const METRICS_LISTEN: &str = "HANDOFF_METRICS_LISTEN";
pub const SHARD_OPLOGS: &str = "HANDOFF_SHARD_OPLOGS";
pub const DELIVERY: &str = "HANDOFF_DELIVERY";
pub const LEDGER_COLLECTION: &str = "HANDOFF_LEDGER_COLLECTION";
pub const SINK: &str = "HANDOFF_SINK";
pub const SINK_SECRET: &str = "HANDOFF_SINK_SECRET";

/// Every variable above.
#[allow(dead_code)] // read by the test suites (a clean environment) and the binary's tests
pub const ALL: &[&str] = &[
    MONGODB_URI,
    SOURCE_DATABASE,
    SOURCE_COLLECTION,
    CONSUMER_ID,
    CHECKPOINT_COLLECTION,
    OUTBOX_COLLECTION,
    MAX_EVENTS,
    MAX_WAIT_SECONDS,
    POLICY,
    LOG,
    LOG_FORMAT,
    OUTPUTS_FILE,
    CACHE_DIR,
    OPERATOR,
    QUARANTINE_COLLECTION,
    AUDIT_COLLECTION,
    RUNS_COLLECTION,
    RUNS_KEEP,
    SIGNAL_COLLECTION,
    BACKFILL_STATE_COLLECTION,
    OUTBOX_KEEP_EVENT,
    INVALIDATE_MARKER,
    STREAM_SCOPE,
    PIPELINE,
    FULL_DOCUMENT,
    FULL_DOCUMENT_BEFORE_CHANGE,
    ACCEPT_CONFIG_CHANGE,
    LEASE_SECONDS,
    PARTITION,
    SPLIT_LARGE_EVENTS,
    FOLLOW,
    MAX_DURATION,
    METRICS_LISTEN,
    SHARD_OPLOGS,
    DELIVERY,
    LEDGER_COLLECTION,
    SINK,
    SINK_SECRET,
];

/// Names earlier releases read, and the variable each is now. A former name is read when the
/// current one is not set (a warning names both); when both are set, the current one wins.
pub const FORMER: &[(&str, &str)] = &[
    ("QUARANTINE_COLLECTION", QUARANTINE_COLLECTION),
    ("AUDIT_COLLECTION", AUDIT_COLLECTION),
    ("SIGNAL_COLLECTION", SIGNAL_COLLECTION),
    ("BACKFILL_STATE_COLLECTION", BACKFILL_STATE_COLLECTION),
    ("OUTBOX_KEEP_EVENT", OUTBOX_KEEP_EVENT),
    ("INVALIDATE_MARKER", INVALIDATE_MARKER),
    ("STREAM_SCOPE", STREAM_SCOPE),
    ("PIPELINE", PIPELINE),
    ("FULL_DOCUMENT", FULL_DOCUMENT),
    ("FULL_DOCUMENT_BEFORE_CHANGE", FULL_DOCUMENT_BEFORE_CHANGE),
    ("ACCEPT_CONFIG_CHANGE", ACCEPT_CONFIG_CHANGE),
    ("LEASE_SECONDS", LEASE_SECONDS),
    ("PARTITION", PARTITION),
    ("SPLIT_LARGE_EVENTS", SPLIT_LARGE_EVENTS),
];
