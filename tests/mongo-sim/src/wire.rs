//! Message framing: OP_MSG, OP_QUERY requests and OP_MSG / OP_REPLY responses.

use bson::{Bson, Document};
use tokio::io::{AsyncRead, AsyncReadExt};

pub const OP_REPLY: i32 = 1;
pub const OP_QUERY: i32 = 2004;
pub const OP_COMPRESSED: i32 = 2012;
pub const OP_MSG: i32 = 2013;
pub const HEADER_LEN: usize = 16;

pub const FLAG_CHECKSUM_PRESENT: u32 = 1;
pub const FLAG_MORE_TO_COME: u32 = 1 << 1;
pub const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;
const KNOWN_FLAGS: u32 = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME | FLAG_EXHAUST_ALLOWED;

/// Why a message could not be read or decoded. Any of these closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("message length {0} is invalid")]
    InvalidLength(i64),
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("unsupported opcode {0}")]
    UnsupportedOpcode(i32),
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("OP_MSG checksum mismatch")]
    Checksum,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot encode reply: {0}")]
    Encode(String),
}

fn malformed(msg: impl Into<String>) -> WireError {
    WireError::Malformed(msg.into())
}

/// The standard message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub length: i32,
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: i32,
}

impl Header {
    pub fn parse(buf: &[u8; HEADER_LEN]) -> Header {
        let f = |i: usize| i32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        Header {
            length: f(0),
            request_id: f(4),
            response_to: f(8),
            op_code: f(12),
        }
    }
}

/// An OP_MSG request with its document sequences merged into the command body.
#[derive(Debug, Clone, PartialEq)]
pub struct OpMsg {
    pub request_id: i32,
    pub flags: u32,
    pub body: Document,
}

/// A legacy OP_QUERY request (used by drivers for the first handshake).
#[derive(Debug, Clone, PartialEq)]
pub struct OpQuery {
    pub request_id: i32,
    pub flags: i32,
    pub full_collection_name: String,
    pub number_to_skip: i32,
    pub number_to_return: i32,
    pub query: Document,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Msg(OpMsg),
    Query(OpQuery),
}

impl Message {
    pub fn request_id(&self) -> i32 {
        match self {
            Message::Msg(m) => m.request_id,
            Message::Query(q) => q.request_id,
        }
    }

    /// True when the client expects no reply.
    pub fn more_to_come(&self) -> bool {
        matches!(self, Message::Msg(m) if m.flags & FLAG_MORE_TO_COME != 0)
    }
}

/// A cursor over a byte slice that never panics.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(malformed("unexpected end of message"));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn i32(&mut self) -> Result<i32, WireError> {
        let b = self.take(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn cstring(&mut self) -> Result<String, WireError> {
        let rest = &self.buf[self.pos..];
        let end = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| malformed("unterminated cstring"))?;
        let s = std::str::from_utf8(&rest[..end])
            .map_err(|_| malformed("cstring is not valid UTF-8"))?
            .to_string();
        self.pos += end + 1;
        Ok(s)
    }
    fn document(&mut self) -> Result<Document, WireError> {
        let rest = &self.buf[self.pos..];
        if rest.len() < 5 {
            return Err(malformed("truncated BSON document"));
        }
        let len = i32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        if len < 5 || len as usize > rest.len() {
            return Err(malformed(format!("invalid BSON document length {len}")));
        }
        let bytes = self.take(len as usize)?;
        decode_document(bytes)
    }
}

/// Deepest nesting accepted in a request document (decoding recurses per level).
pub const MAX_NESTING: usize = 180;

/// Decodes exactly one BSON document occupying all of `bytes`.
pub fn decode_document(bytes: &[u8]) -> Result<Document, WireError> {
    let raw = bson::RawDocument::from_bytes(bytes)
        .map_err(|e| malformed(format!("invalid BSON: {e}")))?;
    check_nesting(raw, 0)?;
    Document::try_from(raw).map_err(|e| malformed(format!("invalid BSON: {e}")))
}

fn check_nesting(raw: &bson::RawDocument, depth: usize) -> Result<(), WireError> {
    if depth > MAX_NESTING {
        return Err(malformed(format!(
            "BSON nested deeper than {MAX_NESTING} levels"
        )));
    }
    for item in raw.iter() {
        let (_, value) = item.map_err(|e| malformed(format!("invalid BSON: {e}")))?;
        check_value_nesting(value, depth)?;
    }
    Ok(())
}

fn check_value_nesting(value: bson::RawBsonRef<'_>, depth: usize) -> Result<(), WireError> {
    match value {
        bson::RawBsonRef::Document(d) => check_nesting(d, depth + 1),
        bson::RawBsonRef::JavaScriptCodeWithScope(c) => check_nesting(c.scope, depth + 1),
        bson::RawBsonRef::Array(a) => {
            if depth + 1 > MAX_NESTING {
                return Err(malformed(format!(
                    "BSON nested deeper than {MAX_NESTING} levels"
                )));
            }
            for item in a {
                let v = item.map_err(|e| malformed(format!("invalid BSON: {e}")))?;
                check_value_nesting(v, depth + 1)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Decodes a message body (everything after the header).
pub fn decode(header: &Header, body: &[u8]) -> Result<Message, WireError> {
    match header.op_code {
        OP_MSG => decode_op_msg(header, body).map(Message::Msg),
        OP_QUERY => decode_op_query(header, body).map(Message::Query),
        other => Err(WireError::UnsupportedOpcode(other)),
    }
}

/// Decodes a complete message (header included), checking its length against `max_len`.
pub fn decode_message(bytes: &[u8], max_len: usize) -> Result<Message, WireError> {
    if bytes.len() < HEADER_LEN {
        return Err(malformed("message shorter than its header"));
    }
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&bytes[..HEADER_LEN]);
    let header = Header::parse(&hb);
    let len = check_length(header.length, max_len)?;
    if len != bytes.len() {
        return Err(malformed(format!(
            "header says {len} bytes but message has {}",
            bytes.len()
        )));
    }
    decode(&header, &bytes[HEADER_LEN..])
}

fn check_length(length: i32, max_len: usize) -> Result<usize, WireError> {
    if length < HEADER_LEN as i32 + 1 {
        return Err(WireError::InvalidLength(length as i64));
    }
    let len = length as usize;
    if len > max_len {
        return Err(WireError::TooLarge { len, max: max_len });
    }
    Ok(len)
}

fn decode_op_msg(header: &Header, body: &[u8]) -> Result<OpMsg, WireError> {
    if body.len() < 4 {
        return Err(malformed("OP_MSG without flags"));
    }
    let flags = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    if flags & 0xFFFF & !KNOWN_FLAGS != 0 {
        return Err(malformed(format!(
            "unknown required OP_MSG flag bits {flags:#x}"
        )));
    }
    let mut sections = &body[4..];
    if flags & FLAG_CHECKSUM_PRESENT != 0 {
        if sections.len() < 4 {
            return Err(malformed("OP_MSG checksum missing"));
        }
        let split = sections.len() - 4;
        let expected = u32::from_le_bytes([
            sections[split],
            sections[split + 1],
            sections[split + 2],
            sections[split + 3],
        ]);
        let mut whole = Vec::with_capacity(HEADER_LEN + 4 + split);
        whole.extend_from_slice(&header.length.to_le_bytes());
        whole.extend_from_slice(&header.request_id.to_le_bytes());
        whole.extend_from_slice(&header.response_to.to_le_bytes());
        whole.extend_from_slice(&header.op_code.to_le_bytes());
        whole.extend_from_slice(&body[..4 + split]);
        if crc32c(&whole) != expected {
            return Err(WireError::Checksum);
        }
        sections = &sections[..split];
    }
    let mut r = Reader::new(sections);
    let mut body_doc: Option<Document> = None;
    let mut sequences: Vec<(String, Vec<Bson>)> = Vec::new();
    while r.remaining() > 0 {
        match r.u8()? {
            0 => {
                if body_doc.is_some() {
                    return Err(malformed("OP_MSG has more than one kind-0 section"));
                }
                body_doc = Some(r.document()?);
            }
            1 => {
                let size = r.i32()?;
                if size < 5 || (size as usize - 4) > r.remaining() {
                    return Err(malformed(format!("invalid document sequence size {size}")));
                }
                let section = r.take(size as usize - 4)?;
                let mut sr = Reader::new(section);
                let ident = sr.cstring()?;
                let mut docs = Vec::new();
                while sr.remaining() > 0 {
                    docs.push(Bson::Document(sr.document()?));
                }
                sequences.push((ident, docs));
            }
            k => return Err(malformed(format!("unknown OP_MSG section kind {k}"))),
        }
    }
    let mut body_doc = body_doc.ok_or_else(|| malformed("OP_MSG without a kind-0 section"))?;
    for (ident, docs) in sequences {
        if body_doc.contains_key(&ident) {
            return Err(malformed(format!(
                "document sequence '{ident}' duplicates a field of the command"
            )));
        }
        body_doc.insert(ident, Bson::Array(docs));
    }
    Ok(OpMsg {
        request_id: header.request_id,
        flags,
        body: body_doc,
    })
}

fn decode_op_query(header: &Header, body: &[u8]) -> Result<OpQuery, WireError> {
    let mut r = Reader::new(body);
    let flags = r.i32()?;
    let full_collection_name = r.cstring()?;
    let number_to_skip = r.i32()?;
    let number_to_return = r.i32()?;
    let query = r.document()?;
    if r.remaining() > 0 {
        // Optional returnFieldsSelector; validated, then ignored.
        r.document()?;
    }
    if r.remaining() > 0 {
        return Err(malformed("trailing bytes after OP_QUERY"));
    }
    Ok(OpQuery {
        request_id: header.request_id,
        flags,
        full_collection_name,
        number_to_skip,
        number_to_return,
        query,
    })
}

/// Reads one message. `Ok(None)` means the peer closed the connection between messages.
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_len: usize,
) -> Result<Option<Message>, WireError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = reader.read(&mut hb[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(malformed("connection closed inside a message header"));
        }
        got += n;
    }
    let header = Header::parse(&hb);
    let len = check_length(header.length, max_len)?;
    let mut body = vec![0u8; len - HEADER_LEN];
    reader.read_exact(&mut body).await?;
    decode(&header, &body).map(Some)
}

fn encode_doc(doc: &Document) -> Result<Vec<u8>, WireError> {
    doc.to_vec().map_err(|e| WireError::Encode(e.to_string()))
}

fn header_bytes(out: &mut Vec<u8>, request_id: i32, response_to: i32, op_code: i32) {
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&response_to.to_le_bytes());
    out.extend_from_slice(&op_code.to_le_bytes());
}

fn finish(mut out: Vec<u8>) -> Result<Vec<u8>, WireError> {
    let len = i32::try_from(out.len()).map_err(|_| WireError::Encode("reply too large".into()))?;
    out[..4].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

/// An OP_MSG reply: flags 0, one kind-0 section, no checksum.
pub fn encode_op_msg(
    request_id: i32,
    response_to: i32,
    doc: &Document,
) -> Result<Vec<u8>, WireError> {
    let bytes = encode_doc(doc)?;
    let mut out = Vec::with_capacity(HEADER_LEN + 5 + bytes.len());
    header_bytes(&mut out, request_id, response_to, OP_MSG);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&bytes);
    finish(out)
}

/// An OP_MSG request with optional document sequences (used by tests and tools).
pub fn encode_op_msg_request(
    request_id: i32,
    flags: u32,
    body: &Document,
    sequences: &[(&str, &[Document])],
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    header_bytes(&mut out, request_id, 0, OP_MSG);
    out.extend_from_slice(&(flags & !FLAG_CHECKSUM_PRESENT).to_le_bytes());
    out.push(0);
    out.extend_from_slice(&encode_doc(body)?);
    for (ident, docs) in sequences {
        let mut sec = Vec::new();
        sec.extend_from_slice(ident.as_bytes());
        sec.push(0);
        for d in docs.iter() {
            sec.extend_from_slice(&encode_doc(d)?);
        }
        out.push(1);
        let size =
            i32::try_from(sec.len() + 4).map_err(|_| WireError::Encode("too large".into()))?;
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&sec);
    }
    finish(out)
}

/// An OP_QUERY request (used by tests).
pub fn encode_op_query(
    request_id: i32,
    collection: &str,
    query: &Document,
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    header_bytes(&mut out, request_id, 0, OP_QUERY);
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(collection.as_bytes());
    out.push(0);
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&(-1i32).to_le_bytes());
    out.extend_from_slice(&encode_doc(query)?);
    finish(out)
}

/// An OP_REPLY carrying one document.
pub fn encode_op_reply(
    request_id: i32,
    response_to: i32,
    doc: &Document,
) -> Result<Vec<u8>, WireError> {
    let bytes = encode_doc(doc)?;
    let mut out = Vec::with_capacity(HEADER_LEN + 20 + bytes.len());
    header_bytes(&mut out, request_id, response_to, OP_REPLY);
    out.extend_from_slice(&0i32.to_le_bytes()); // responseFlags
    out.extend_from_slice(&0i64.to_le_bytes()); // cursorID
    out.extend_from_slice(&0i32.to_le_bytes()); // startingFrom
    out.extend_from_slice(&1i32.to_le_bytes()); // numberReturned
    out.extend_from_slice(&bytes);
    finish(out)
}

/// Parses an OP_REPLY (used by tests): returns the responseTo and the first document.
pub fn decode_op_reply(bytes: &[u8]) -> Result<(Header, Document), WireError> {
    if bytes.len() < HEADER_LEN + 20 {
        return Err(malformed("short OP_REPLY"));
    }
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&bytes[..HEADER_LEN]);
    let header = Header::parse(&hb);
    if header.op_code != OP_REPLY {
        return Err(WireError::UnsupportedOpcode(header.op_code));
    }
    let mut r = Reader::new(&bytes[HEADER_LEN + 20..]);
    Ok((header, r.document()?))
}

/// Parses an OP_MSG reply (used by tests): header and body.
pub fn decode_op_msg_reply(bytes: &[u8]) -> Result<(Header, Document), WireError> {
    if bytes.len() < HEADER_LEN {
        return Err(malformed("short OP_MSG"));
    }
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&bytes[..HEADER_LEN]);
    let header = Header::parse(&hb);
    match decode(&header, &bytes[HEADER_LEN..])? {
        Message::Msg(m) => Ok((header, m.body)),
        Message::Query(_) => Err(WireError::UnsupportedOpcode(OP_QUERY)),
    }
}

/// CRC-32C (Castagnoli), as used by the OP_MSG checksum.
pub fn crc32c(data: &[u8]) -> u32 {
    const POLY: u32 = 0x82F6_3B78;
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
            *slot = c;
        }
        t
    });
    let mut crc = !0u32;
    for b in data {
        crc = table[((crc ^ *b as u32) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn crc32c_known_vector() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn op_msg_round_trip_with_sequence() {
        let docs = vec![doc! {"_id": 1}, doc! {"_id": 2}];
        let bytes = encode_op_msg_request(
            7,
            0,
            &doc! {"insert": "c", "$db": "d"},
            &[("documents", &docs)],
        )
        .unwrap();
        let Message::Msg(m) = decode_message(&bytes, 1 << 20).unwrap() else {
            panic!("not OP_MSG")
        };
        assert_eq!(m.request_id, 7);
        assert_eq!(m.body.get_array("documents").unwrap().len(), 2);
    }
}
