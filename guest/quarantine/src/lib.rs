//! The quarantine policy: events whose `fullDocument.schemaVersion` is outside the supported set
//! (policy parameter `supported`, comma-separated integers, default `1`) are written to the
//! quarantine with their token and a reason instead of the outbox, and the stream keeps going: a
//! poison event never blocks it. An event with a `fullDocument` but no `schemaVersion` is
//! quarantined too; events without a document (deletes, drops) are handed off. An update whose
//! update description sets an unsupported `schemaVersion` is quarantined whatever the document
//! looked up later holds (the event carries what it set). Documents read
//! by `backfill` and `reconcile --repair` (`snapshot` events) are judged the same way: a poison
//! document is quarantined there too, and a correction of a document the source no longer holds
//! is handed off like a delete. IDs, resume mode,
//! invalidation and the idle watermark are the default policy's: the SDK's run loop.

use handoff_policy_sdk::{Decision, Delivered, FromSettings, Policy, Settings};

/// Quarantines the events of unsupported schema versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantine {
    pub supported: Vec<i64>,
}

impl FromSettings for Quarantine {
    /// The supported schema versions from the `supported` parameter.
    fn from_settings(settings: &Settings) -> Result<Quarantine, String> {
        let text = settings.param("supported").unwrap_or("1");
        let supported = text
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("supported must list integers, not {text:?}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Quarantine { supported })
    }
}

/// Why an event is refused, if it is.
pub fn refusal(document: Option<&str>, version: Option<&str>, supported: &[i64]) -> Option<String> {
    document?;
    let Some(version) = version else {
        return Some("fullDocument has no schemaVersion".to_string());
    };
    // Relaxed Extended JSON: an integer prints as a plain number.
    match version.parse::<i64>() {
        Ok(v) if supported.contains(&v) => None,
        _ => Some(format!(
            "schemaVersion {} is not supported (supported: {})",
            version.chars().take(40).collect::<String>(),
            supported
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )),
    }
}

impl Policy for Quarantine {
    const PARAMETERS: &'static [(&'static str, &'static str)] = &[(
        "supported",
        "the schema versions handed off, comma-separated integers (default 1)",
    )];

    fn decide(&mut self, event: &mut Delivered<'_>, id: String) -> Decision {
        let document = event.field("fullDocument").filter(|d| d != "null");
        let version = event.field("fullDocument.schemaVersion");
        // What an update set is judged too: the document looked up later may no longer hold it,
        // but the event carries it in its update description.
        let set = event.field("updateDescription.updatedFields.schemaVersion");
        let refused =
            refusal(document.as_deref(), version.as_deref(), &self.supported).or_else(|| {
                let set = set?;
                refusal(Some("{}"), Some(&set), &self.supported)
                    .map(|reason| format!("the update sets {reason}"))
            });
        match refused {
            Some(reason) => Decision::Quarantine { id, reason },
            None => Decision::HandOff(id),
        }
    }
}

#[cfg(target_arch = "wasm32")]
handoff_policy_sdk::export_policy!(Quarantine);

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_policy_sdk::fake::FakeHost;
    use handoff_policy_sdk::{event_id, run};

    #[test]
    fn supported_versions_and_refusals() {
        let s = Settings::default().param_set("supported", "1, 2");
        let versions = Quarantine::from_settings(&s).unwrap().supported;
        assert_eq!(versions, vec![1, 2]);
        assert_eq!(refusal(Some("{}"), Some("2"), &versions), None);
        assert!(
            refusal(Some("{}"), Some("3"), &versions)
                .unwrap()
                .contains("schemaVersion 3 is not supported")
        );
        assert!(refusal(Some("{}"), Some("\"1\""), &versions).is_some());
        assert!(
            refusal(Some("{}"), None, &versions)
                .unwrap()
                .contains("no schemaVersion")
        );
        assert_eq!(refusal(None, None, &versions), None);
        let bad = Settings::default().param_set("supported", "one");
        assert!(Quarantine::from_settings(&bad).is_err());
    }

    #[test]
    fn a_poison_event_is_quarantined_and_the_stream_goes_on() {
        let mut host = FakeHost::new()
            .event("A", "insert")
            .field("A", "fullDocument", "{\"schemaVersion\": 1}")
            .field("A", "fullDocument.schemaVersion", "1")
            .event("B", "insert")
            .field("B", "fullDocument", "{\"schemaVersion\": 9}")
            .field("B", "fullDocument.schemaVersion", "9")
            .event("C", "delete")
            .field("C", "fullDocument", "null")
            .watermark("W");
        let report = run::<Quarantine>(&mut host, &Settings::new(50, 3000)).unwrap();
        assert_eq!(report.events_handed_off, 2);
        assert_eq!(host.handed_off(), vec![event_id("A"), event_id("C")]);
        let quarantined = host.quarantined();
        assert_eq!(quarantined.len(), 1);
        assert_eq!(quarantined[0].0, event_id("B"));
        assert!(
            quarantined[0]
                .1
                .contains("schemaVersion 9 is not supported")
        );
        assert_eq!(host.token(), Some("W"));
    }

    #[test]
    fn an_update_setting_an_unsupported_version_is_quarantined_whatever_its_lookup_holds() {
        let mut host = FakeHost::new()
            .event("A", "update")
            .field("A", "fullDocument", "{\"schemaVersion\": 1}")
            .field("A", "fullDocument.schemaVersion", "1")
            .field("A", "updateDescription.updatedFields.schemaVersion", "99")
            .event("B", "update")
            .field("B", "fullDocument", "null")
            .field("B", "updateDescription.updatedFields.schemaVersion", "99")
            .event("C", "update")
            .field("C", "fullDocument", "{\"schemaVersion\": 1}")
            .field("C", "fullDocument.schemaVersion", "1")
            .field("C", "updateDescription.updatedFields.schemaVersion", "1")
            .watermark("W");
        run::<Quarantine>(&mut host, &Settings::new(50, 3000)).unwrap();
        assert_eq!(host.handed_off(), vec![event_id("C")]);
        let quarantined = host.quarantined();
        assert_eq!(quarantined.len(), 2);
        assert!(
            quarantined[0]
                .1
                .contains("the update sets schemaVersion 99")
        );
    }

    #[test]
    fn a_snapshot_run_judges_documents_as_it_judges_changes() {
        let mut host = FakeHost::new()
            .kind(handoff_policy_sdk::RunKind::Backfill)
            .snapshot("A", "1", "{\"schemaVersion\": 1}")
            .field("A", "fullDocument.schemaVersion", "1")
            .snapshot("B", "2", "{\"schemaVersion\": 99}")
            .field("B", "fullDocument.schemaVersion", "99")
            .snapshot("C", "3", "null");
        let report = run::<Quarantine>(&mut host, &Settings::new(3, 3000)).unwrap();
        assert_eq!(report.events_handed_off, 2);
        assert_eq!(host.handed_off(), vec![event_id("A"), event_id("C")]);
        assert_eq!(host.quarantined()[0].0, event_id("B"));
    }
}
