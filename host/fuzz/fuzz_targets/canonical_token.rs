//! The canonical token text of arbitrary BSON documents: never panics, is deterministic, is
//! printable ASCII JSON, and does not depend on the order of the document's keys.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(token) = bson::Document::from_reader(data) else {
        return;
    };
    let text = handoff_domain::token::canonical_text(&token);
    assert_eq!(text, handoff_domain::token::canonical_text(&token));
    assert!(text.bytes().all(|b| (0x20..0x7f).contains(&b)), "{text}");
    assert!(text.starts_with('{') && text.ends_with('}'), "{text}");
    let mut reversed = bson::Document::new();
    let entries: Vec<_> = token.iter().collect();
    for (key, value) in entries.into_iter().rev() {
        reversed.insert(key.clone(), value.clone());
    }
    assert_eq!(text, handoff_domain::token::canonical_text(&reversed));
});
