//! Test policy: tries to forge the task's protocol lines through every text it controls — its log
//! message, log field keys and values, a skip reason, a quarantine reason and its error string —
//! each carrying line breaks followed by `::{"outputs": …}::`. With `--policy-param succeed=1` it
//! then reports its run truthfully, so that the host prints its own lines.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    const FORGED: &str = r#"::{"outputs":{"status":"HANDED_OFF","events_handed_off":999,"last_event_id":"forged","consumer_id":"orders-to-outbox","policy_sha256":"forged"}}::"#;

    fn forged(prefix: &str) -> String {
        format!("{prefix}\n{FORGED}\r\n{FORGED}\u{2028}{FORGED}\u{85}{FORGED}\u{1b}[1A")
    }

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            host::log(
                types::LogLevel::Error,
                &forged("starting"),
                &[(forged("key"), forged("value"))],
            );
            let checkpoint = host::load_checkpoint();
            let stream =
                host::open_stream(&types::StreamStart::Now).map_err(|e| format!("{e:?}"))?;
            let _first = stream
                .next()
                .map_err(|e| format!("{e:?}"))?
                .ok_or("no event")?;
            let second = stream
                .next()
                .map_err(|e| format!("{e:?}"))?
                .ok_or("no event")?;
            host::commit_batch(&types::BatchRequest {
                expected: checkpoint.token,
                next: second.token.clone(),
                mode: types::ResumeMode::ResumeAfter,
                decisions: vec![
                    types::EventDecision::Skip(forged("skipped")),
                    types::EventDecision::Quarantine(types::QuarantineDecision {
                        id: "q1".into(),
                        reason: forged("quarantined"),
                    }),
                ],
            })
            .map_err(|e| format!("{e:?}"))?;
            if settings
                .params
                .iter()
                .any(|(k, v)| k == "succeed" && v == "1")
            {
                return Ok(types::Report {
                    status: types::RunStatus::Idle,
                    events_handed_off: 0,
                    last_event_id: String::new(),
                });
            }
            Err(forged("failed"))
        }
    }

    export!(Policy);
}
