use crate::common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use bson::doc;
use common::RawConn;
use mongo_sim::Config;
use mongo_sim::wire;
use proptest::prelude::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        let _ = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .try_init();
        captured
    })
}

fn logged(text: &str) -> bool {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).contains(text)
}

async fn assert_still_serving(port: u16, healthy: &mut RawConn) {
    let reply = healthy.command(77, &doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    let mut fresh = RawConn::connect(port).await;
    let reply = fresh.command(78, &doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
}

async fn expect_closed(bytes: &[u8]) {
    logs();
    let (server, _client) = common::start_with(Config {
        max_message_bytes: 64 * 1024,
        ..Config::default()
    })
    .await;
    let mut healthy = RawConn::connect(server.port()).await;
    let mut bad = RawConn::connect(server.port()).await;
    bad.send(bytes).await;
    assert!(
        bad.is_closed().await,
        "the server closes a connection that sent bad input"
    );
    assert_still_serving(server.port(), &mut healthy).await;
    server.shutdown().await;
}

fn header(len: i32, op: i32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&1i32.to_le_bytes());
    v.extend_from_slice(&0i32.to_le_bytes());
    v.extend_from_slice(&op.to_le_bytes());
    v
}

#[tokio::test]
async fn garbage_closes_only_that_connection() {
    expect_closed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(logged("closing connection after a bad message"));
}

#[tokio::test]
async fn oversized_message_closes() {
    let mut msg = header(10_000_000, wire::OP_MSG);
    msg.extend_from_slice(&[0u8; 64]);
    expect_closed(&msg).await;
    assert!(logged("exceeds the limit"));
}

#[tokio::test]
async fn negative_and_tiny_lengths_close() {
    expect_closed(&header(-5, wire::OP_MSG)).await;
    expect_closed(&header(3, wire::OP_MSG)).await;
}

#[tokio::test]
async fn unknown_opcode_closes() {
    let mut msg = header(16 + 8, 2001);
    msg.extend_from_slice(&[0u8; 8]);
    expect_closed(&msg).await;
}

#[tokio::test]
async fn malformed_bson_closes() {
    let good = wire::encode_op_msg_request(1, 0, &doc! {"ping": 1, "$db": "admin"}, &[]).unwrap();
    // Corrupt the embedded document's length.
    let mut bad = good.clone();
    bad[21] = 0xFF;
    expect_closed(&bad).await;
    // Truncate the document but keep the header consistent.
    let mut short = good[..good.len() - 3].to_vec();
    let len = short.len() as i32;
    short[0..4].copy_from_slice(&len.to_le_bytes());
    expect_closed(&short).await;
    // An unknown section kind.
    let mut kind = good.clone();
    kind[20] = 9;
    expect_closed(&kind).await;
    // A document sequence whose size runs past the message.
    let mut seq = good.clone();
    seq.extend_from_slice(&[1, 0xFF, 0xFF, 0, 0]);
    let len = seq.len() as i32;
    seq[0..4].copy_from_slice(&len.to_le_bytes());
    expect_closed(&seq).await;
}

/// A command nested far deeper than any real document, built byte by byte.
fn deeply_nested_ping(depth: usize) -> Vec<u8> {
    // {"ping": 1, "$db": "admin", "x": {"x": {... {} ...}}}
    let mut inner: Vec<u8> = vec![5, 0, 0, 0, 0];
    for _ in 0..depth {
        let mut d = Vec::new();
        d.extend_from_slice(&[0, 0, 0, 0, 0x03, b'x', 0]);
        d.extend_from_slice(&inner);
        d.push(0);
        let len = d.len() as i32;
        d[0..4].copy_from_slice(&len.to_le_bytes());
        inner = d;
    }
    let mut body = doc! {"ping": 1, "$db": "admin"}.to_vec().unwrap();
    body.pop();
    body.extend_from_slice(&[0x03, b'x', 0]);
    body.extend_from_slice(&inner);
    body.push(0);
    let len = body.len() as i32;
    body[0..4].copy_from_slice(&len.to_le_bytes());
    let mut msg = header((16 + 4 + 1 + body.len()) as i32, wire::OP_MSG);
    msg.extend_from_slice(&0u32.to_le_bytes());
    msg.push(0);
    msg.extend_from_slice(&body);
    msg
}

#[tokio::test]
async fn deeply_nested_documents_close_without_crashing() {
    expect_closed(&deeply_nested_ping(5_000)).await;
    assert!(logged("nested deeper"));
    // Moderate nesting is fine.
    let (server, _client) = common::start().await;
    let mut conn = RawConn::connect(server.port()).await;
    conn.send(&deeply_nested_ping(50)).await;
    let (_, reply) = wire::decode_op_msg_reply(&conn.recv().await.unwrap()).unwrap();
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    server.shutdown().await;
}

#[tokio::test]
async fn connection_closed_mid_message_is_harmless() {
    let (server, _client) = common::start().await;
    let mut healthy = RawConn::connect(server.port()).await;
    {
        let mut bad = RawConn::connect(server.port()).await;
        let good =
            wire::encode_op_msg_request(1, 0, &doc! {"ping": 1, "$db": "admin"}, &[]).unwrap();
        bad.send(&good[..good.len() / 2]).await;
    }
    assert_still_serving(server.port(), &mut healthy).await;
    server.shutdown().await;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decoder_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = wire::decode_message(&bytes, 1 << 20);
    }

    #[test]
    fn decoder_never_panics_on_random_bodies(
        op in prop_oneof![Just(wire::OP_MSG), Just(wire::OP_QUERY), any::<i32>()],
        flags in prop_oneof![Just(0u32), Just(1u32), Just(2u32), any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut msg = header((16 + 4 + body.len()) as i32, op);
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&body);
        let _ = wire::decode_message(&msg, 1 << 20);
    }

    #[test]
    fn decoder_never_panics_on_mutated_valid_messages(
        pos in any::<proptest::sample::Index>(),
        value in any::<u8>(),
        cut in any::<proptest::sample::Index>(),
    ) {
        let docs = vec![doc! {"_id": 1, "a": {"b": [1, 2, "x"]}}, doc! {"_id": 2}];
        let mut msg = wire::encode_op_msg_request(5, 0, &doc! {"insert": "c", "$db": "d"}, &[("documents", &docs)]).unwrap();
        let i = pos.index(msg.len());
        msg[i] = value;
        let keep = 16 + cut.index(msg.len() - 15);
        msg.truncate(keep.min(msg.len()));
        let _ = wire::decode_message(&msg, 1 << 20);
        if msg.len() >= 16 {
            let len = msg.len() as i32;
            msg[0..4].copy_from_slice(&len.to_le_bytes());
            let _ = wire::decode_message(&msg, 1 << 20);
        }
    }
}
