//! A real webhook receiver for the delivery suites: an HTTP server on a free loopback port that
//! checks every request's Standard Webhooks signature itself (its own HMAC, not the sink's
//! code), answers as the test says, and keeps what it saw: each request's `webhook-id`, body,
//! whether its signature held, what it answered, and how many requests were being handled at
//! once.
//!
//! It can be stopped (the port refuses connections, and the connections already open are cut,
//! as when a receiver goes down) and started again on the same port. For that, the port is a
//! relay of its own in front of the HTTP server (tiny_http, on a port nobody else is told of,
//! for the receiver's whole life): tiny_http cannot close the connections a client keeps alive.

use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2_011::Sha256;

/// The most requests handled at once; more wait for one to end.
const MAX_HANDLERS: usize = 64;
/// The largest body read.
const MAX_BODY: u64 = 16 << 20;
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
    /// Every header, names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    /// Whether the signature held: a `v1,` signature of the header is the HMAC-SHA256 of
    /// `<id>.<timestamp>.<body>` under the secret, and the timestamp is within 5 minutes of now.
    pub signature_valid: bool,
    /// The status answered (401 when the signature did not hold).
    pub status_replied: u16,
    /// When the request arrived.
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

/// How the receiver answers one request: a status, headers, and how long it waits first.
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

/// What the handlers share.
struct Shared {
    secret: Vec<u8>,
    behaviour: Mutex<Arc<Behaviour>>,
    seen: Mutex<Vec<Seen>>,
    /// Requests per `webhook-id` so far, counted as they arrive.
    arrivals: Mutex<HashMap<String, u32>>,
    handling: AtomicUsize,
    max_handling: AtomicUsize,
}

/// A thread that runs until its flag is raised.
struct Worker {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Worker {
    fn spawn(body: impl FnOnce(Arc<AtomicBool>) + Send + 'static) -> Worker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        Worker {
            stop,
            thread: std::thread::spawn(move || body(flag)),
        }
    }

    fn end(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

/// The public port while it listens: its accepting thread and the connections it relays.
struct Front {
    accepting: Worker,
    connections: Arc<Mutex<HashMap<u64, TcpStream>>>,
}

/// The receiver.
pub struct Receiver {
    port: u16,
    shared: Arc<Shared>,
    /// Where tiny_http listens.
    backend: SocketAddr,
    dispatching: Option<Worker>,
    front: Mutex<Option<Front>>,
}

impl Receiver {
    /// Listening on a free loopback port, answering 200 to every signed request until told
    /// otherwise.
    pub fn start(secret: &[u8]) -> Receiver {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("the receiver's server");
        let backend = server.server_addr().to_ip().expect("an IP address");
        let shared = Arc::new(Shared {
            secret: secret.to_vec(),
            behaviour: Mutex::new(Arc::new(|_: &Seen, _| Reply::status(200))),
            seen: Mutex::new(Vec::new()),
            arrivals: Mutex::new(HashMap::new()),
            handling: AtomicUsize::new(0),
            max_handling: AtomicUsize::new(0),
        });
        let dispatching = {
            let shared = shared.clone();
            Worker::spawn(move |stop| dispatch(&server, &shared, &stop))
        };
        let listener = TcpListener::bind("127.0.0.1:0").expect("the receiver listens");
        let port = listener.local_addr().expect("an address").port();
        Receiver {
            port,
            shared,
            backend,
            dispatching: Some(dispatching),
            front: Mutex::new(Some(relay(listener, backend))),
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

    /// The most requests handled at once (from arrival to the answer written).
    pub fn max_concurrent(&self) -> usize {
        self.shared.max_handling.load(Ordering::SeqCst)
    }

    /// Stops listening: connections to the port are refused, and those open are cut, until
    /// [`Receiver::restart`]. What was seen is kept.
    pub fn stop(&self) {
        let Some(front) = self.front.lock().expect("front").take() else {
            return;
        };
        // The listener is closed once its thread has ended.
        front.accepting.end();
        for connection in front.connections.lock().expect("connections").values() {
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
        *self.front.lock().expect("front") = Some(relay(listener, self.backend));
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
        if let Some(dispatching) = self.dispatching.take() {
            dispatching.end();
        }
    }
}

/// Accepts connections on `listener` and relays each to the server at `backend`.
fn relay(listener: TcpListener, backend: SocketAddr) -> Front {
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let connections = Arc::new(Mutex::new(HashMap::new()));
    let open = connections.clone();
    let accepting = Worker::spawn(move |stop| {
        let mut next = 0;
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((client, _)) => {
                    next += 1;
                    connect(client, backend, next, &open);
                }
                // Nothing waiting (or an accept that failed): look again shortly.
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    Front {
        accepting,
        connections,
    }
}

/// Relays `client` to the server, both ways, on two threads; `client` is kept in `open` until
/// the server's side ends, so that [`Receiver::stop`] can cut it.
fn connect(
    client: TcpStream,
    backend: SocketAddr,
    key: u64,
    open: &Arc<Mutex<HashMap<u64, TcpStream>>>,
) {
    let Ok(server) = TcpStream::connect(backend) else {
        return;
    };
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(to_client), Ok(to_server), Ok(kept)) =
        (client.try_clone(), server.try_clone(), client.try_clone())
    else {
        return;
    };
    open.lock().expect("connections").insert(key, kept);
    let open = open.clone();
    std::thread::spawn(move || pump(client, to_server));
    std::thread::spawn(move || {
        pump(server, to_client);
        open.lock().expect("connections").remove(&key);
    });
}

/// Copies `from` to `to` until either ends, then closes `to` for writing.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// Hands each request the server receives to a thread of its own, at most [`MAX_HANDLERS`] at
/// once.
fn dispatch(server: &tiny_http::Server, shared: &Arc<Shared>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let request = match server.recv_timeout(Duration::from_millis(20)) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(_) => return,
        };
        while shared.handling.load(Ordering::SeqCst) >= MAX_HANDLERS {
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = shared.handling.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_handling.fetch_max(now, Ordering::SeqCst);
        let shared = shared.clone();
        std::thread::spawn(move || {
            // Counted out however the handler ends (a behaviour that panics included).
            let _handled = Handled(&shared.handling);
            handle(&shared, request);
        });
    }
}

/// Counts a request out of the gauge when dropped.
struct Handled<'a>(&'a AtomicUsize);

impl Drop for Handled<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Checks one request, asks the behaviour, records what was seen, then answers.
fn handle(shared: &Shared, mut request: tiny_http::Request) {
    let at = Instant::now();
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|h| {
            (
                h.field.as_str().as_str().to_ascii_lowercase(),
                h.value.as_str().to_string(),
            )
        })
        .collect();
    let mut raw = Vec::new();
    let _ = request.as_reader().take(MAX_BODY).read_to_end(&mut raw);
    let mut seen = Seen {
        id: String::new(),
        timestamp: String::new(),
        body: serde_json::from_slice(&raw).unwrap_or(serde_json::Value::Null),
        raw,
        headers,
        signature_valid: false,
        status_replied: 0,
        at,
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
    let mut response = tiny_http::Response::empty(reply.status);
    for (name, value) in &reply.headers {
        if let Ok(header) = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            response.add_header(header);
        }
    }
    let _ = request.respond(response);
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
