//! `handoff status`: a consumer's position, lag and oplog margin.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::args::{TargetArgs, ViewArgs};
use handoff::backend::mongo::Connection;
use handoff::domain::delivery::{DEFAULT_DELIVERY, DEFAULT_LEDGER};
use handoff::error::{HandoffError, Result};
use handoff::operate::delivery_status::{self, Delivery};
use handoff::operate::report::{Page, Section};
use handoff::operate::status::{self, Place, Status, Target};

#[derive(Args)]
#[command(after_help = concat!(
    "Reads, changes nothing. The oplog window needs the right to read the `local` database\n",
    "(role clusterMonitor); without it the window and margin are shown as unknown.\n\n",
    "Example (alert a day before the checkpoint falls off the oplog):\n",
    "  MONGODB_URI=... handoff status --consumer-id orders-to-outbox --min-margin 24h\n",
    "Every consumer of a database, the worst first, failing when any would lose history within a day:\n",
    "  MONGODB_URI=... handoff status --all --database shop --min-forecast 1day\n\n",
    exit_codes!(),
))]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub view: ViewArgs,
    /// Exit with 16 when the oplog margin (how long before the checkpoint falls off the oplog)
    /// is smaller than this, or unknown (e.g. `30m`, `6h`, `2days`), or when the checkpoint
    /// stands after the deployment's present.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub min_margin: Option<Duration>,
    /// Exit with 16 when the forecast (when the checkpoint would fall off the oplog if the
    /// current rates hold, from the run history) is shorter than this, or history is already
    /// lost. A forecast that cannot be made (fewer than 3 runs recorded, the window unknown)
    /// is said and does not fail.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub min_forecast: Option<Duration>,
    /// Every consumer of --database's checkpoint collection, with its lag, margin and
    /// forecast, the worst first (--consumer-id is then not used).
    #[arg(long)]
    pub all: bool,
    /// Also write the figures as a self-contained HTML report to this file (checked before
    /// anything is read: its directory must exist and be writable).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Exit with 18 when a delivery of the consumer (`handoff deliver`) has an open record
    /// that has waited longer than this since its admission (e.g. `5m`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_delivery_lag: Option<Duration>,
    /// Collection (table) of the delivery ledger, in the consumer's database: the consumer's
    /// deliveries are shown beside its position.
    #[arg(long, env = super::env::LEDGER_COLLECTION, default_value = DEFAULT_LEDGER)]
    pub ledger_collection: String,
}

pub(crate) fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    if let Ok(seconds) = text.trim().parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(text.trim()).map_err(|e| format!("{e} (e.g. 90s, 30m, 6h, 2days)"))
}

pub fn run(args: StatusArgs) -> Result<()> {
    let t = &args.target;
    t.inputs()?;
    let scope = t.scope()?;
    if let Some(path) = &args.html {
        Page::check_path(path)?;
    }
    if args.all {
        if args.max_delivery_lag.is_some() {
            return Err(HandoffError::BadInput(
                "--max-delivery-lag checks the deliveries of one consumer: name it with \
                 --consumer-id instead of --all"
                    .into(),
            ));
        }
        return all(&args);
    }
    let names = super::deliver::names_of(t, DEFAULT_DELIVERY, &args.ledger_collection)?;
    let connection = Connection::connect(t.uri()?)?;
    let status = Status::read(
        &connection,
        &Target {
            scope,
            database: &t.database,
            collection: &t.collection,
            consumer: &t.consumer.consumer_id,
            checkpoints: &t.consumer.checkpoint_collection,
            outbox: &t.consumer.outbox_collection,
            runs: &t.consumer.runs_collection,
        },
    );
    let deliveries = match &status {
        Ok(_) => delivery_status::deliveries(
            &handoff::backend::mongo::ledger::MongoLedger::new(&connection),
            &names,
        ),
        Err(_) => Ok(Vec::new()),
    };
    connection.close();
    let status = status?;
    let deliveries = deliveries?;
    // The HTML report is written whatever became of stdout.
    let printed = if args.view.json {
        let mut json = status.to_json();
        if let Some(object) = json.as_object_mut() {
            object.insert(
                "deliveries".into(),
                deliveries.iter().map(Delivery::to_json).collect(),
            );
        }
        out!("{json}")
    } else {
        let mut rows: String = status
            .rows()
            .into_iter()
            .map(|(label, value)| format!("{label:<16} {value}\n"))
            .collect();
        if !deliveries.is_empty() {
            rows.push('\n');
            rows.push_str(&delivery_status::table(&deliveries));
        }
        handoff::output::write_stdout(&rows)
    };
    if let Some(path) = &args.html {
        Page {
            title: format!("handoff status: {}", status.consumer),
            charts: status.charts(),
            sections: vec![Section {
                heading: status.source.clone(),
                rows: status
                    .rows()
                    .into_iter()
                    .map(|(label, value)| (label.to_string(), value))
                    .collect(),
            }],
        }
        .write(path)?;
    }
    printed?;
    check(&args, &status)?;
    match args.max_delivery_lag {
        Some(max) => delivery_status::lag_alert(&deliveries, max).map_or(Ok(()), Err),
        None => Ok(()),
    }
}

/// `--all`: the listing, then the checks of every consumer.
fn all(args: &StatusArgs) -> Result<()> {
    let t = &args.target;
    let place = Place {
        database: &t.database,
        checkpoints: &t.consumer.checkpoint_collection,
        runs: &t.consumer.runs_collection,
    };
    let connection = Connection::connect(t.uri()?)?;
    let listed = status::read_all(&connection, &place);
    connection.close();
    let listed = listed?;
    let printed = if args.view.json {
        out!("{}", status::to_json(&place, &listed))
    } else if listed.is_empty() {
        handoff::output::write_stdout(&format!(
            "no consumer in {}.{}\n",
            t.database, t.consumer.checkpoint_collection
        ))
    } else {
        handoff::output::write_stdout(&status::table(&listed))
    };
    if let Some(path) = &args.html {
        Page {
            title: format!(
                "handoff status: {} consumers of {}",
                listed.len(),
                t.database
            ),
            charts: Vec::new(),
            sections: listed
                .iter()
                .map(|status| Section {
                    heading: format!("{} on {}", status.consumer, status.source),
                    // The listing reads no outbox: its figures are left out, not unknown.
                    rows: status
                        .rows()
                        .into_iter()
                        .filter(|(label, _)| *label != "outbox")
                        .map(|(label, value)| (label.to_string(), value))
                        .collect(),
                })
                .collect(),
        }
        .write(path)?;
    }
    printed?;
    let failures: Vec<String> = listed
        .iter()
        .filter_map(|status| {
            check(args, status)
                .err()
                .map(|e| format!("{}: {e}", status.consumer))
        })
        .collect();
    match failures.first() {
        None => Ok(()),
        Some(first) => Err(HandoffError::Attention(format!(
            "{} of {} consumers need attention; the first: {first}",
            failures.len(),
            listed.len()
        ))),
    }
}

/// `--min-margin` and `--min-forecast` against one consumer.
fn check(args: &StatusArgs, status: &Status) -> Result<()> {
    if let Some(min) = args.min_forecast
        && let Some(eta) = status.forecast.eta_seconds()
        // 0: already lost, whatever the minimum.
        && (eta == 0 || eta < min.as_secs() as i64)
    {
        return Err(HandoffError::Attention(format!(
            "the forecast is under --min-forecast {} s: {}",
            min.as_secs(),
            status.forecast.sentence()
        )));
    }
    if let Some(min) = args.min_margin {
        // A checkpoint after the present has a large margin and skips everything: no margin
        // makes it healthy.
        if let Some(ahead) = status.position.ahead_seconds() {
            return Err(HandoffError::Attention(format!(
                "the checkpoint stands {ahead} s after the deployment's present: events written \
                 until then are skipped; see `handoff checkpoint reset`"
            )));
        }
        let margin = status.position.oplog_margin_seconds();
        let enough = margin.is_some_and(|m| m >= 0 && m as u64 >= min.as_secs());
        if !enough {
            return Err(HandoffError::Attention(match margin {
                Some(m) if m < 0 => format!(
                    "the checkpoint already fell off the oplog (margin {m} s): history is lost; see \
                     `handoff checkpoint reset` and `handoff reconcile`"
                ),
                Some(m) => format!(
                    "the oplog margin is {m} s, under --min-margin {} s: the checkpoint is about to fall \
                     off the oplog (run the consumer more often, or grow the oplog)",
                    min.as_secs()
                ),
                None => "the oplog margin is unknown (no checkpoint token, or the oplog cannot be read: \
                         grant clusterMonitor), so --min-margin cannot be confirmed"
                    .into(),
            }));
        }
    }
    Ok(())
}
