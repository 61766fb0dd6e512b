//! `--sink http://…` / `https://…`: a webhook signed the Standard Webhooks way (v1).
//!
//! Each attempt is one `POST` of the request's body as relaxed Extended JSON with
//! `webhook-id` (the event ID: stable across retries and restarts, so a receiver drops a
//! replay), `webhook-timestamp` (Unix seconds) and `webhook-signature` (`v1,` and the base64
//! HMAC-SHA256 of `<id>.<timestamp>.<body>` under the secret). At least once: an attempt whose
//! answer is lost is made again under the same ID.
//!
//! Timeouts bound every request (connection included); redirects are never followed (a 3xx is a
//! permanent failure: a signed request does not go where the URL does not say); certificates
//! are checked against the web's roots. A URL with credentials is refused: the secret signs,
//! nothing else authenticates. 2xx is accepted; 408, 429 and 5xx (and transport failures) are
//! transient, honouring `Retry-After`; any other status is permanent. The request's own headers
//! are sent too, except those that would replace the signature's or the transport's (left out,
//! with a warning naming the header).

use std::io::{ErrorKind, Read as _};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest as _, Sha256};

use crate::sink::{Attempt, Evidence, FailureClass, Outcome, Sink, SinkFailure};

/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// The most bytes of an answer read (and dropped): the status decides.
const MAX_ANSWER: u64 = 64 * 1024;
/// The longest failure text kept.
const MAX_TEXT: usize = 500;
/// A secret's decoded length, as Standard Webhooks advises (24-64) with room either side.
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 16..=256;
/// The longest `webhook-id` taken as it is.
const MAX_ID: usize = 200;
/// Headers a policy's request may not set: the signature's, and the transport's own.
const RESERVED: [&str; 9] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
    "user-agent",
];

/// A webhook endpoint and how requests to it are signed.
pub struct Webhook {
    url: String,
    pin: String,
    secret: Vec<u8>,
    agent: ureq::Agent,
}

/// The secret of `text`: `whsec_` then standard base64 of 16-256 bytes, whitespace around it
/// ignored. The text is never repeated in an error.
pub fn parse_secret(text: &str) -> Result<Vec<u8>, String> {
    let Some(encoded) = text.trim().strip_prefix("whsec_") else {
        return Err("a secret starts with whsec_ followed by base64".into());
    };
    let secret = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "the part after whsec_ is not base64".to_string())?;
    if !SECRET_BYTES.contains(&secret.len()) {
        return Err(format!(
            "a secret is {}-{} bytes once decoded",
            SECRET_BYTES.start(),
            SECRET_BYTES.end()
        ));
    }
    Ok(secret)
}

/// The `webhook-id` of a record: its event ID when it is 1-200 characters of
/// `A-Z a-z 0-9 _ -` (the default policy's IDs are), else `h_` and the hex SHA-256 of the
/// record's `_id` (the spec's IDs hold no `.`): the same at every attempt.
pub fn webhook_id(event_id: &str, record: &str) -> String {
    let plain = !event_id.is_empty()
        && event_id.len() <= MAX_ID
        && event_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        event_id.to_string()
    } else {
        format!("h_{}", hex(&Sha256::digest(record.as_bytes())))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `webhook-signature` of a message: `v1,` and the base64 HMAC-SHA256 of
/// `<id>.<timestamp>.<body>` under `secret`.
pub fn signature(secret: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(secret) {
        Ok(mac) => mac,
        // HMAC takes a key of any length.
        Err(_) => return String::new(),
    };
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

impl Webhook {
    /// The webhook at `url` (http or https, a host, no credentials, no fragment), each request
    /// bounded by `timeout` (connection included). Errors never repeat the URL or the secret.
    pub fn new(url: &str, secret: Vec<u8>, timeout: Duration) -> Result<Webhook, String> {
        let parsed = url::Url::parse(url).map_err(|_| {
            "the webhook's URL is not one this tool can send to (its text is not repeated: it \
             may hold a credential)"
                .to_string()
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err("a webhook's URL starts with http:// or https://".into());
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(
                "a webhook's URL may not carry credentials (user:password@): requests are \
                 signed with the secret, and a credential in a URL ends up in logs"
                    .into(),
            );
        }
        let Some(host) = parsed.host_str().filter(|host| !host.is_empty()) else {
            return Err("a webhook's URL names a host".into());
        };
        if parsed.fragment().is_some() {
            return Err("a webhook's URL has no fragment (#…)".into());
        }
        if ureq::http::Uri::try_from(parsed.as_str()).is_err() {
            return Err("the webhook's URL is not one HTTP can send to".into());
        }
        if !SECRET_BYTES.contains(&secret.len()) {
            return Err(format!(
                "the webhook secret is {}-{} bytes",
                SECRET_BYTES.start(),
                SECRET_BYTES.end()
            ));
        }
        let pin = match parsed.port() {
            Some(port) => format!("{}://{host}:{port}{}", parsed.scheme(), parsed.path()),
            None => format!("{}://{host}{}", parsed.scheme(), parsed.path()),
        };
        // The default TLS configuration: rustls, certificates checked against webpki's roots.
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .timeout_connect(Some(timeout))
            .max_redirects(0)
            .max_redirects_will_error(false)
            .http_status_as_error(false)
            .user_agent(concat!("handoff/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Webhook {
            url: parsed.into(),
            pin,
            secret,
            agent,
        })
    }

    fn post(&self, attempt: &Attempt<'_>) -> Outcome {
        let json = bson::Bson::Document(attempt.request.body.clone()).into_relaxed_extjson();
        let Ok(body) = serde_json::to_vec(&json) else {
            return failed(
                FailureClass::Permanent,
                "the record cannot be written as JSON".into(),
                None,
                None,
            );
        };
        let id = webhook_id(attempt.event_id, attempt.record);
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut request = self
            .agent
            .post(&self.url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                signature(&self.secret, &id, timestamp, &body),
            );
        for (name, value) in &attempt.request.headers {
            let shown = || handoff_domain::text::escape_untrusted(name, 64);
            if RESERVED.contains(&name.to_ascii_lowercase().as_str()) {
                tracing::warn!(
                    header = %shown(),
                    "a request header that would replace the webhook's own is left out"
                );
                continue;
            }
            let (Ok(name), Ok(value)) = (
                ureq::http::HeaderName::from_bytes(name.as_bytes()),
                ureq::http::HeaderValue::from_str(value),
            ) else {
                return failed(
                    FailureClass::Permanent,
                    format!("the request header {} is not valid HTTP", shown()),
                    None,
                    None,
                );
            };
            request = request.header(name, value);
        }
        match request.send(&body[..]) {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| retry_after(v, SystemTime::now()));
                // Read (bounded) and dropped, so that the connection can serve the next request.
                let mut answer = Vec::new();
                let _ = response
                    .body_mut()
                    .as_reader()
                    .take(MAX_ANSWER)
                    .read_to_end(&mut answer);
                classify(status, retry_after)
            }
            Err(error) => {
                let (class, text) = transport(&error);
                failed(class, text, None, None)
            }
        }
    }
}

/// What a status says.
fn classify(status: u16, retry_after: Option<Duration>) -> Outcome {
    match status {
        200..=299 => Outcome::Accepted {
            evidence: Evidence {
                status: Some(status),
                outcome: Some("accepted".into()),
            },
            settled: false,
        },
        408 | 429 | 500..=599 => failed(
            FailureClass::Transient,
            format!("the receiver answered {status}"),
            Some(status),
            retry_after,
        ),
        300..=399 => failed(
            FailureClass::Permanent,
            format!("the receiver answered {status}: redirects are not followed"),
            Some(status),
            None,
        ),
        _ => failed(
            FailureClass::Permanent,
            format!("the receiver answered {status}"),
            Some(status),
            None,
        ),
    }
}

fn failed(
    class: FailureClass,
    text: String,
    status: Option<u16>,
    retry_after: Option<Duration>,
) -> Outcome {
    Outcome::Failed(SinkFailure {
        class,
        retry_after,
        text: text.chars().take(MAX_TEXT).collect(),
        evidence: Evidence {
            status,
            outcome: None,
        },
    })
}

/// A request that got no answer, in plain words (never the URL, which may hold a query).
/// Transient, unless the request itself cannot be made.
fn transport(error: &ureq::Error) -> (FailureClass, String) {
    let transient = |text: String| (FailureClass::Transient, text);
    match error {
        ureq::Error::Timeout(phase) => transient(format!("the request timed out ({phase})")),
        ureq::Error::HostNotFound => transient("the receiver's host was not found".into()),
        ureq::Error::ConnectionFailed => transient("the connection to the receiver failed".into()),
        ureq::Error::Io(e) => transient(match e.kind() {
            ErrorKind::ConnectionRefused => "the receiver refused the connection".into(),
            ErrorKind::TimedOut | ErrorKind::WouldBlock => "the request timed out".into(),
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => "the connection was closed before an answer came".into(),
            kind => format!("the connection failed: {kind}"),
        }),
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) => {
            transient("the TLS handshake failed (certificates are checked)".into())
        }
        ureq::Error::Protocol(_) | ureq::Error::LargeResponseHeader(..) => {
            transient("the receiver's answer is not valid HTTP".into())
        }
        ureq::Error::Http(_) | ureq::Error::BadUri(_) => (
            FailureClass::Permanent,
            "the request cannot be made (its URL or a header is not valid HTTP)".into(),
        ),
        _ => transient("the request failed".into()),
    }
}

/// A `Retry-After` value: delta seconds or an HTTP date (a past one is now), at most
/// [`MAX_RETRY_AFTER`]; `None` when it is neither.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is still "later than the bound".
        value.parse().map_or(MAX_RETRY_AFTER, Duration::from_secs)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

impl Sink for Webhook {
    fn kind(&self) -> handoff_domain::effect::SinkKind {
        handoff_domain::effect::SinkKind::Webhook
    }

    fn pin(&self) -> String {
        self.pin.clone()
    }

    fn deliver(&self, attempt: &Attempt<'_>) -> Outcome {
        self.post(attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{Bson, doc};
    use handoff_domain::delivery::{Operation, Request};
    use std::sync::mpsc;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    /// What the test server received.
    struct Received {
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        path: String,
    }

    impl Received {
        /// The values of header `name`, in order.
        fn all(&self, name: &str) -> Vec<&str> {
            self.headers
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .collect()
        }

        /// The one value of header `name`.
        fn header(&self, name: &str) -> &str {
            match self.all(name)[..] {
                [value] => value,
                ref values => panic!("{name}: {values:?}"),
            }
        }
    }

    /// A real HTTP server on loopback answering `answer(n)` to its `n`th request (status,
    /// headers, delay before answering); its URL has a query.
    fn serve(
        answer: impl Fn(usize) -> (u16, Vec<(&'static str, String)>, Duration) + Send + 'static,
    ) -> (String, mpsc::Receiver<Received>) {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("listen");
        let port = server.server_addr().to_ip().expect("ip").port();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for (n, mut request) in server.incoming_requests().enumerate() {
                let mut body = Vec::new();
                let _ = request.as_reader().read_to_end(&mut body);
                let headers = request
                    .headers()
                    .iter()
                    .map(|h| {
                        (
                            h.field.to_string().to_ascii_lowercase(),
                            h.value.to_string(),
                        )
                    })
                    .collect();
                let _ = tx.send(Received {
                    headers,
                    body,
                    path: request.url().to_string(),
                });
                let (status, headers, delay) = answer(n + 1);
                std::thread::sleep(delay);
                let mut response = tiny_http::Response::empty(status);
                for (name, value) in headers {
                    if let Ok(header) = tiny_http::Header::from_bytes(name, value) {
                        response.add_header(header);
                    }
                }
                let _ = request.respond(response);
            }
        });
        (format!("http://127.0.0.1:{port}/hook?token=s3cr3t"), rx)
    }

    fn request(headers: &[(&str, &str)]) -> Request {
        Request {
            target: Bson::Int32(1),
            operation: Operation::Post,
            version: None,
            body: doc! { "_id": "c/abc", "n": 1_i64, "when": bson::DateTime::from_millis(0) },
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn attempt<'a>(request: &'a Request, number: u32) -> Attempt<'a> {
        Attempt {
            entry: "d/c/abc",
            record: "c/abc",
            event_id: "abc",
            number,
            owner: "me",
            request,
        }
    }

    fn webhook(url: &str, timeout: Duration) -> Webhook {
        Webhook::new(url, parse_secret(SECRET).expect("secret"), timeout).expect("a webhook")
    }

    fn failure(outcome: Outcome, class: FailureClass) -> SinkFailure {
        match outcome {
            Outcome::Failed(f) if f.class == class => f,
            other => panic!("not {}: {other:?}", class.as_str()),
        }
    }

    /// The base64 HMAC-SHA256 of `<id>.<timestamp>.<body>`, computed here.
    fn expected_signature(id: &str, timestamp: &str, body: &[u8]) -> String {
        let key = base64::engine::general_purpose::STANDARD
            .decode(SECRET.trim_start_matches("whsec_"))
            .expect("the test secret");
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("key");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        )
    }

    #[test]
    fn a_request_is_signed_over_the_bytes_sent_under_a_stable_id() {
        let (url, received) = serve(|_| (200, Vec::new(), Duration::ZERO));
        let hook = webhook(&url, Duration::from_secs(5));
        let request = request(&[("X-Trace", "t-1")]);
        for number in [1, 2] {
            match hook.deliver(&attempt(&request, number)) {
                Outcome::Accepted { evidence, settled } => {
                    assert_eq!(evidence.status, Some(200));
                    assert_eq!(evidence.outcome.as_deref(), Some("accepted"));
                    assert!(!settled);
                }
                other => panic!("{other:?}"),
            }
        }
        let expected_body =
            serde_json::to_vec(&Bson::Document(request.body.clone()).into_relaxed_extjson())
                .expect("JSON");
        for got in [
            received.recv().expect("first"),
            received.recv().expect("second"),
        ] {
            assert_eq!(got.header("webhook-id"), "abc");
            assert_eq!(got.path, "/hook?token=s3cr3t");
            assert_eq!(got.header("content-type"), "application/json");
            assert_eq!(got.header("x-trace"), "t-1");
            assert!(got.header("user-agent").starts_with("handoff/"));
            let timestamp = got.header("webhook-timestamp");
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("clock")
                .as_secs();
            let sent: u64 = timestamp.parse().expect("Unix seconds");
            assert!(sent.abs_diff(now) < 60, "{sent} vs {now}");
            assert_eq!(
                got.header("webhook-signature"),
                expected_signature("abc", timestamp, &got.body)
            );
            assert_eq!(got.body, expected_body);
            let body: serde_json::Value = serde_json::from_slice(&got.body).expect("JSON");
            assert_eq!(body["_id"], "c/abc");
            assert_eq!(body["n"], 1);
            assert!(body["when"]["$date"].is_string(), "{body}");
        }
    }

    #[test]
    fn a_request_header_never_replaces_the_webhook_own() {
        let (url, received) = serve(|_| (204, Vec::new(), Duration::ZERO));
        let hook = webhook(&url, Duration::from_secs(5));
        let request = request(&[
            ("Webhook-Id", "forged"),
            ("webhook-signature", "v1,forged"),
            ("WEBHOOK-TIMESTAMP", "1"),
            ("Content-Type", "text/plain"),
            ("Host", "elsewhere.example"),
            ("Connection", "close"),
            ("X-Kept", "yes"),
        ]);
        assert!(matches!(
            hook.deliver(&attempt(&request, 1)),
            Outcome::Accepted { .. }
        ));
        let got = received.recv().expect("a request");
        assert_eq!(got.header("webhook-id"), "abc");
        assert_eq!(got.header("content-type"), "application/json");
        assert_ne!(got.header("webhook-timestamp"), "1");
        assert!(got.header("host").starts_with("127.0.0.1:"));
        assert_eq!(got.header("x-kept"), "yes");
        assert!(got.headers.iter().all(|(_, v)| !v.contains("forged")));
        assert_eq!(
            got.header("webhook-signature"),
            expected_signature("abc", got.header("webhook-timestamp"), &got.body)
        );
    }

    #[test]
    fn a_header_that_is_not_http_is_a_permanent_failure_and_nothing_is_sent() {
        let (url, received) = serve(|_| (200, Vec::new(), Duration::ZERO));
        let hook = webhook(&url, Duration::from_secs(5));
        for bad in [("bad name", "x"), ("X-Bad", "line\nbreak")] {
            let request = request(&[bad]);
            let f = failure(hook.deliver(&attempt(&request, 1)), FailureClass::Permanent);
            assert!(f.text.contains("not valid HTTP"), "{}", f.text);
        }
        assert!(received.recv_timeout(Duration::from_millis(200)).is_err());
    }

    #[test]
    fn statuses_are_classified() {
        let (url, _received) = serve(|n| match n {
            1 => (500, Vec::new(), Duration::ZERO),
            2 => (429, vec![("Retry-After", "7".into())], Duration::ZERO),
            3 => (400, Vec::new(), Duration::ZERO),
            4 => (408, Vec::new(), Duration::ZERO),
            5 => (503, vec![("Retry-After", "soon".into())], Duration::ZERO),
            6 => (404, Vec::new(), Duration::ZERO),
            _ => (204, Vec::new(), Duration::ZERO),
        });
        let hook = webhook(&url, Duration::from_secs(5));
        let request = request(&[]);
        let deliver = |n| hook.deliver(&attempt(&request, n));
        let f = failure(deliver(1), FailureClass::Transient);
        assert_eq!((f.evidence.status, f.retry_after), (Some(500), None));
        let f = failure(deliver(2), FailureClass::Transient);
        assert_eq!(
            (f.evidence.status, f.retry_after),
            (Some(429), Some(Duration::from_secs(7)))
        );
        let f = failure(deliver(3), FailureClass::Permanent);
        assert_eq!(f.evidence.status, Some(400));
        assert!(f.text.contains("400"), "{}", f.text);
        let f = failure(deliver(4), FailureClass::Transient);
        assert_eq!(f.evidence.status, Some(408));
        let f = failure(deliver(5), FailureClass::Transient);
        assert_eq!((f.evidence.status, f.retry_after), (Some(503), None));
        let f = failure(deliver(6), FailureClass::Permanent);
        assert_eq!(f.evidence.status, Some(404));
        assert!(matches!(
            deliver(7),
            Outcome::Accepted { evidence, .. } if evidence.status == Some(204)
        ));
    }

    #[test]
    fn a_redirect_is_not_followed() {
        let (target, target_received) = serve(|_| (200, Vec::new(), Duration::ZERO));
        let (url, received) =
            serve(move |_| (301, vec![("Location", target.clone())], Duration::ZERO));
        let hook = webhook(&url, Duration::from_secs(5));
        let request = request(&[]);
        let f = failure(hook.deliver(&attempt(&request, 1)), FailureClass::Permanent);
        assert_eq!(f.evidence.status, Some(301));
        assert!(f.text.contains("redirects are not followed"), "{}", f.text);
        assert!(received.recv().is_ok());
        assert!(
            target_received
                .recv_timeout(Duration::from_millis(300))
                .is_err(),
            "the Location was requested"
        );
    }

    #[test]
    fn a_refused_connection_and_a_slow_receiver_are_transient() {
        // A port nothing listens on.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("addr").port()
        };
        let request = request(&[]);
        let refused = webhook(
            &format!("http://127.0.0.1:{port}/hook?token=s3cr3t"),
            Duration::from_secs(2),
        );
        let f = failure(
            refused.deliver(&attempt(&request, 1)),
            FailureClass::Transient,
        );
        assert_eq!(f.text, "the receiver refused the connection");
        assert!(!f.text.contains("s3cr3t"), "{}", f.text);
        assert_eq!(f.evidence.status, None);

        let (url, _received) = serve(|_| (200, Vec::new(), Duration::from_secs(3)));
        let slow = webhook(&url, Duration::from_millis(500));
        let started = std::time::Instant::now();
        let f = failure(slow.deliver(&attempt(&request, 1)), FailureClass::Transient);
        assert!(f.text.contains("timed out"), "{}", f.text);
        assert!(!f.text.contains("s3cr3t"), "{}", f.text);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn bad_urls_and_secrets_are_refused_without_echoing_them() {
        let secret = parse_secret(SECRET).expect("secret");
        for (url, needle) in [
            ("http://user:hunter2@example.com/x", "credentials"),
            ("https://hunter2@example.com/x", "credentials"),
            ("https://:hunter2@example.com/x", "credentials"),
            ("ftp://example.com/x", "http"),
            ("file:///etc/hunter2", "http"),
            ("http://example.com/x#hunter2", "fragment"),
            ("not a url hunter2", "not one"),
            ("http://user:hunter2@", "not one"),
        ] {
            let error = Webhook::new(url, secret.clone(), Duration::from_secs(1))
                .err()
                .unwrap_or_else(|| panic!("{url} is taken"));
            assert!(error.contains(needle), "{url}: {error}");
            assert!(!error.contains("hunter2"), "{error}");
        }
        let short = Webhook::new("https://example.com/", vec![1; 8], Duration::from_secs(1));
        assert!(short.is_err());

        let good = parse_secret(SECRET).expect("secret");
        assert_eq!(good.len(), 24);
        assert_eq!(parse_secret(&format!("  {SECRET}\n")), Ok(good));
        let long = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 256])
        );
        assert_eq!(parse_secret(&long).map(|s| s.len()), Ok(256));
        let too_long = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 257])
        );
        for bad in [
            "hunter2",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!!hunter2",
            "whsec_hunter2-_",
            "whsec_AAAA",
            "whsec_",
            "",
            &too_long,
        ] {
            let error = parse_secret(bad).expect_err("refused");
            assert!(!error.contains("hunter2"), "{error}");
        }
    }

    #[test]
    fn the_pin_has_neither_query_nor_credentials() {
        let secret = parse_secret(SECRET).expect("secret");
        for (url, pin) in [
            (
                "https://h.example:8443/p/q?token=s3",
                "https://h.example:8443/p/q",
            ),
            ("http://h.example", "http://h.example/"),
            ("https://H.Example:443/a", "https://h.example/a"),
            ("http://[::1]:9000/x?y", "http://[::1]:9000/x"),
        ] {
            let hook = Webhook::new(url, secret.clone(), Duration::from_secs(1)).expect(url);
            assert_eq!(hook.pin(), pin);
            assert!(!hook.transactional());
        }
    }

    #[test]
    fn ids_that_the_spec_refuses_are_mapped_to_a_stable_digest() {
        assert_eq!(webhook_id("abc-1_2", "c/abc-1_2"), "abc-1_2");
        let mapped = webhook_id("a.b", "c/a.b");
        assert_eq!(mapped, format!("h_{}", hex(&Sha256::digest(b"c/a.b"))));
        assert_eq!(mapped.len(), 2 + 64);
        assert!(!mapped.contains('.'));
        assert_eq!(mapped, webhook_id("a.b", "c/a.b"));
        assert_ne!(mapped, webhook_id("a.c", "c/a.c"));
        assert_eq!(webhook_id(&"x".repeat(200), "c/x"), "x".repeat(200));
        assert!(webhook_id(&"x".repeat(201), "c/x").starts_with("h_"));
        for odd in ["", "a b", "é", "a/b"] {
            assert!(webhook_id(odd, "c/odd").starts_with("h_"), "{odd}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(retry_after("999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            retry_after("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(retry_after(&later, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        for bad in ["soon", "-5", "1.5", ""] {
            assert_eq!(retry_after(bad, now), None, "{bad}");
        }
    }
}
