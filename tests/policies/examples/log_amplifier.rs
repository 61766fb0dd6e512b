//! Test policy: one host call whose list names the same 8 MiB of its memory 100,000 times (the
//! strings alias one buffer, so the policy stays far under its memory cap): a log call's fields,
//! with `--policy-param call=commit-batch` a batch's hand-off IDs, or with `call=commit-records`
//! the payloads and IDs of shaped records. Copying every string would
//! cost the host terabytes. After a log call it fails with "logged", so the run's end shows the
//! host came through.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use std::mem::ManuallyDrop;

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            let mut big = ManuallyDrop::new("x".repeat(8 << 20));
            let (ptr, len, cap) = (big.as_mut_ptr(), big.len(), big.capacity());
            // SAFETY: every alias is read only, never dropped (the vector is leaked), and the
            // buffer outlives the call.
            let alias = || unsafe { String::from_raw_parts(ptr, len, cap) };
            let fields: ManuallyDrop<Vec<(String, String)>> =
                ManuallyDrop::new((0..100_000).map(|_| (alias(), alias())).collect());
            if settings
                .params
                .iter()
                .any(|(k, v)| k == "call" && v == "commit-batch")
            {
                let request = ManuallyDrop::new(types::BatchRequest {
                    expected: None,
                    next: "{}".into(),
                    mode: types::ResumeMode::ResumeAfter,
                    decisions: (0..100_000)
                        .map(|_| types::EventDecision::HandOff(alias()))
                        .collect(),
                });
                host::commit_batch(&request).map_err(|e| format!("{e:?}"))?;
                return Err("committed".into());
            }
            if settings
                .params
                .iter()
                .any(|(k, v)| k == "call" && v == "commit-records")
            {
                let request = ManuallyDrop::new(types::RecordsRequest {
                    expected: None,
                    next: "{}".into(),
                    mode: types::ResumeMode::ResumeAfter,
                    decisions: (0..100_000)
                        .map(|_| {
                            types::RecordDecision::HandOffRecord(types::OutboxRecord {
                                id: alias(),
                                event_type: alias(),
                                schema_version: 1,
                                aggregate_id: alias(),
                                aggregate_version: Some(alias()),
                                payload: alias(),
                            })
                        })
                        .collect(),
                });
                host::commit_records(&request).map_err(|e| format!("{e:?}"))?;
                return Err("committed".into());
            }
            host::log(types::LogLevel::Info, "amplified", &fields);
            Err("logged".into())
        }
    }

    export!(Policy);
}
