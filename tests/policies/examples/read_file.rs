//! Test policy: tries to read a host file (`--policy-param path=…`, `/etc/hostname` by default)
//! and list its directory and the root, and hands off whatever it finds as the outbox ID of the
//! first event. Without preopens it must find nothing.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

#[cfg(target_arch = "wasm32")]
mod policy {
    wit_bindgen::generate!({ path: "../../wit", world: "handoff-policy" });

    use exports::handoff::policy::policy::Guest;
    use handoff::policy::{host, types};

    struct Policy;

    fn leak(data: &str) -> Result<types::Report, String> {
        let checkpoint = host::load_checkpoint();
        let stream = host::open_stream(&types::StreamStart::Now).map_err(|e| format!("{e:?}"))?;
        let first = stream
            .next()
            .map_err(|e| format!("{e:?}"))?
            .ok_or("no event")?;
        let id: String = data
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(200)
            .collect();
        host::commit(&types::CommitRequest {
            expected: checkpoint.token,
            next: first.token,
            mode: types::ResumeMode::ResumeAfter,
            outbox_id: Some(id.clone()),
        })
        .map_err(|e| format!("{e:?}"))?;
        Ok(types::Report {
            status: types::RunStatus::HandedOff,
            events_handed_off: 1,
            last_event_id: id,
        })
    }

    impl Guest for Policy {
        fn run(settings: types::Settings) -> Result<types::Report, String> {
            let path = settings
                .params
                .iter()
                .find(|(k, _)| k == "path")
                .map_or("/etc/hostname".to_string(), |(_, v)| v.clone());
            match std::fs::read_to_string(&path) {
                Ok(text) => return leak(&format!("file-{text}")),
                Err(e) => host::log(types::LogLevel::Info, &format!("read: {e}"), &[]),
            }
            let parent = std::path::Path::new(&path)
                .parent()
                .map_or("/".to_string(), |p| p.display().to_string());
            for dir in [parent.as_str(), "/", "."] {
                if let Ok(entries) = std::fs::read_dir(dir) {
                    let names: Vec<String> = entries
                        .filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect();
                    if !names.is_empty() {
                        return leak(&format!("dir-{}", names.join("-")));
                    }
                }
            }
            Err("no file access: the sandbox granted no files".into())
        }
    }

    export!(Policy);
}
