//! Live metrics of a long run (`run --follow --metrics-listen ADDR`): the run's counters, where
//! its consumer stands and the write-to-commit latency histogram, in the OpenMetrics text
//! format (`prometheus-client`), with liveness and readiness, served over HTTP while it runs.
//!
//! - `GET /metrics`: `application/openmetrics-text`;
//! - `GET /healthz`: 200 while the process serves (liveness);
//! - `GET /readyz`: 200 once the run's stream is open, 503 before and once the run has ended.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use handoff_domain::error::HandoffError;
use handoff_domain::position::Position;
use handoff_session::{Committed, Observer};

/// What the metrics endpoint serves: the figures as text, and whether the run is ready.
pub trait Scraped: Send + Sync + 'static {
    /// The metrics in the OpenMetrics text format.
    fn encode(&self) -> String;
    /// Whether the run's stream is open (and the run has not ended).
    fn is_ready(&self) -> bool;
}

/// `registry` in the OpenMetrics text format (empty if it cannot be encoded).
pub(crate) fn text_of(registry: &Registry) -> String {
    let mut text = String::new();
    if encode(&mut text, registry).is_err() {
        text.clear();
    }
    text
}

/// The OpenMetrics content type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The run's metrics as they change, and what `/metrics` reads.
pub struct LiveMetrics {
    registry: Registry,
    committed: Counter,
    handed_off: Counter,
    skipped: Counter,
    quarantined: Counter,
    source_transactions: Counter,
    latency: Histogram,
    checkpoint_age: Gauge,
    lag: Gauge,
    oplog_margin: Gauge,
    /// The counters' totals as last reported, to add what a commit added.
    seen: Mutex<Committed>,
    /// The checkpoint's cluster time (seconds since the epoch), 0 before the first.
    checkpoint_time: AtomicI64,
    /// The checkpoint's token as canonical Extended JSON, for the figures read beside the run.
    checkpoint_token: Mutex<Option<bson::Document>>,
    ready: AtomicBool,
    scrapes: AtomicU64,
}

impl LiveMetrics {
    /// The metrics of `consumer`'s run, each labelled with it.
    pub fn new(consumer: &str) -> Arc<LiveMetrics> {
        let mut registry = Registry::with_prefix_and_labels(
            "handoff",
            [("consumer".into(), consumer.to_string().into())].into_iter(),
        );
        let metrics = LiveMetrics {
            registry: Registry::default(),
            committed: Counter::default(),
            handed_off: Counter::default(),
            skipped: Counter::default(),
            quarantined: Counter::default(),
            source_transactions: Counter::default(),
            latency: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            checkpoint_age: Gauge::default(),
            lag: Gauge::default(),
            oplog_margin: Gauge::default(),
            seen: Mutex::new(Committed::default()),
            checkpoint_time: AtomicI64::new(0),
            checkpoint_token: Mutex::new(None),
            ready: AtomicBool::new(false),
            scrapes: AtomicU64::new(0),
        };
        for (name, help, counter) in [
            (
                "events_committed",
                "Events committed (handed off, skipped or quarantined)",
                &metrics.committed,
            ),
            (
                "events_handed_off",
                "Events handed off to the outbox",
                &metrics.handed_off,
            ),
            (
                "events_skipped",
                "Events the policy skipped",
                &metrics.skipped,
            ),
            (
                "events_quarantined",
                "Events the policy quarantined",
                &metrics.quarantined,
            ),
            (
                "source_transactions",
                "Source transactions committed whole",
                &metrics.source_transactions,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "latency_seconds",
            "From a change's write (its wallTime) to the commit of its hand-off",
            metrics.latency.clone(),
        );
        for (name, help, gauge) in [
            (
                "checkpoint_age_seconds",
                "This machine's clock minus the checkpoint's cluster time",
                &metrics.checkpoint_age,
            ),
            (
                "lag_seconds",
                "The deployment's cluster time minus the checkpoint's (read every 10 s)",
                &metrics.lag,
            ),
            (
                "oplog_margin_seconds",
                "The checkpoint's cluster time minus the oplog's oldest entry (read every 10 s)",
                &metrics.oplog_margin,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        Arc::new(LiveMetrics {
            registry,
            ..metrics
        })
    }

    /// The checkpoint's token as last committed, for the figures read beside the run.
    pub fn checkpoint_token(&self) -> Option<bson::Document> {
        self.checkpoint_token.lock().ok()?.clone()
    }

    /// Where the consumer stands, as read beside the run.
    pub fn set_position(&self, position: &Position) {
        if let Some(lag) = position.lag_seconds() {
            self.lag.set(lag);
        }
        if let Some(margin) = position.oplog_margin_seconds() {
            self.oplog_margin.set(margin);
        }
    }

    /// The run has ended: no longer ready.
    pub fn ended(&self) {
        self.ready.store(false, Ordering::SeqCst);
    }
}

impl Scraped for LiveMetrics {
    /// The metrics in the OpenMetrics text format.
    fn encode(&self) -> String {
        let time = self.checkpoint_time.load(Ordering::SeqCst);
        if time > 0 {
            let now = handoff_domain::position::wall_now() as i64;
            self.checkpoint_age.set(now.saturating_sub(time));
        }
        self.scrapes.fetch_add(1, Ordering::SeqCst);
        text_of(&self.registry)
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

impl Observer for LiveMetrics {
    fn opened(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    fn committed(
        &self,
        committed: &Committed,
        latencies_ms: &[u64],
        checkpoint: Option<&bson::Document>,
    ) {
        if let Ok(mut seen) = self.seen.lock() {
            let add = |counter: &Counter, now: u32, before: u32| {
                counter.inc_by(u64::from(now.saturating_sub(before)));
            };
            add(&self.committed, committed.events, seen.events);
            add(&self.handed_off, committed.handed_off, seen.handed_off);
            add(&self.skipped, committed.skipped, seen.skipped);
            add(&self.quarantined, committed.quarantined, seen.quarantined);
            add(
                &self.source_transactions,
                committed.transactions.whole,
                seen.transactions.whole,
            );
            *seen = committed.clone();
        }
        for ms in latencies_ms {
            self.latency.observe(*ms as f64 / 1000.0);
        }
        if let Some(token) = checkpoint {
            if let Some(time) = handoff_domain::token::cluster_time(token) {
                self.checkpoint_time
                    .store(i64::from(time.time), Ordering::SeqCst);
            }
            if let Ok(mut saved) = self.checkpoint_token.lock() {
                *saved = Some(token.clone());
            }
        }
    }
}

/// The address `--metrics-listen` names: `PORT` (on loopback), or `HOST:PORT` as given.
pub fn listen_address(text: &str) -> Result<SocketAddr, HandoffError> {
    let text = text.trim();
    let bad = |why: String| {
        HandoffError::BadInput(format!(
            "--metrics-listen takes PORT (on 127.0.0.1) or HOST:PORT, not {:?}: {why}",
            handoff_domain::text::escape_untrusted(text, 100)
        ))
    };
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("no address".into()))
}

/// Serves `metrics` on `address` from a thread of its own, for the life of the process. The
/// address is bound before it returns: a bad or busy one is refused before the run begins.
pub fn serve<M: Scraped>(address: SocketAddr, metrics: Arc<M>) -> Result<SocketAddr, HandoffError> {
    let server = tiny_http::Server::http(address).map_err(|e| {
        HandoffError::BadInput(format!(
            "--metrics-listen {address}: cannot listen there: {e}"
        ))
    })?;
    let bound = server.server_addr().to_ip().ok_or_else(|| {
        HandoffError::BadInput(format!("--metrics-listen {address}: not an IP address"))
    })?;
    let spawned = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let path = request
                    .url()
                    .split('?')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let (status, content_type, body) = match (request.method(), path.as_str()) {
                    (tiny_http::Method::Get, "/metrics") => (200, OPENMETRICS, metrics.encode()),
                    (tiny_http::Method::Get, "/healthz") => (200, "text/plain", "ok\n".into()),
                    (tiny_http::Method::Get, "/readyz") if metrics.is_ready() => {
                        (200, "text/plain", "ready\n".into())
                    }
                    (tiny_http::Method::Get, "/readyz") => {
                        (503, "text/plain", "not ready\n".into())
                    }
                    _ => (404, "text/plain", "not found\n".into()),
                };
                let mut response = tiny_http::Response::from_string(body).with_status_code(status);
                if let Ok(header) =
                    tiny_http::Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes())
                {
                    response = response.with_header(header);
                }
                let _ = request.respond(response);
            }
        });
    spawned.map_err(|e| HandoffError::Internal(e.into()))?;
    tracing::info!(address = %bound, "metrics served at /metrics, /healthz and /readyz");
    Ok(bound)
}
