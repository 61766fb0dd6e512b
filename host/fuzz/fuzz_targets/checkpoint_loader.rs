//! The checkpoint loader on arbitrary BSON documents: `handoff_domain::checkpoint::validate` accepts or
//! refuses, never panics, and whatever it accepts is the document's own token and a known mode.
#![no_main]

use bson::Bson;
use handoff_domain::Mode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(stored) = bson::Document::from_reader(data) else {
        return;
    };
    // A fixed deployment (most documents stop at the source check) and the document's own source
    // and replica set (reaches the shape checks).
    let _ = handoff_domain::checkpoint::validate(&stored, "shop.orders", "65f000000000000000000001");
    let source = stored
        .get_str("source")
        .unwrap_or("shop.orders")
        .to_string();
    let replica_set = stored
        .get_str("replicaSetId")
        .unwrap_or("65f000000000000000000001")
        .to_string();
    if let Ok(checkpoint) = handoff_domain::checkpoint::validate(&stored, &source, &replica_set) {
        match (stored.get("token"), &checkpoint.token) {
            (Some(Bson::Document(saved)), Some(token)) => {
                // As BSON: `Document` equality fails for a token holding NaN.
                assert_eq!(saved.to_vec().ok(), token.to_vec().ok(), "{saved:?}")
            }
            (None | Some(Bson::Null), None) => {}
            (saved, token) => panic!("token {saved:?} loaded as {token:?}"),
        }
        match stored.get("mode") {
            None => assert_eq!(checkpoint.mode, Mode::ResumeAfter),
            Some(Bson::String(name)) => assert_eq!(checkpoint.mode.as_str(), name),
            Some(other) => panic!("mode {other:?} accepted"),
        }
    }
});
