//! A real webhook receiver for the delivery suites: an HTTP server on a free loopback port that
//! checks every request's Standard Webhooks signature itself (its own HMAC, not the sink's
//! code), answers as the test says, and keeps what it saw: each request's `webhook-id`, body,
//! whether its signature held, and how many were being handled at once. It can be stopped (the
//! port refuses connections) and started again on the same port.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2_011::Sha256;

/// The secret the suites' deliveries sign with, as Standard Webhooks gives it.
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The secret's bytes, for the receiver's own check.
pub fn secret_bytes() -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .expect("the test secret")
}

/// The options the suites deliver to a receiver with: fast retries, short timeouts and leases.
pub const QUICK: [&str; 6] = [
    "--retry-base-ms",
    "50",
    "--sink-timeout-seconds",
    "2",
    "--lease-seconds",
    "5",
];

/// One request as received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub id: String,
    pub timestamp: String,
    pub body: serde_json::Value,
    pub signature_valid: bool,
    pub status_replied: u16,
    pub at: Instant,
    /// Every header, its name in lower case.
    pub headers: BTreeMap<String, String>,
}

/// How the receiver answers one request.
#[derive(Clone, Debug)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    delay: Duration,
}

impl Reply {
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

struct Shared {
    secret: Vec<u8>,
    behaviour: Mutex<Arc<Behaviour>>,
    seen: Mutex<Vec<Seen>>,
    handling: AtomicUsize,
    max_handling: AtomicUsize,
}

/// The receiver.
pub struct Receiver {
    port: u16,
    shared: Arc<Shared>,
    running: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
}

impl Receiver {
    /// Listening on a free loopback port, answering 200 until told otherwise.
    pub fn start(secret: &[u8]) -> Receiver {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("the receiver listens");
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let receiver = Receiver {
            port,
            shared: Arc::new(Shared {
                secret: secret.to_vec(),
                behaviour: Mutex::new(Arc::new(|_: &Seen, _| Reply::status(200))),
                seen: Mutex::new(Vec::new()),
                handling: AtomicUsize::new(0),
                max_handling: AtomicUsize::new(0),
            }),
            running: Mutex::new(None),
        };
        receiver.serve(server);
        receiver
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/orders", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// How the next requests are answered: `behaviour(seen, n)` with `n` the request's number
    /// among those with its `webhook-id` (1 for the first).
    pub fn set_behaviour(&self, behaviour: impl Fn(&Seen, u32) -> Reply + Send + Sync + 'static) {
        *self.shared.behaviour.lock().expect("behaviour") = Arc::new(behaviour);
    }

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

    pub fn all_signatures_valid(&self) -> bool {
        self.seen().iter().all(|s| s.signature_valid)
    }

    /// The most requests handled at once.
    pub fn max_concurrent(&self) -> usize {
        self.shared.max_handling.load(Ordering::SeqCst)
    }

    /// Stops listening: connections to the port are refused until [`Receiver::restart`].
    pub fn stop(&self) {
        if let Some((stop, thread)) = self.running.lock().expect("running").take() {
            stop.store(true, Ordering::SeqCst);
            let _ = thread.join();
        }
    }

    /// Listens again on the same port.
    pub fn restart(&self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        let server = loop {
            match tiny_http::Server::http(("127.0.0.1", self.port)) {
                Ok(server) => break server,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "the port cannot be bound again: {error}"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        self.serve(server);
    }

    fn serve(&self, server: tiny_http::Server) {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = self.shared.clone();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                match server.recv_timeout(Duration::from_millis(20)) {
                    Ok(Some(request)) => {
                        let shared = shared.clone();
                        std::thread::spawn(move || handle(&shared, request));
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
            // Dropping the server closes its socket.
        });
        *self.running.lock().expect("running") = Some((stop, thread));
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

fn handle(shared: &Shared, mut request: tiny_http::Request) {
    let now = shared.handling.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_handling.fetch_max(now, Ordering::SeqCst);
    let header = |name: &str| {
        request
            .headers()
            .iter()
            .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str().to_string())
    };
    let headers: BTreeMap<String, String> = request
        .headers()
        .iter()
        .map(|h| {
            (
                h.field.as_str().as_str().to_ascii_lowercase(),
                h.value.as_str().to_string(),
            )
        })
        .collect();
    let id = header("webhook-id").unwrap_or_default();
    let timestamp = header("webhook-timestamp").unwrap_or_default();
    let signature = header("webhook-signature");
    let mut body = Vec::new();
    let _ = request.as_reader().take(16 << 20).read_to_end(&mut body);
    let signature_valid =
        signature.is_some_and(|s| verify(&shared.secret, &id, &timestamp, &body, &s));
    let mut seen = Seen {
        id,
        timestamp,
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        signature_valid,
        status_replied: 0,
        at: Instant::now(),
        headers,
    };
    let nth = {
        let seen_so_far = shared.seen.lock().expect("seen");
        seen_so_far.iter().filter(|s| s.id == seen.id).count() as u32 + 1
    };
    let behaviour = shared.behaviour.lock().expect("behaviour").clone();
    let reply = if signature_valid {
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
    // Done before the reply is written: once the client has it, its next request may come at
    // once, and must not be counted as handled beside this one.
    shared.handling.fetch_sub(1, Ordering::SeqCst);
    let _ = request.respond(response);
}

/// Standard Webhooks v1: some `v1,<base64>` of the signature header is the HMAC-SHA256 of
/// `<id>.<timestamp>.<body>` under the secret.
fn verify(secret: &[u8], id: &str, timestamp: &str, body: &[u8], header: &str) -> bool {
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(secret) else {
        return false;
    };
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    !id.is_empty()
        && header
            .split(' ')
            .any(|part| part.strip_prefix("v1,") == Some(expected.as_str()))
}
