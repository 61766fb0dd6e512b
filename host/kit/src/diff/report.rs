//! What `policy diff` prints: a summary and a line per differing event for people, one JSON
//! document, or JUnit XML with a testcase per event. Every text a policy or an event gave (IDs,
//! field names, case names) is escaped and bounded; no record is printed whole.

use crate::junit::{Case as JunitCase, Counts, Failure, Junit};
use serde_json::{Value, json};

use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;

use super::{EventDiff, Kind, Report};

/// The longest ID, field path or name printed, in characters.
const MAX_TEXT: usize = 120;
/// ID changes and shape changes listed per event on its line (the rest counted).
const LISTED: usize = 4;
/// Shape changes listed per event in the JSON document.
const LISTED_JSON: usize = 50;

fn text(value: &str) -> String {
    escape_untrusted(value, MAX_TEXT)
}

/// The first `LISTED` of `items`, then how many more.
fn listed(items: Vec<String>, max: usize) -> String {
    let more = items.len().saturating_sub(max);
    let mut shown: Vec<String> = items.into_iter().take(max).collect();
    if more > 0 {
        shown.push(format!("… {more} more"));
    }
    shown.join(", ")
}

impl EventDiff {
    /// `case event N (operation)`.
    pub fn label(&self) -> String {
        format!(
            "{} event {} ({})",
            text(&self.case),
            self.number,
            text(&self.operation)
        )
    }

    /// What differs, in one line.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.id_changes.is_empty() {
            let changes = self
                .id_changes
                .iter()
                .map(|(old, new)| format!("{} -> {}", text(old), text(new)))
                .collect();
            parts.push(format!(
                "ID changed {} (re-delivery risk: handed off again under the new ID)",
                listed(changes, LISTED)
            ));
        }
        if self.kinds.contains(&Kind::Decision) {
            parts.push(format!(
                "decision {} -> {}",
                self.old.decision.as_str(),
                self.new.decision.as_str()
            ));
        }
        if !self.shape.is_empty() {
            let changes = self.shape.iter().map(|c| text(&c.describe())).collect();
            parts.push(format!("shape {}", listed(changes, LISTED)));
        }
        if self.added > 0 {
            parts.push(format!("{} record(s) added", self.added));
        }
        if self.removed > 0 {
            parts.push(format!("{} record(s) removed", self.removed));
        }
        parts.join("; ")
    }

    fn json(&self) -> Value {
        let ids = |ids: &[String]| ids.iter().map(|id| text(id)).collect::<Vec<_>>();
        json!({
            "case": text(&self.case),
            "event": self.number,
            "operation": text(&self.operation),
            "kinds": self.kinds.iter().map(|k| k.key()).collect::<Vec<_>>(),
            "old": { "decision": self.old.decision.key(), "ids": ids(&self.old.ids) },
            "new": { "decision": self.new.decision.key(), "ids": ids(&self.new.ids) },
            "id_changes": self.id_changes.iter()
                .map(|(old, new)| json!({ "old": text(old), "new": text(new) }))
                .collect::<Vec<_>>(),
            "shape": self.shape.iter().take(LISTED_JSON)
                .map(|c| json!({ "path": text(&c.path), "old": c.old, "new": c.new }))
                .collect::<Vec<_>>(),
            "shape_more": self.shape.len().saturating_sub(LISTED_JSON),
            "added": self.added,
            "removed": self.removed,
        })
    }

    /// The JUnit failure type: what differs, `id-change` first.
    fn failure_type(&self) -> String {
        self.kinds
            .iter()
            .map(|k| match k {
                Kind::Id => "id-change",
                Kind::Shape => "shape-change",
                Kind::Decision => "decision-change",
                Kind::Added => "records-added",
                Kind::Removed => "records-removed",
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Report {
    /// `N events would be handed off again …` or that none changes its ID.
    pub fn verdict(&self) -> String {
        match self.count(Kind::Id) {
            0 => "no event changes its ID".into(),
            n => format!(
                "{n} event(s) would be handed off again under another ID (re-delivery risk)"
            ),
        }
    }

    fn counts(&self) -> String {
        format!(
            "{} ID changed (re-delivery risk), {} shape changed, {} decision changed, {} with records added, {} with records removed",
            self.count(Kind::Id),
            self.count(Kind::Shape),
            self.count(Kind::Decision),
            self.count(Kind::Added),
            self.count(Kind::Removed),
        )
    }

    /// The summary and a line per differing event.
    pub fn human(&self) -> String {
        let short = |sha: &str| sha.chars().take(16).collect::<String>();
        let mut out = format!(
            "old:     {} ({})\nnew:     {} ({})\nsource:  {} ({} case(s), {} events)\n",
            text(&self.old.0),
            short(&self.old.1),
            text(&self.new.0),
            short(&self.new.1),
            text(&self.source),
            self.cases,
            self.events.len(),
        );
        let differing = self.differing().count();
        out.push_str(&format!(
            "differ:  {differing} of {} events: {}\n",
            self.events.len(),
            self.counts()
        ));
        for event in self.differing() {
            let kinds: Vec<&str> = event.kinds.iter().map(|k| k.key()).collect();
            out.push_str(&format!(
                "{:<9} {}: {}\n",
                kinds.join(","),
                event.label(),
                event.summary()
            ));
        }
        out.push_str(&format!("verdict: {}\n", self.verdict()));
        out
    }

    /// One JSON document: both policies, the counts, and each differing event.
    pub fn json(&self) -> Value {
        let counts: serde_json::Map<String, Value> = Kind::ALL
            .iter()
            .map(|k| (k.key().to_string(), json!(self.count(*k))))
            .collect();
        json!({
            "old": { "policy": text(&self.old.0), "sha256": self.old.1 },
            "new": { "policy": text(&self.new.0), "sha256": self.new.1 },
            "source": text(&self.source),
            "cases": self.cases,
            "events": self.events.len(),
            "differing": self.differing().count(),
            "counts": counts,
            "id_changed": self.count(Kind::Id) > 0,
            "verdict": self.verdict(),
            "differences": self.differing().map(EventDiff::json).collect::<Vec<_>>(),
        })
    }

    /// JUnit XML: a testcase per event (its case the class name), a failure for each event that
    /// differs, its type saying what (`id-change`, `shape-change`, `decision-change`, …).
    pub fn junit(&self) -> Result<String> {
        self.write_junit()
            .map_err(|e| HandoffError::Internal(e.into()))
    }

    fn write_junit(&self) -> std::io::Result<String> {
        let name = format!(
            "handoff policy diff {} -> {}",
            text(&self.old.0),
            text(&self.new.0)
        );
        let mut junit = Junit::begin(
            &name,
            &Counts {
                tests: self.events.len(),
                failures: self.differing().count(),
                time: None,
            },
            &[("old_sha256", &self.old.1), ("new_sha256", &self.new.1)],
        )?;
        for event in &self.events {
            let case_name = format!("event {} ({})", event.number, text(&event.operation));
            let class = text(&event.case);
            let summary = event.summary();
            let kind = event.failure_type();
            let failure = (!event.kinds.is_empty()).then(|| Failure {
                message: &summary,
                kind: &kind,
                text: &summary,
            });
            junit.case(
                &JunitCase {
                    name: &case_name,
                    class: &class,
                    time: None,
                },
                failure.as_ref(),
            )?;
        }
        junit.finish()
    }
}
