//! The test server's wire decoder on arbitrary bytes: whole messages (header included) and single
//! BSON documents are decoded or refused, never panicked on.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mongo_sim::wire::decode_message(data, 48_000_000);
    let _ = mongo_sim::wire::decode_document(data);
    if data.len() >= mongo_sim::wire::HEADER_LEN {
        let mut header = [0u8; mongo_sim::wire::HEADER_LEN];
        header.copy_from_slice(&data[..mongo_sim::wire::HEADER_LEN]);
        let header = mongo_sim::wire::Header::parse(&header);
        let _ = mongo_sim::wire::decode(&header, &data[mongo_sim::wire::HEADER_LEN..]);
    }
});
