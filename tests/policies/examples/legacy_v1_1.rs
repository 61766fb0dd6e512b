//! Test policy: built against the frozen contract 1.1.0 (`wit/since_v1.1.0`) and committing with
//! `commit-batch`, to show that a host implementing a newer minor version runs it unchanged.
//! Outbox IDs are `v11-<16 hex digits>`; an invalidate is a skip.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit/since_v1.1.0", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            use sha2::Digest;
            let checkpoint = host::load_checkpoint();
            let mut token = checkpoint.token.clone();
            let start = match (checkpoint.token, checkpoint.mode) {
                (None, _) => types::StreamStart::Now,
                (Some(t), types::ResumeMode::ResumeAfter) => types::StreamStart::ResumeAfter(t),
                (Some(t), types::ResumeMode::StartAfter) => types::StreamStart::StartAfter(t),
            };
            let stream = host::open_stream(&start).map_err(|e| format!("{e:?}"))?;
            let (mut handed_off, mut last, mut count) = (0u32, String::new(), 0u32);
            let mut deadline = host::monotonic_ms() + settings.max_wait_ms;
            while count < settings.max_events && host::monotonic_ms() < deadline {
                let Some(event) = stream.next().map_err(|e| format!("{e:?}"))? else {
                    continue;
                };
                let invalidate = event.operation_type == "invalidate";
                let id = format!(
                    "v11-{}",
                    &hex::encode(sha2::Sha256::digest(event.token.as_bytes()))[..16]
                );
                host::commit_batch(&types::BatchRequest {
                    expected: token.clone(),
                    next: event.token.clone(),
                    mode: if invalidate {
                        types::ResumeMode::StartAfter
                    } else {
                        types::ResumeMode::ResumeAfter
                    },
                    decisions: vec![if invalidate {
                        types::EventDecision::Skip("invalidate".into())
                    } else {
                        types::EventDecision::HandOff(id.clone())
                    }],
                })
                .map_err(|e| format!("{e:?}"))?;
                token = Some(event.token);
                count += 1;
                if invalidate {
                    return Ok(types::Report {
                        status: types::RunStatus::Invalidated,
                        events_handed_off: handed_off,
                        last_event_id: last,
                    });
                }
                handed_off += 1;
                last = id;
                deadline = host::monotonic_ms() + settings.max_wait_ms;
            }
            if count < settings.max_events
                && let Some(mark) = stream.watermark()
                && Some(&mark) != token.as_ref()
            {
                host::advance_watermark(token.as_deref(), &mark).map_err(|e| format!("{e:?}"))?;
            }
            let status = if handed_off > 0 {
                types::RunStatus::HandedOff
            } else {
                types::RunStatus::Idle
            };
            Ok(types::Report {
                status,
                events_handed_off: handed_off,
                last_event_id: last,
            })
        }
    }

    export!(Policy);
}
