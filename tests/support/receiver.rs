//! A real webhook receiver for the delivery suites: an HTTP/1.1 server on a free loopback port
//! that checks every request's Standard Webhooks signature itself (its own HMAC, not the sink's
//! code), answers as the test says, and keeps what it saw: each request's `webhook-id`, body,
//! whether its signature held, what it answered, and how many requests were being handled at
//! once.
//!
//! It can be stopped (the port refuses connections, and the connections already open are cut,
//! as when a receiver goes down) and started again on the same port.
//!
//! The server is the small part of HTTP/1.1 a webhook needs (a request line, headers, a body by
//! `Content-Length` or chunked, keep-alive), one thread per connection. Not tiny_http: its
//! thread pool can leave a new connection queued behind kept-alive ones (the client times out,
//! and the request is handled later, a duplicate the test did not cause), and it cannot cut the
//! connections a client keeps alive.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2_011::Sha256;

/// The most connections open at once (a thread each); more wait to be accepted.
const MAX_CONNECTIONS: usize = 64;
/// How long a kept-alive connection may stay idle.
const IDLE: Duration = Duration::from_secs(60);
/// The longest request line or header line.
const MAX_LINE: u64 = 16 * 1024;
/// The most headers of a request.
const MAX_HEADERS: usize = 100;
/// The largest body read.
const MAX_BODY: usize = 16 << 20;
/// How far a `webhook-timestamp` may be from now (the tolerance of the spec's libraries).
const TOLERANCE: Duration = Duration::from_secs(300);

/// One request as received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// `webhook-id` (empty when there was none).
    pub id: String,
    /// `webhook-timestamp` as sent (empty when there was none).
    pub timestamp: String,
    /// The body as JSON (`Null` when it is not JSON).
    pub body: serde_json::Value,
    /// The body's bytes.
    pub raw: Vec<u8>,
    pub method: String,
    /// The request target: the path and the query.
    pub path: String,
    /// Every header, names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    /// Whether the signature held: a `v1,` signature of the header is the HMAC-SHA256 of
    /// `<id>.<timestamp>.<body>` under the secret, and the timestamp is within 5 minutes of now.
    pub signature_valid: bool,
    /// The status answered (401 when the signature did not hold), or being answered when a
    /// stop cut the connection.
    pub status_replied: u16,
    /// When the request had been read.
    pub at: Instant,
}

impl Seen {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How the receiver answers one request: a status, headers (other than the framing ones:
/// `content-length`, `transfer-encoding`, `connection`), and how long it waits first. The body
/// is always empty.
#[derive(Clone, Debug)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    delay: Duration,
}

impl Reply {
    /// An empty answer with `status`, at once.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Answer only after `delay` (a slow receiver).
    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Behaviour = dyn Fn(&Seen, u32) -> Reply + Send + Sync;

/// What the connections share.
struct Shared {
    secret: Vec<u8>,
    behaviour: Mutex<Arc<Behaviour>>,
    seen: Mutex<Vec<Seen>>,
    /// Requests per `webhook-id` so far, counted as they arrive.
    arrivals: Mutex<HashMap<String, u32>>,
    handling: AtomicUsize,
    max_handling: AtomicUsize,
    /// The open connections, so that a stop can cut them.
    connections: Mutex<HashMap<u64, TcpStream>>,
    next_connection: AtomicU64,
}

/// The thread accepting connections while the port listens.
struct Listening {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// The receiver.
pub struct Receiver {
    port: u16,
    shared: Arc<Shared>,
    listening: Mutex<Option<Listening>>,
}

impl Receiver {
    /// Listening on a free loopback port, answering 200 to every signed request until told
    /// otherwise.
    pub fn start(secret: &[u8]) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("the receiver listens");
        let port = listener.local_addr().expect("an address").port();
        let shared = Arc::new(Shared {
            secret: secret.to_vec(),
            behaviour: Mutex::new(Arc::new(|_: &Seen, _| Reply::status(200))),
            seen: Mutex::new(Vec::new()),
            arrivals: Mutex::new(HashMap::new()),
            handling: AtomicUsize::new(0),
            max_handling: AtomicUsize::new(0),
            connections: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(0),
        });
        let listening = listen(listener, shared.clone());
        Receiver {
            port,
            shared,
            listening: Mutex::new(Some(listening)),
        }
    }

    /// The URL to deliver to.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/orders", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// How the next requests are answered: `behaviour(seen, n)` with `n` the request's number
    /// among those with its `webhook-id` (1 for the first). Requests whose signature does not
    /// hold are answered 401 without asking it (and still counted).
    pub fn set_behaviour(&self, behaviour: impl Fn(&Seen, u32) -> Reply + Send + Sync + 'static) {
        *self.shared.behaviour.lock().expect("behaviour") = Arc::new(behaviour);
    }

    /// Every request so far, in the order they were answered.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("seen").clone()
    }

    /// The IDs answered with 2xx, in the order they were, with repeats.
    pub fn accepted_ids(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| (200..300).contains(&s.status_replied))
            .map(|s| s.id)
            .collect()
    }

    /// Requests per `webhook-id`.
    pub fn count_by_id(&self) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for seen in self.seen() {
            *counts.entry(seen.id).or_default() += 1;
        }
        counts
    }

    /// Whether every request so far was signed (true before the first).
    pub fn all_signatures_valid(&self) -> bool {
        self.seen().iter().all(|s| s.signature_valid)
    }

    /// The most requests handled at once (from the request read to the answer written).
    pub fn max_concurrent(&self) -> usize {
        self.shared.max_handling.load(Ordering::SeqCst)
    }

    /// Stops listening: connections to the port are refused, and those open are cut (a request
    /// being handled is kept as seen, its answer is lost), until [`Receiver::restart`].
    pub fn stop(&self) {
        let Some(listening) = self.listening.lock().expect("listening").take() else {
            return;
        };
        listening.stop.store(true, Ordering::SeqCst);
        // The listener is closed once its thread has ended.
        let _ = listening.thread.join();
        for connection in self
            .shared
            .connections
            .lock()
            .expect("connections")
            .values()
        {
            let _ = connection.shutdown(Shutdown::Both);
        }
    }

    /// Listens again on the same port (retrying the bind for up to 10 s).
    pub fn restart(&self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "port {} cannot be bound again: {error}",
                        self.port
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        *self.listening.lock().expect("listening") = Some(listen(listener, self.shared.clone()));
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts connections on `listener` until told to stop, each served on a thread of its own,
/// at most [`MAX_CONNECTIONS`] at once.
fn listen(listener: TcpListener, shared: Arc<Shared>) -> Listening {
    // Non-blocking, so that the thread sees the stop without a connection to wake it.
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || {
        while !stopping.load(Ordering::SeqCst) {
            let open = shared.connections.lock().expect("connections").len();
            if open >= MAX_CONNECTIONS {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            match listener.accept() {
                Ok((stream, _)) => open_connection(stream, &shared),
                // Nothing waiting (or an accept that failed): look again shortly.
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    Listening { stop, thread }
}

/// Serves `stream` on a thread of its own, kept among the open connections until it ends.
fn open_connection(stream: TcpStream, shared: &Arc<Shared>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IDLE));
    let Ok(kept) = stream.try_clone() else {
        return;
    };
    let key = shared.next_connection.fetch_add(1, Ordering::SeqCst);
    shared
        .connections
        .lock()
        .expect("connections")
        .insert(key, kept);
    let shared = shared.clone();
    std::thread::spawn(move || {
        converse(stream, &shared);
        shared.connections.lock().expect("connections").remove(&key);
    });
}

/// Requests and answers on one connection until either side closes it.
fn converse(stream: TcpStream, shared: &Shared) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let keep_alive = request.keep_alive;
        let written = {
            let _handling = Handling::count(shared);
            let reply = handle(shared, request);
            answer(&mut writer, &reply, keep_alive)
        };
        if written.is_err() || !keep_alive {
            break;
        }
    }
    let _ = writer.shutdown(Shutdown::Both);
}

/// One request being handled, for the gauge: counted in when made, out when dropped (a
/// behaviour that panics included).
struct Handling<'a>(&'a AtomicUsize);

impl Handling<'_> {
    fn count(shared: &Shared) -> Handling<'_> {
        let now = shared.handling.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_handling.fetch_max(now, Ordering::SeqCst);
        Handling(&shared.handling)
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request as read.
struct Incoming {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    keep_alive: bool,
}

/// The next request of a connection; `None` at its end or when what comes is not HTTP/1.x
/// this server reads (the connection is then closed).
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Incoming> {
    // Empty lines before a request line are allowed.
    let mut line = read_line(reader)?;
    while line.is_empty() {
        line = read_line(reader)?;
    }
    let mut parts = line.split(' ');
    let (method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        if headers.len() > MAX_HEADERS {
            return None;
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let has_token = |name: &str, token: &str| {
        header(name).is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    let keep_alive = match version {
        "HTTP/1.1" => !has_token("connection", "close"),
        _ => has_token("connection", "keep-alive"),
    };
    if has_token("expect", "100-continue") {
        reader
            .get_mut()
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .ok()?;
    }
    let body = if has_token("transfer-encoding", "chunked") {
        read_chunked(reader)?
    } else {
        let length: usize = header("content-length").map_or(Some(0), |v| v.parse().ok())?;
        if length > MAX_BODY {
            return None;
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        body
    };
    Some(Incoming {
        method: method.to_string(),
        path: path.to_string(),
        headers,
        body,
        keep_alive,
    })
}

/// A line without its line break; `None` at the end, on a line too long or not UTF-8.
fn read_line(reader: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    reader.by_ref().take(MAX_LINE).read_line(&mut line).ok()?;
    let line = line.strip_suffix('\n')?;
    Some(line.strip_suffix('\r').unwrap_or(line).to_string())
}

/// A chunked body (its trailers dropped).
fn read_chunked(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(reader)?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            while !read_line(reader)?.is_empty() {}
            return Some(body);
        }
        if body.len() + size > MAX_BODY {
            return None;
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).ok()?;
        if !read_line(reader)?.is_empty() {
            return None;
        }
    }
}

/// Checks one request, asks the behaviour, and records what was seen, before the answer.
fn handle(shared: &Shared, request: Incoming) -> Reply {
    let mut seen = Seen {
        id: String::new(),
        timestamp: String::new(),
        body: serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null),
        raw: request.body,
        method: request.method,
        path: request.path,
        headers: request.headers,
        signature_valid: false,
        status_replied: 0,
        at: Instant::now(),
    };
    seen.id = seen.header("webhook-id").unwrap_or_default().to_string();
    seen.timestamp = seen
        .header("webhook-timestamp")
        .unwrap_or_default()
        .to_string();
    seen.signature_valid = seen.header("webhook-signature").is_some_and(|signature| {
        verify(
            &shared.secret,
            &seen.id,
            &seen.timestamp,
            &seen.raw,
            signature,
        )
    });
    let nth = {
        let mut arrivals = shared.arrivals.lock().expect("arrivals");
        let n = arrivals.entry(seen.id.clone()).or_default();
        *n += 1;
        *n
    };
    let reply = if seen.signature_valid {
        let behaviour = shared.behaviour.lock().expect("behaviour").clone();
        behaviour(&seen, nth)
    } else {
        Reply::status(401)
    };
    seen.status_replied = reply.status;
    shared.seen.lock().expect("seen").push(seen);
    std::thread::sleep(reply.delay);
    reply
}

/// Writes `reply`: its status line, its headers, and an empty body.
fn answer(writer: &mut TcpStream, reply: &Reply, keep_alive: bool) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
    // No length on the answers that have no body by definition.
    if !matches!(reply.status, 100..=199 | 204 | 304) {
        head.push_str("content-length: 0\r\n");
    }
    for (name, value) in &reply.headers {
        let framing = ["content-length", "transfer-encoding", "connection"]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f));
        let broken = format!("{name}{value}").contains(['\r', '\n']);
        if !framing && !broken {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    if !keep_alive {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    writer.write_all(head.as_bytes())?;
    writer.flush()
}

/// The reason phrase of the statuses the suites answer (optional in HTTP/1.1).
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

/// Standard Webhooks v1: one of the space-separated `v1,<base64>` signatures of `header` is the
/// HMAC-SHA256 of `<id>.<timestamp>.<body>` under `secret` (compared in constant time), the ID
/// is not empty, and the timestamp is Unix seconds within [`TOLERANCE`] of now.
fn verify(secret: &[u8], id: &str, timestamp: &str, body: &[u8], header: &str) -> bool {
    let Ok(sent) = timestamp.parse::<u64>() else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if id.is_empty() || sent.abs_diff(now) > TOLERANCE.as_secs() {
        return false;
    }
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(secret) else {
        return false;
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    header
        .split(' ')
        .filter_map(|part| part.strip_prefix("v1,"))
        .filter_map(|tag| base64::engine::general_purpose::STANDARD.decode(tag).ok())
        .any(|tag| mac.clone().verify_slice(&tag).is_ok())
}
