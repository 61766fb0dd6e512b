//! Test policy: outbox IDs made of the event's document key and cluster time,
//! `<operationType>-<32 hex digits>`, not of its token: an event has the same ID however its
//! stream was shaped (split in fragments or not).
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    fn open() -> Result<host::ChangeStream, String> {
        let checkpoint = host::load_checkpoint();
        let start = match (checkpoint.token, checkpoint.mode) {
            (None, _) => types::StreamStart::Now,
            (Some(t), types::ResumeMode::ResumeAfter) => types::StreamStart::ResumeAfter(t),
            (Some(t), types::ResumeMode::StartAfter) => types::StreamStart::StartAfter(t),
        };
        host::open_stream(&start).map_err(|e| format!("{e:?}"))
    }

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            use sha2::Digest;
            let mut token = host::load_checkpoint().token;
            let stream = open()?;
            let (mut handed_off, mut last, mut invalidated) = (0u32, String::new(), false);
            let mut deadline = host::monotonic_ms() + settings.max_wait_ms;
            let mut count = 0;
            while count < settings.max_events && host::monotonic_ms() < deadline {
                let Some(event) = stream.next().map_err(|e| format!("{e:?}"))? else {
                    continue;
                };
                // A split event's fields are read across its fragments.
                let key = stream.field(&event.token, "documentKey");
                let time = stream.field(&event.token, "clusterTime");
                let identity = match (key, time) {
                    (Some(key), Some(time)) => format!("{key} {time}"),
                    _ => event.token.clone(),
                };
                let digest = hex::encode(sha2::Sha256::digest(identity.as_bytes()));
                let invalidate = event.operation_type == "invalidate";
                let id = format!("{}-{}", event.operation_type, &digest[..32]);
                host::commit(&types::CommitRequest {
                    expected: token.clone(),
                    next: event.token.clone(),
                    mode: if invalidate {
                        types::ResumeMode::StartAfter
                    } else {
                        types::ResumeMode::ResumeAfter
                    },
                    outbox_id: (!invalidate).then(|| id.clone()),
                })
                .map_err(|e| format!("{e:?}"))?;
                token = Some(event.token);
                count += 1;
                if invalidate {
                    invalidated = true;
                    break;
                }
                handed_off += 1;
                last = id;
                deadline = host::monotonic_ms() + settings.max_wait_ms;
            }
            if !invalidated
                && count < settings.max_events
                && let Some(mark) = stream.watermark()
                && Some(&mark) != token.as_ref()
            {
                host::advance_watermark(token.as_deref(), &mark).map_err(|e| format!("{e:?}"))?;
            }
            let status = if invalidated {
                types::RunStatus::Invalidated
            } else if handed_off > 0 {
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
