//! `deliver status`: every delivery of a consumer with its ledger's figures — how many records
//! wait (pending, in progress, failed), went dead, were delivered or ignored — the sink it is
//! pinned to, when its position last moved, and its lag: how long the oldest unsettled record
//! has waited since it was admitted. Reads only.

use bson::DateTime;
use serde_json::{Value, json};

use handoff_domain::delivery::{Counts, Status};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::ledger::{Ledger, Names};
use handoff_domain::text::escape_untrusted;

/// The most deliveries listed for one consumer.
const MAX_DELIVERIES: usize = 1000;

/// One delivery's figures.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub name: String,
    pub sink: String,
    pub counts: Counts,
    pub lag_seconds: Option<f64>,
    pub position_moved: Option<DateTime>,
}

impl Delivery {
    pub fn to_json(&self) -> Value {
        let c = &self.counts;
        json!({
            "delivery": escape_untrusted(&self.name, 80),
            "sink": escape_untrusted(&self.sink, 300),
            "pending": c.pending, "in_progress": c.in_progress, "failed": c.failed,
            "dead": c.dead, "succeeded": c.succeeded, "ignored": c.ignored,
            "open": c.open(),
            "lag_seconds": self.lag_seconds,
            "position_moved_at": self.position_moved.and_then(|t| t.try_to_rfc3339_string().ok()),
        })
    }
}

/// Every delivery of the consumer `names` names (its `delivery` is not read).
pub fn deliveries(ledger: &dyn Ledger, names: &Names) -> Result<Vec<Delivery>> {
    let positions = ledger.positions(names, MAX_DELIVERIES)?;
    let now = DateTime::now();
    let mut found = Vec::new();
    for position in positions {
        let Ok(name) = position.get_str("delivery") else {
            continue;
        };
        let names = Names {
            delivery: name.to_string(),
            ..names.clone()
        };
        let mut counts = Counts::default();
        for status in Status::ALL {
            let n = ledger.count(&names, status)?;
            counts.add(status, n);
        }
        let oldest = ledger.open_entries(&names, 1)?;
        let lag_seconds = oldest
            .first()
            .and_then(|d| d.get_datetime("createdAt").ok())
            .map(|created| {
                (now.timestamp_millis() - created.timestamp_millis()).max(0) as f64 / 1000.0
            });
        found.push(Delivery {
            name: name.to_string(),
            sink: position.get_str("sink").unwrap_or_default().to_string(),
            counts,
            lag_seconds,
            position_moved: position.get_datetime("updatedAt").ok().copied(),
        });
    }
    Ok(found)
}

/// The deliveries whose lag is over `max`, as the error a check exits with (`None`: none is).
pub fn lag_alert(deliveries: &[Delivery], max: std::time::Duration) -> Option<HandoffError> {
    let over: Vec<String> = deliveries
        .iter()
        .filter_map(|d| {
            let lag = d.lag_seconds?;
            (lag > max.as_secs_f64()).then(|| {
                format!(
                    "delivery {} lags {lag:.0} s ({} open records)",
                    escape_untrusted(&d.name, 80),
                    d.counts.open()
                )
            })
        })
        .collect();
    (!over.is_empty()).then(|| {
        HandoffError::DeliveryLag(format!(
            "{} over the allowed {} s: its sink is slow or down, or no delivery runs \
             (`handoff deliver status` shows each delivery)",
            over.join("; "),
            max.as_secs_f64()
        ))
    })
}

/// The deliveries holding dead records, as the error a check exits with (`None`: none does).
pub fn dead_alert(deliveries: &[Delivery]) -> Option<HandoffError> {
    let dead: Vec<String> = deliveries
        .iter()
        .filter(|d| d.counts.dead > 0)
        .map(|d| {
            format!(
                "delivery {} holds {} dead records",
                escape_untrusted(&d.name, 80),
                d.counts.dead
            )
        })
        .collect();
    (!dead.is_empty()).then(|| {
        HandoffError::DeadRecords(format!(
            "{}: `handoff deliver dead list` shows them, `deliver dead replay` or `discard` \
             settles them",
            dead.join("; ")
        ))
    })
}

/// The deliveries as a table.
pub fn table(deliveries: &[Delivery]) -> String {
    if deliveries.is_empty() {
        return "no delivery of this consumer\n".into();
    }
    let mut text =
        String::from("DELIVERY         OPEN     DEAD     DELIVERED  IGNORED  LAG(s)   SINK\n");
    for d in deliveries {
        text.push_str(&format!(
            "{:<16} {:<8} {:<8} {:<10} {:<8} {:<8} {}\n",
            escape_untrusted(&d.name, 16),
            d.counts.open(),
            d.counts.dead,
            d.counts.succeeded,
            d.counts.ignored,
            d.lag_seconds
                .map_or_else(|| "-".into(), |l| format!("{l:.1}")),
            escape_untrusted(&d.sink, 120),
        ));
    }
    text
}
