//! Test policy: commits the first delivered event as a policy-shaped record that breaks one rule
//! of the contract, chosen by `--policy-param attack=…`:
//! `dollar-key`, `nul-key`, `top-level-id`, `event-type`, `aggregate-document`, `not-json`,
//! `payload-array`, `oversized-payload` (5 MiB), `many-values` (1.2 million numbers in 2.4 MB of
//! text), or `valid` (a well-formed record).
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    fn record(id: &str, attack: &str) -> types::OutboxRecord {
        let mut record = types::OutboxRecord {
            id: id.to_string(),
            event_type: String::new(),
            schema_version: 1,
            aggregate_id: "\"o-1\"".into(),
            aggregate_version: Some("7".into()),
            payload: r#"{"total": 5, "at": {"$date": "2026-01-01T00:00:00Z"}}"#.into(),
        };
        record.event_type = "OrderCreated".into();
        match attack {
            "dollar-key" => record.payload = r#"{"nested": {"$where": "sleep(1000)"}}"#.into(),
            "nul-key" => record.payload = "{\"a\\u0000b\": 1}".into(),
            "top-level-id" => record.payload = r#"{"_id": "forged"}"#.into(),
            "event-type" => record.event_type = "Order Created!".into(),
            "aggregate-document" => record.aggregate_id = r#"{"a": 1}"#.into(),
            "not-json" => record.payload = "not json".into(),
            "payload-array" => record.payload = "[1, 2]".into(),
            "many-values" => record.payload = format!("{{\"a\": [{}0]}}", "0,".repeat(1_200_000)),
            "oversized-payload" => {
                record.payload = format!("{{\"blob\": \"{}\"}}", "x".repeat(5 << 20))
            }
            _ => {}
        }
        record
    }

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            let attack = settings
                .params
                .iter()
                .find(|(k, _)| k == "attack")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let checkpoint = host::load_checkpoint();
            let start = match (&checkpoint.token, checkpoint.mode) {
                (None, _) => types::StreamStart::Now,
                (Some(t), types::ResumeMode::ResumeAfter) => {
                    types::StreamStart::ResumeAfter(t.clone())
                }
                (Some(t), types::ResumeMode::StartAfter) => {
                    types::StreamStart::StartAfter(t.clone())
                }
            };
            let stream = host::open_stream(&start).map_err(|e| format!("{e:?}"))?;
            let first = stream
                .next()
                .map_err(|e| format!("{e:?}"))?
                .ok_or("no event")?;
            let next = first.token;
            let decisions = vec![types::RecordDecision::HandOffRecord(record(
                "shaped-1", &attack,
            ))];
            host::commit_records(&types::RecordsRequest {
                expected: checkpoint.token,
                next,
                mode: types::ResumeMode::ResumeAfter,
                decisions,
            })
            .map_err(|e| format!("{e:?}"))?;
            Ok(types::Report {
                status: types::RunStatus::HandedOff,
                events_handed_off: 1,
                last_event_id: "shaped-1".into(),
            })
        }
    }

    export!(Policy);
}
