//! The reconcile report as the operator reads it: JSON for machines, lines for people, and the
//! self-contained HTML page.

use serde_json::{Value, json};

use super::{Found, ReconcileReport, time_text};
use crate::report::{Page, Section};
use handoff_domain::text::escape_name;

impl ReconcileReport {
    pub fn to_json(&self) -> Value {
        let found = |f: &Found| json!({ "count": f.count, "keys": f.keys });
        let mut out = json!({
            "consumer": escape_name(&self.consumer, 64),
            "source": self.source,
            "checked": self.checked,
            "missing": found(&self.missing),
            "orphan": found(&self.orphan),
            "stale": found(&self.stale),
            "held_by_policy": {
                "quarantined": found(&self.quarantined),
                "skipped": found(&self.skipped),
            },
            "in_flight": { "count": self.in_flight },
            "checkpoint_cluster_time": self.checkpoint_cluster_time.map(time_text),
            "outbox_records": self.outbox_records,
            "since": self.since.map(time_text),
            "differences": self.differences(),
        });
        if let Some(repair) = &self.repair {
            out["repair"] = json!({
                "written": repair.written,
                "held": repair.held,
                "already_present": repair.already_present,
                "transactions": repair.transactions,
                "audit_id": repair.audit_id,
            });
        }
        out
    }

    /// The human view.
    pub fn human(&self) -> String {
        let mut out = format!(
            "reconcile {} ({})\n",
            escape_name(&self.consumer, 64),
            self.source
        );
        out.push_str(&format!(
            "  checkpoint at  {}\n",
            self.checkpoint_cluster_time
                .map(time_text)
                .unwrap_or_else(|| "unknown".into())
        ));
        if let Some(since) = self.since {
            out.push_str(&format!(
                "  since          {} (keys with records at or after it)\n",
                time_text(since)
            ));
        }
        out.push_str(&format!(
            "  checked        {} keys ({} outbox records)\n",
            self.checked, self.outbox_records
        ));
        for (name, found) in [
            ("missing", &self.missing),
            ("orphan", &self.orphan),
            ("stale", &self.stale),
            ("quarantined", &self.quarantined),
            ("skipped", &self.skipped),
        ] {
            if matches!(name, "quarantined" | "skipped") && found.count == 0 {
                continue;
            }
            let name = match name {
                "quarantined" => "held: quarantined by the policy",
                "skipped" => "held: skipped by the policy",
                name => name,
            };
            out.push_str(&format!("  {name:<14} {}\n", found.count));
            for key in &found.keys {
                out.push_str(&format!("      {key}\n"));
            }
            if found.count > found.keys.len() as u64 {
                out.push_str(&format!(
                    "      … and {} more (--limit)\n",
                    found.count - found.keys.len() as u64
                ));
            }
        }
        out.push_str(&format!(
            "  in flight      {} (changed after the checkpoint: the next run hands them off)\n",
            self.in_flight
        ));
        if let Some(repair) = &self.repair {
            out.push_str(&format!(
                "  repaired       {} correction records written ({} already present, {} held by the policy) in {} transactions\n",
                repair.written, repair.already_present, repair.held, repair.transactions
            ));
        }
        out.push_str(&if self.differences() == 0 {
            "result: the outbox describes the source (0 missing, 0 orphan, 0 stale)\n".to_string()
        } else {
            format!(
                "result: {} differences ({} missing, {} orphan, {} stale)\n",
                self.differences(),
                self.missing.count,
                self.orphan.count,
                self.stale.count
            )
        });
        out
    }

    /// The report as a self-contained HTML page: the figures, then the keys of each kind.
    pub fn html(&self, charts: Vec<crate::report::Chart>) -> Page {
        let mut figures = vec![
            (
                "consumer".to_string(),
                format!("{} on {}", self.consumer, self.source),
            ),
            (
                "checkpoint at".to_string(),
                self.checkpoint_cluster_time
                    .map(time_text)
                    .unwrap_or_else(|| "unknown".into()),
            ),
            ("keys checked".to_string(), self.checked.to_string()),
            (
                "outbox records".to_string(),
                self.outbox_records.to_string(),
            ),
            ("in flight".to_string(), self.in_flight.to_string()),
        ];
        if let Some(since) = self.since {
            figures.push(("since".to_string(), time_text(since)));
        }
        let mut sections = Vec::new();
        for (name, found) in [
            ("missing", &self.missing),
            ("orphan", &self.orphan),
            ("stale", &self.stale),
        ] {
            figures.push((name.to_string(), found.count.to_string()));
            if found.count > 0 {
                let mut rows: Vec<(String, String)> = found
                    .keys
                    .iter()
                    .enumerate()
                    .map(|(i, key)| ((i + 1).to_string(), key.clone()))
                    .collect();
                if found.count > found.keys.len() as u64 {
                    rows.push((
                        "…".to_string(),
                        format!(
                            "{} more (raise --limit)",
                            found.count - found.keys.len() as u64
                        ),
                    ));
                }
                sections.push(Section {
                    heading: format!("{name} keys"),
                    rows,
                });
            }
        }
        if self.differences() > 0 && self.repair.is_none() {
            figures.push((
                "WARNING".to_string(),
                format!("{} keys differ; `handoff reconcile --repair --reason TEXT` hands off correction records", self.differences()),
            ));
        }
        sections.insert(
            0,
            Section {
                heading: "figures".to_string(),
                rows: figures,
            },
        );
        Page {
            title: format!("handoff reconcile: {}", self.consumer),
            charts,
            sections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_counts_and_bounds() {
        let report = ReconcileReport {
            consumer: "c\u{1b}[2J".into(),
            source: "db.orders".into(),
            missing: Found {
                count: 3,
                keys: vec!["1".into()],
            },
            ..ReconcileReport::default()
        };
        assert_eq!(report.differences(), 3);
        let json = report.to_json();
        assert_eq!(json["missing"]["count"], 3);
        assert_eq!(json["in_flight"]["count"], 0);
        assert!(!json["consumer"].as_str().unwrap().contains('\u{1b}'));
        let human = report.human();
        assert!(human.contains("and 2 more"), "{human}");
        assert!(!human.contains('\u{1b}'));
    }
}
