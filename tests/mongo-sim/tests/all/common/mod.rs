#![allow(dead_code)]

use std::time::Duration;

use mongo_sim::{Config, Server, ServerHandle};
use mongodb::Client;
use mongodb::options::ClientOptions;

pub async fn start() -> (ServerHandle, Client) {
    start_with(Config::default()).await
}

pub async fn start_with(config: Config) -> (ServerHandle, Client) {
    let server = Server::start(config).await.expect("server starts");
    let client = client_for(&server.uri()).await;
    (server, client)
}

pub async fn client_for(uri: &str) -> Client {
    let mut opts = ClientOptions::parse(uri).await.expect("uri parses");
    opts.server_selection_timeout = Some(Duration::from_secs(5));
    Client::with_options(opts).expect("client builds")
}

use bson::{Bson, Document};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;

/// Waits (up to 10 s) for the next event of a stream.
pub async fn next_event(stream: &mut ChangeStream<Document>) -> Document {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(e) = stream.next_if_any().await.expect("getMore succeeds") {
            return e;
        }
        assert!(std::time::Instant::now() < deadline, "no event within 10 s");
    }
}

/// The `operationType` of the next event of a stream (waiting up to 10 s).
pub async fn next_op(stream: &mut ChangeStream<Document>) -> String {
    next_event(stream)
        .await
        .get_str("operationType")
        .unwrap()
        .to_string()
}

pub fn token_of(event: &Document) -> ResumeToken {
    bson::deserialize_from_bson(Bson::Document(event.get_document("_id").unwrap().clone())).unwrap()
}

pub fn token_doc(token: &ResumeToken) -> Document {
    match bson::serialize_to_bson(token).unwrap() {
        Bson::Document(d) => d,
        other => panic!("token is not a document: {other}"),
    }
}

pub fn token_hex(token: &Document) -> String {
    token.get_str("_data").unwrap().to_string()
}

/// Runs a raw command and returns the reply.
pub async fn command(client: &Client, db: &str, cmd: Document) -> Document {
    client
        .database(db)
        .run_command(cmd)
        .await
        .expect("command succeeds")
}

/// A plain TCP connection speaking raw wire messages.
pub struct RawConn {
    pub stream: tokio::net::TcpStream,
}

impl RawConn {
    pub async fn connect(port: u16) -> RawConn {
        RawConn {
            stream: tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads one whole message; `None` if the server closed the connection (or 3 s passed).
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let read = async {
            let mut header = [0u8; 16];
            self.stream.read_exact(&mut header).await.ok()?;
            let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let mut msg = header.to_vec();
            msg.resize(len, 0);
            self.stream.read_exact(&mut msg[16..]).await.ok()?;
            Some(msg)
        };
        tokio::time::timeout(Duration::from_secs(3), read)
            .await
            .ok()
            .flatten()
    }

    /// Sends an OP_MSG command and returns the reply body.
    pub async fn command(&mut self, request_id: i32, body: &Document) -> Document {
        let bytes = mongo_sim::wire::encode_op_msg_request(request_id, 0, body, &[]).unwrap();
        self.send(&bytes).await;
        let reply = self.recv().await.expect("a reply");
        let (header, doc) = mongo_sim::wire::decode_op_msg_reply(&reply).unwrap();
        assert_eq!(header.response_to, request_id);
        doc
    }

    /// True once the server has closed the connection.
    pub async fn is_closed(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(3), self.stream.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}
