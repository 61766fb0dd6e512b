//! Test policy: hands events off with IDs made of what it reads from WASI — the wall clock, the
//! monotonic clock after a 1.5 s sleep, and both random sources:
//! `w<wall seconds>.<nanoseconds>-m<monotonic ns since start>-r<random u64>-i<insecure u64>-<n>`.
//! Under a replay every part must follow the recording, not the real time or randomness.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    #[link(wasm_import_module = "wasi:random/random@0.2.12")]
    unsafe extern "C" {
        #[link_name = "get-random-u64"]
        fn get_random_u64() -> i64;
    }

    #[link(wasm_import_module = "wasi:random/insecure@0.2.12")]
    unsafe extern "C" {
        #[link_name = "get-insecure-random-u64"]
        fn get_insecure_random_u64() -> i64;
    }

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
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|e| e.to_string())?;
            let started = std::time::Instant::now();
            std::thread::sleep(std::time::Duration::from_millis(1500));
            let mut token = host::load_checkpoint().token;
            let stream = open()?;
            let (mut handed_off, mut last) = (0u32, String::new());
            while handed_off < settings.max_events {
                let Some(event) = stream.next().map_err(|e| format!("{e:?}"))? else {
                    break;
                };
                // SAFETY: the imports take no arguments and return an integer.
                let (random, insecure) = unsafe { (get_random_u64(), get_insecure_random_u64()) };
                let id = format!(
                    "w{}.{}-m{}-r{:016x}-i{:016x}-{}",
                    wall.as_secs(),
                    wall.subsec_nanos(),
                    started.elapsed().as_nanos(),
                    random as u64,
                    insecure as u64,
                    handed_off
                );
                host::commit(&types::CommitRequest {
                    expected: token.clone(),
                    next: event.token.clone(),
                    mode: types::ResumeMode::ResumeAfter,
                    outbox_id: Some(id.clone()),
                })
                .map_err(|e| format!("{e:?}"))?;
                token = Some(event.token);
                handed_off += 1;
                last = id;
            }
            Ok(types::Report {
                status: if handed_off > 0 {
                    types::RunStatus::HandedOff
                } else {
                    types::RunStatus::Idle
                },
                events_handed_off: handed_off,
                last_event_id: last,
            })
        }
    }

    export!(Policy);
}
