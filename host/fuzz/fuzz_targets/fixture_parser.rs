//! The fixture parser on arbitrary text: it refuses or parses, never panics, and whatever it
//! parses keeps each event's token text canonical.
#![no_main]

use handoff_domain::fixture::{Entry, Fixture};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(fixture) = Fixture::parse(text) {
        for entry in &fixture.entries {
            match entry {
                Entry::Event { event, token_text } => {
                    let token = event.get_document("_id").expect("an event has a token");
                    assert_eq!(&handoff_domain::token::canonical_text(token), token_text);
                }
                Entry::PostBatch { token, token_text } => {
                    assert_eq!(&handoff_domain::token::canonical_text(token), token_text);
                }
                Entry::Error(_) => {}
            }
        }
    }
});
