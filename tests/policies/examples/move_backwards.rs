//! Test policy: tries to move the checkpoint backwards (`--policy-param how=…`):
//! - `commit`: commits an old token (`--policy-param old=<canonical token>`) instead of the
//!   delivered event;
//! - `watermark`: reads the stream dry, then saves the old token as the idle watermark;
//! - `recommit`: commits the first delivered event, then commits it again.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    fn param(settings: &types::Settings, key: &str) -> String {
        settings
            .params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    fn report(events: u32, last: &str) -> types::Report {
        types::Report {
            status: if events > 0 {
                types::RunStatus::HandedOff
            } else {
                types::RunStatus::Idle
            },
            events_handed_off: events,
            last_event_id: last.to_string(),
        }
    }

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            let how = param(&settings, "how");
            let old = param(&settings, "old");
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
            let fail = |e: types::CommitError| format!("{e:?}");
            match how.as_str() {
                "commit" => {
                    stream
                        .next()
                        .map_err(|e| format!("{e:?}"))?
                        .ok_or("no event")?;
                    host::commit(&types::CommitRequest {
                        expected: checkpoint.token,
                        next: old,
                        mode: types::ResumeMode::ResumeAfter,
                        outbox_id: Some("old".into()),
                    })
                    .map_err(fail)?;
                    Ok(report(1, "old"))
                }
                "watermark" => {
                    while stream.next().map_err(|e| format!("{e:?}"))?.is_some() {}
                    host::advance_watermark(checkpoint.token.as_deref(), &old).map_err(fail)?;
                    Ok(report(0, ""))
                }
                "recommit" => {
                    let first = stream
                        .next()
                        .map_err(|e| format!("{e:?}"))?
                        .ok_or("no event")?;
                    host::commit(&types::CommitRequest {
                        expected: checkpoint.token,
                        next: first.token.clone(),
                        mode: types::ResumeMode::ResumeAfter,
                        outbox_id: Some("first".into()),
                    })
                    .map_err(fail)?;
                    let _ = stream.next();
                    host::commit(&types::CommitRequest {
                        expected: Some(first.token.clone()),
                        next: first.token,
                        mode: types::ResumeMode::ResumeAfter,
                        outbox_id: Some("again".into()),
                    })
                    .map_err(fail)?;
                    Ok(report(2, "again"))
                }
                other => Err(format!("unknown how={other:?}")),
            }
        }
    }

    export!(Policy);
}
