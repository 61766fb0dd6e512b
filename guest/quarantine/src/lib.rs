//! The quarantine policy: events whose `fullDocument.schemaVersion` is outside the supported set
//! (policy parameter `supported`, comma-separated integers, default `1`) are written to the
//! quarantine with their token and a reason instead of the outbox, and the stream keeps going: a
//! poison event never blocks it. An event with a `fullDocument` but no `schemaVersion` is
//! quarantined too; events without a document (deletes, drops) are handed off. IDs, resume mode,
//! invalidation and the idle watermark are the default policy's.

use handoff_policy_sdk::{Checkpoint, Decision, Host, Report, Settings, run_each};

/// The supported schema versions from the `supported` parameter.
pub fn supported(settings: &Settings) -> Result<Vec<i64>, String> {
    let text = settings.param("supported").unwrap_or("1");
    text.split(',')
        .map(|v| {
            v.trim()
                .parse::<i64>()
                .map_err(|_| format!("supported must list integers, not {text:?}"))
        })
        .collect()
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

pub fn run<H: Host>(
    host: &mut H,
    checkpoint: Checkpoint,
    settings: &Settings,
) -> Result<Report, String> {
    let supported = supported(settings)?;
    run_each(host, checkpoint, settings, |host, event, id| {
        let document = host
            .field(&event.token, "fullDocument")
            .filter(|d| d != "null");
        let version = host.field(&event.token, "fullDocument.schemaVersion");
        match refusal(document.as_deref(), version.as_deref(), &supported) {
            Some(reason) => Decision::Quarantine { id, reason },
            None => Decision::HandOff(id),
        }
    })
}

#[cfg(target_arch = "wasm32")]
handoff_policy_sdk::export_policy!(run);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_versions_and_refusals() {
        let s = Settings {
            params: vec![("supported".into(), "1, 2".into())],
            ..Settings::default()
        };
        let versions = supported(&s).unwrap();
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
        let bad = Settings {
            params: vec![("supported".into(), "one".into())],
            ..Settings::default()
        };
        assert!(supported(&bad).is_err());
    }
}
