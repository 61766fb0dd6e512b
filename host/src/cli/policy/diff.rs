//! `handoff policy diff`: what a new policy would decide otherwise than the deployed one, before
//! it is deployed; and the diff `policy check --against` reports.

use std::path::{Path, PathBuf};

use clap::Args;

use super::TestFormat;
use crate::cli::args::ConsumerArgs;
use crate::cli::env;
use handoff::backend::mongo::{Connection, operator};
use handoff::backend::replay::Fixture;
use handoff::domain::position::parse_time;
use handoff::domain::text::escape_name;
use handoff::error::{HandoffError, Result};
use handoff::kit::cases::Case;
use handoff::kit::diff::{self, Report, Side};
use handoff::runtime::cache::ArtifactCache;
use handoff::runtime::{PolicySource, Runtime};

#[derive(Args)]
#[command(after_help = concat!(
    "Both policies decide the same events in the replay sandbox, as `policy test` runs a case;\n",
    "nothing is written but the compiled-policy cache. Exits 16 when any event would be handed\n",
    "off under another ID (unless --allow-id-change); shape and decision changes are reported\n",
    "and exit 0.\n\n",
    "Example:\n",
    "  handoff policy diff --old deployed.wasm --new candidate.wasm cases/\n",
    "  MONGODB_URI=... handoff policy diff --old deployed.wasm --new candidate.wasm --from-outbox --consumer-id orders-to-outbox\n\n",
    exit_codes!(),
))]
pub struct DiffArgs {
    /// The policy deployed now (.wasm).
    #[arg(long, value_name = "FILE")]
    pub old: PathBuf,
    /// The policy to deploy (.wasm).
    #[arg(long, value_name = "FILE")]
    pub new: PathBuf,
    /// A recorded stream (JSON Lines, as `replay` reads), or a folder of cases (as `policy test`
    /// takes).
    #[arg(
        required_unless_present = "from_outbox",
        conflicts_with = "from_outbox"
    )]
    pub source: Option<PathBuf>,
    /// Decide the change events a consumer's outbox holds instead (read-only; the records must
    /// keep their event: not with --outbox-keep-event false).
    #[arg(long)]
    pub from_outbox: bool,
    #[command(flatten)]
    pub outbox: OutboxArgs,
    /// A policy parameter, `key=value` (repeatable), given to each policy that reads it.
    #[arg(long = "policy-param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// human (a summary and a line per differing event), json (one document) or junit (a
    /// testcase per event), on stdout.
    #[arg(long, default_value = "human")]
    pub format: TestFormat,
    /// Exit 0 even when events change their IDs (reviewed: readers expect them again).
    #[arg(long)]
    pub allow_id_change: bool,
}

/// Where `--from-outbox` reads: the consumer flags `status` takes.
#[derive(Args)]
pub struct OutboxArgs {
    /// The replica set's connection string (never printed or logged).
    #[arg(long, env = env::MONGODB_URI, hide_env_values = true)]
    pub uri: Option<String>,
    /// Database of the watched collection and of the consumer's collections.
    #[arg(long, env = env::SOURCE_DATABASE, default_value = "change_demo")]
    pub database: String,
    /// The watched collection.
    #[arg(long, env = env::SOURCE_COLLECTION, default_value = "orders")]
    pub collection: String,
    #[command(flatten)]
    pub consumer: ConsumerArgs,
    /// With --from-outbox: how many records at most, the most recent (1-10000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    /// With --from-outbox: the records from this cluster time on (`SECONDS[.INCREMENT]` or an
    /// RFC 3339 time), the oldest first, instead of the most recent.
    #[arg(long, value_name = "TIME", requires = "from_outbox")]
    pub since: Option<String>,
}

/// A policy file read and checked as a component (not compiled yet): a file that is not one is
/// bad input.
pub fn policy_file(path: &Path) -> Result<PolicySource> {
    let source = PolicySource::from_file(path)?;
    source
        .check_format()
        .map_err(|e| HandoffError::BadInput(e.to_string()))?;
    Ok(source)
}

/// The cases of SOURCE: one case for a recorded stream, every case of a folder.
fn cases_of(path: &Path) -> Result<Vec<Case>> {
    if path.is_dir() {
        return Case::discover(path);
    }
    let fixture = Fixture::read(path)?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(vec![diff::stream_case(&name, fixture, None)?])
}

/// The consumer's outbox records of change events, as a stream; refused when they do not keep
/// their events.
fn outbox_case(args: &OutboxArgs) -> Result<Case> {
    let inputs = handoff::run::inputs::RawInputs {
        database: args.database.clone(),
        collection: args.collection.clone(),
        consumer_id: args.consumer.consumer_id.clone(),
        checkpoint_collection: args.consumer.checkpoint_collection.clone(),
        outbox_collection: args.consumer.outbox_collection.clone(),
        quarantine_collection: args.consumer.quarantine_collection.clone(),
        runs_collection: args.consumer.runs_collection.clone(),
        runs_keep: handoff::domain::history::DEFAULT_KEEP,
        max_events: "1".into(),
        max_wait_seconds: "1".into(),
    }
    .validate()?;
    let since = match &args.since {
        None => None,
        Some(text) => Some(parse_time(text).ok_or_else(|| {
            HandoffError::BadInput(
                "--since must be SECONDS[.INCREMENT] or an RFC 3339 time (2026-11-30T08:00:00Z)"
                    .into(),
            )
        })?),
    };
    let uri = args.uri.as_deref().ok_or_else(|| {
        HandoffError::BadInput(
            "--from-outbox needs the deployment: set MONGODB_URI or --uri".into(),
        )
    })?;
    let connection = Connection::connect(uri)?;
    let records = connection.block_on(operator::outbox_events(
        &connection,
        &inputs.database,
        &inputs.outbox_collection,
        &inputs.consumer_id,
        since,
        args.limit,
    ));
    connection.close();
    let records = records.map_err(|e| {
        HandoffError::Unavailable(format!("{} could not be read: {}", e.what, e.text))
    })?;
    let consumer = escape_name(&inputs.consumer_id, 64);
    let without = records.iter().filter(|r| !r.contains_key("event")).count();
    if without > 0 {
        return Err(HandoffError::BadInput(format!(
            "the outbox does not store the change events of consumer {consumer}: {without} of the \
             {} records read keep no `event` (the consumer runs with --outbox-keep-event false, or \
             its shaped records are of split events), so there is nothing to decide again. Diff \
             over a recording instead (`handoff record`, then the fixture as SOURCE)",
            records.len()
        )));
    }
    if records.is_empty() {
        return Err(HandoffError::BadInput(format!(
            "the outbox {} holds no record of consumer {consumer}{}",
            inputs.outbox_collection,
            if since.is_some() {
                " from --since on"
            } else {
                ""
            }
        )));
    }
    let events = records
        .into_iter()
        .filter_map(|mut r| match r.remove("event") {
            Some(bson::Bson::Document(event)) => Some(event),
            _ => None,
        })
        .collect();
    let stream = diff::stream_of(
        events,
        &format!("{}.{}", inputs.database, inputs.collection),
    );
    diff::stream_case(
        &format!("outbox of {consumer}"),
        stream,
        Some(&inputs.consumer_id),
    )
}

/// Loads both policies (with the artifact cache) and diffs them over `cases`.
pub fn compare(
    old: &PolicySource,
    new: &PolicySource,
    cases: &[Case],
    params: &[(String, String)],
    label: &str,
) -> Result<Report> {
    let runtime = Runtime::new(ArtifactCache::default_dir())?;
    let (old_policy, new_policy) = (runtime.load(old)?, runtime.load(new)?);
    diff::diff(
        &runtime,
        &Side {
            source: old,
            policy: &old_policy,
        },
        &Side {
            source: new,
            policy: &new_policy,
        },
        cases,
        params,
        label,
    )
}

/// Prints `report` in `format`; an ID change is the command's failure (exit 16) unless allowed.
pub fn print(report: &Report, format: TestFormat, allow_id_change: bool) -> Result<()> {
    match format {
        TestFormat::Human => handoff::output::write_stdout(&report.human())?,
        TestFormat::Json => out!("{}", report.json())?,
        TestFormat::Junit => handoff::output::write_stdout(&report.junit()?)?,
    }
    let changed = report.count(diff::Kind::Id);
    if changed > 0 && !allow_id_change {
        return Err(HandoffError::Attention(format!(
            "{changed} event(s) would be handed off again under another ID: readers would take \
             them for new events. Keep the IDs, or deploy with --allow-id-change once readers \
             expect it"
        )));
    }
    Ok(())
}

pub fn run(args: DiffArgs) -> Result<()> {
    // Everything is read and checked before anything runs.
    let params = crate::cli::args::parse_params(&args.params)?;
    let old = policy_file(&args.old)?;
    let new = policy_file(&args.new)?;
    let (cases, label) = match &args.source {
        Some(path) => (cases_of(path)?, path.display().to_string()),
        None => {
            let case = outbox_case(&args.outbox)?;
            let label = case.name.clone();
            (vec![case], label)
        }
    };
    let report = compare(&old, &new, &cases, &params, &label)?;
    print(&report, args.format, args.allow_id_change)
}
