use crate::common;

use bson::{Document, doc};
use common::RawConn;
use mongo_sim::wire::{self, FLAG_MORE_TO_COME};

#[tokio::test]
async fn op_query_handshake_gets_op_reply() {
    let (server, _client) = common::start().await;
    let mut conn = RawConn::connect(server.port()).await;
    let q =
        wire::encode_op_query(4242, "admin.$cmd", &doc! {"ismaster": 1, "helloOk": true}).unwrap();
    conn.send(&q).await;
    let reply = conn.recv().await.unwrap();
    let opcode = i32::from_le_bytes([reply[12], reply[13], reply[14], reply[15]]);
    assert_eq!(opcode, wire::OP_REPLY);
    // responseFlags 0, cursorID 0, startingFrom 0, numberReturned 1.
    assert_eq!(&reply[16..20], &0i32.to_le_bytes());
    assert_eq!(&reply[20..28], &0i64.to_le_bytes());
    assert_eq!(&reply[28..32], &0i32.to_le_bytes());
    assert_eq!(&reply[32..36], &1i32.to_le_bytes());
    let (header, doc) = wire::decode_op_reply(&reply).unwrap();
    assert_eq!(header.response_to, 4242);
    assert!(doc.get_bool("ismaster").unwrap());
    assert_eq!(doc.get_str("setName").unwrap(), "rs0");
    // The same connection then speaks OP_MSG.
    let pong = conn.command(1, &doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(pong.get_f64("ok").unwrap(), 1.0);
    server.shutdown().await;
}

#[tokio::test]
async fn op_msg_replies_have_flags_zero_and_one_section() {
    let (server, _client) = common::start().await;
    let mut conn = RawConn::connect(server.port()).await;
    let bytes = wire::encode_op_msg_request(9, 0, &doc! {"hello": 1, "$db": "admin"}, &[]).unwrap();
    conn.send(&bytes).await;
    let reply = conn.recv().await.unwrap();
    assert_eq!(
        i32::from_le_bytes([reply[12], reply[13], reply[14], reply[15]]),
        wire::OP_MSG
    );
    assert_eq!(&reply[16..20], &0u32.to_le_bytes(), "flags");
    assert_eq!(reply[20], 0, "kind-0 section");
    let doc_len = i32::from_le_bytes([reply[21], reply[22], reply[23], reply[24]]) as usize;
    assert_eq!(
        21 + doc_len,
        reply.len(),
        "exactly one section, no checksum"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn document_sequences_in_both_forms() {
    let (server, _client) = common::start().await;
    let mut conn = RawConn::connect(server.port()).await;
    // PyMongo form: every batch as a kind-1 sequence.
    let docs = vec![doc! {"_id": 1, "v": 1}, doc! {"_id": 2, "v": 2}];
    let bytes = wire::encode_op_msg_request(
        1,
        0,
        &doc! {"insert": "c", "$db": "w"},
        &[("documents", &docs)],
    )
    .unwrap();
    conn.send(&bytes).await;
    let (_, reply) = wire::decode_op_msg_reply(&conn.recv().await.unwrap()).unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 2);
    let updates = vec![doc! {"q": {"_id": 1}, "u": {"$set": {"v": 10}}}];
    let bytes = wire::encode_op_msg_request(
        2,
        0,
        &doc! {"update": "c", "$db": "w"},
        &[("updates", &updates)],
    )
    .unwrap();
    conn.send(&bytes).await;
    let (_, reply) = wire::decode_op_msg_reply(&conn.recv().await.unwrap()).unwrap();
    assert_eq!(reply.get_i32("nModified").unwrap(), 1);
    let deletes = vec![doc! {"q": {"_id": 2}, "limit": 1}];
    let bytes = wire::encode_op_msg_request(
        3,
        0,
        &doc! {"delete": "c", "$db": "w"},
        &[("deletes", &deletes)],
    )
    .unwrap();
    conn.send(&bytes).await;
    let (_, reply) = wire::decode_op_msg_reply(&conn.recv().await.unwrap()).unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 1);
    // Rust driver form: updates inline in the body.
    let reply = conn
        .command(4, &doc! {"update": "c", "$db": "w", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"v": 1}}}]})
        .await;
    assert_eq!(reply.get_i32("n").unwrap(), 1);
    let found = conn
        .command(5, &doc! {"find": "c", "$db": "w", "filter": {}})
        .await;
    let batch = found
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0].as_document().unwrap(), &doc! {"_id": 1, "v": 11});
    server.shutdown().await;
}

#[tokio::test]
async fn more_to_come_gets_no_reply() {
    let (server, _client) = common::start().await;
    let mut conn = RawConn::connect(server.port()).await;
    let bytes = wire::encode_op_msg_request(
        1,
        FLAG_MORE_TO_COME,
        &doc! {"insert": "c", "$db": "w0", "documents": [{"_id": 1}], "writeConcern": {"w": 0}},
        &[],
    )
    .unwrap();
    conn.send(&bytes).await;
    let reply = conn.command(2, &doc! {"count": "c", "$db": "w0"}).await;
    assert_eq!(
        reply.get_i32("n").unwrap(),
        1,
        "the unacknowledged insert applied; only the count was answered"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn checksummed_requests_are_verified() {
    let (server, _client) = common::start().await;
    let mut conn = RawConn::connect(server.port()).await;
    let mut bytes =
        wire::encode_op_msg_request(1, 0, &doc! {"ping": 1, "$db": "admin"}, &[]).unwrap();
    let flags = wire::FLAG_CHECKSUM_PRESENT;
    bytes[16..20].copy_from_slice(&flags.to_le_bytes());
    let len = (bytes.len() + 4) as i32;
    bytes[0..4].copy_from_slice(&len.to_le_bytes());
    let crc = wire::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    conn.send(&bytes).await;
    let (_, reply) = wire::decode_op_msg_reply(&conn.recv().await.unwrap()).unwrap();
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    // A wrong checksum closes the connection.
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    conn.send(&bytes).await;
    assert!(conn.is_closed().await);
    server.shutdown().await;
}

#[tokio::test]
async fn missing_db_and_unknown_commands_are_errors_not_closes() {
    let (server, _client) = common::start().await;
    let mut conn = RawConn::connect(server.port()).await;
    let reply = conn.command(1, &doc! {"ping": 1}).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 0.0);
    let reply = conn
        .command(2, &doc! {"frobnicate": 1, "$db": "admin"})
        .await;
    assert_eq!(reply.get_i32("code").unwrap(), 59);
    assert_eq!(reply.get_str("codeName").unwrap(), "CommandNotFound");
    assert!(reply.get_str("errmsg").unwrap().contains("frobnicate"));
    let reply = conn.command(3, &doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    server.shutdown().await;
}

#[tokio::test]
async fn many_raw_connections_at_once() {
    let (server, _client) = common::start().await;
    let port = server.port();
    let mut tasks = Vec::new();
    for t in 0..50 {
        tasks.push(tokio::spawn(async move {
            let mut conn = RawConn::connect(port).await;
            for i in 0..10 {
                let body: Document =
                    doc! {"insert": "many", "$db": "w", "documents": [{"_id": t * 100 + i}]};
                let reply = conn.command(i, &body).await;
                assert_eq!(reply.get_i32("n").unwrap(), 1);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut conn = RawConn::connect(port).await;
    let reply = conn.command(1, &doc! {"count": "many", "$db": "w"}).await;
    assert_eq!(reply.get_i32("n").unwrap(), 500);
    server.shutdown().await;
}
