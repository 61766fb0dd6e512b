//! What `recover` did (or, in a dry run, would do), as JSON for machines and lines for people.

use bson::Timestamp;
use serde_json::{Value, json};

use super::{Cause, Marker};
use crate::reconcile::{Found, ReconcileReport};
use handoff_domain::position::{iso, time_json};
use handoff_domain::text::{escape_name, escape_untrusted};

/// What a recovery found and did.
#[derive(Debug, Clone)]
pub struct Recovery {
    pub consumer: String,
    pub source: String,
    pub dry_run: bool,
    /// A recovery already moved the checkpoint: this one completes its repair.
    pub resumed: bool,
    /// The recovery's marker: the lost window, the new position, the reason.
    pub marker: Marker,
    /// Why the move would be refused now (a dry run's view of a held lease).
    pub refused: Option<String>,
    /// The repair (a dry run of a recovery in progress: the comparison alone).
    pub report: Option<ReconcileReport>,
    /// The completion's audit record (`_id`, hex).
    pub audit_id: Option<String>,
    /// The command to run next (after a dry run, the recovery itself).
    pub next: String,
}

fn time(t: Option<Timestamp>) -> String {
    t.map_or("unknown".to_string(), |t| {
        format!("{} ({}.{})", iso(t), t.time, t.increment)
    })
}

impl Recovery {
    pub fn to_json(&self) -> Value {
        let m = &self.marker;
        let count = |f: &Found| json!(f.count);
        let repair = self.report.as_ref().map(|r| {
            let mut value = json!({
                "checked": r.checked,
                "missing": count(&r.missing),
                "orphan": count(&r.orphan),
                "stale": count(&r.stale),
                "held_by_policy": {
                    "quarantined": count(&r.quarantined),
                    "skipped": count(&r.skipped),
                },
                "in_flight": r.in_flight,
                "keys": {
                    "missing": r.missing.keys,
                    "orphan": r.orphan.keys,
                    "stale": r.stale.keys,
                },
            });
            if let Some(done) = &r.repair {
                value["written"] = json!(done.written);
                value["already_present"] = json!(done.already_present);
                value["held"] = json!(done.held);
                value["transactions"] = json!(done.transactions);
                value["audit_id"] = json!(done.audit_id);
            }
            value
        });
        json!({
            "consumer": escape_name(&self.consumer, 64),
            "source": self.source,
            "applied": !self.dry_run && self.audit_id.is_some(),
            "resumed": self.resumed,
            "cause": m.cause.map(Cause::as_str),
            "reason": escape_untrusted(&m.reason, 500),
            "since": m.since.try_to_rfc3339_string().ok(),
            "lost": {
                "from": m.lost_from.map(time_json),
                "to": m.lost_to.map(time_json),
                "gap_seconds": m.gap_seconds,
            },
            "to": { "mode": "resumeAfter", "cluster_time": m.to.map(time_json) },
            "refused": self.refused,
            "repair": repair,
            "audit_id": self.audit_id,
            "next_command": self.next,
        })
    }

    /// The human view.
    pub fn human(&self) -> String {
        let m = &self.marker;
        let mut out = format!(
            "recover {} ({})\n",
            escape_name(&self.consumer, 64),
            self.source
        );
        let mut row = |label: &str, value: String| {
            out.push_str(&format!("  {label:<14} {value}\n"));
        };
        row(
            "cause",
            m.cause.map_or("unknown".to_string(), |c| {
                format!("{}: {}", c.as_str(), c.explained())
            }),
        );
        row("lost", m.window());
        row(
            "moved to",
            if self.resumed {
                format!(
                    "resumeAfter at {}, by the recovery of {} (its repair is completed here)",
                    time(m.to),
                    m.since.try_to_rfc3339_string().unwrap_or_default()
                )
            } else if self.dry_run {
                format!(
                    "resumeAfter at {} (the stream's current position, read now)",
                    time(m.to)
                )
            } else {
                format!(
                    "resumeAfter at {} (the stream's current position)",
                    time(m.to)
                )
            },
        );
        if let Some(refused) = &self.refused {
            row("refused", refused.clone());
        }
        if let Some(report) = &self.report {
            let verb = if report.repair.is_some() {
                "repaired"
            } else {
                "to repair"
            };
            row(
                verb,
                format!(
                    "{} missing, {} orphan, {} stale (held by the policy: {} quarantined, {} \
                     skipped; {} keys checked)",
                    report.missing.count,
                    report.orphan.count,
                    report.stale.count,
                    report.quarantined.count,
                    report.skipped.count,
                    report.checked
                ),
            );
            for (kind, found) in [
                ("missing", &report.missing),
                ("orphan", &report.orphan),
                ("stale", &report.stale),
            ] {
                for key in &found.keys {
                    row("", format!("{kind} {key}"));
                }
            }
            if let Some(done) = &report.repair {
                row(
                    "written",
                    format!(
                        "{} correction records ({} already present, {} held by the policy) in {} \
                         transactions",
                        done.written, done.already_present, done.held, done.transactions
                    ),
                );
            }
            row(
                "in flight",
                format!(
                    "{} (changed after the new position: the next run hands them off)",
                    report.in_flight
                ),
            );
        }
        row("next", self.next.clone());
        out.push_str(&match (self.dry_run, self.refused.is_some(), self.resumed) {
            (true, true, _) => {
                "result: dry run: nothing written; the recovery would be refused now (see refused)\n"
                    .to_string()
            }
            (true, false, false) => "result: dry run: nothing written; the recovery would move \
                 the checkpoint, then repair what the outbox no longer describes\n"
                .to_string(),
            (true, false, true) => "result: dry run: nothing written\n".to_string(),
            (false, ..) => format!(
                "result: recovered: the checkpoint stands at the new position and the repair is \
                 complete (audit record {}); run the consumer next\n",
                self.audit_id.as_deref().unwrap_or("unknown")
            ),
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_the_window_the_counts_and_the_next_command() {
        let mut marker = Marker::new("INC-42", Cause::HistoryLost);
        marker.gap_seconds = Some(60);
        let report = ReconcileReport {
            missing: Found {
                count: 2,
                keys: vec!["1".into(), "2".into()],
            },
            repair: Some(crate::reconcile::Repaired {
                written: 2,
                transactions: 1,
                ..Default::default()
            }),
            ..ReconcileReport::default()
        };
        let recovery = Recovery {
            consumer: "c".into(),
            source: "db.orders".into(),
            dry_run: false,
            resumed: false,
            marker,
            refused: None,
            report: Some(report),
            audit_id: Some("abc".into()),
            next: "handoff run --consumer-id c".into(),
        };
        let json = recovery.to_json();
        assert_eq!(json["applied"], true);
        assert_eq!(json["lost"]["gap_seconds"], 60);
        assert_eq!(json["repair"]["missing"], 2);
        assert_eq!(json["repair"]["written"], 2);
        assert_eq!(json["next_command"], "handoff run --consumer-id c");
        let human = recovery.human();
        for needle in [
            "about 60 s",
            "2 missing",
            "missing 2",
            "next ",
            "handoff run",
        ] {
            assert!(human.contains(needle), "{needle}: {human}");
        }
    }
}
