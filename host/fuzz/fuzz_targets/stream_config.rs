//! The stream configuration's parsers on arbitrary input: a `--pipeline` text, a stored
//! configuration (BSON) and a `--partition` text are accepted or refused, never a panic; what is
//! accepted survives its stored form unchanged, and no accepted pipeline stage outside the
//! allowed list gets through.
#![no_main]

use handoff_domain::StreamConfig;
use handoff_domain::config::{ALLOWED_STAGES, Partition, parse_pipeline};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Partition::parse(text);
        if let Ok(pipeline) = parse_pipeline(text) {
            for stage in &pipeline {
                let name = stage.keys().next().expect("a stage has its name");
                assert!(ALLOWED_STAGES.contains(&name.as_str()), "{name} accepted");
            }
            let config = StreamConfig {
                pipeline,
                ..StreamConfig::default()
            };
            // Compared as BSON (digests, differences): a stage may hold NaN.
            let stored = StreamConfig::from_document(&config.to_document()).expect("its own form");
            assert_eq!(stored.digest(), config.digest());
            assert_eq!(config.differences(&stored), Vec::<String>::new());
        }
    }
    if let Ok(stored) = bson::Document::from_reader(data)
        && let Ok(config) = StreamConfig::from_document(&stored)
    {
        let again = StreamConfig::from_document(&config.to_document()).expect("its own form");
        assert_eq!(again.digest(), config.digest());
        let state =
            handoff_domain::state::StateCollections::new("db", &["checkpoints", "outbox"]);
        let _ = config.stages(&state);
    }
});
