//! Live metrics of a long delivery (`deliver --follow --metrics-listen ADDR`), served like a
//! run's (`live::serve`): what the delivery did, what it has in flight against its bounds, and
//! its lag (how long the oldest open record has waited since its admission), so a slow sink is
//! seen where it happens.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use handoff_deliver::Report;
use handoff_deliver::engine::{Progress, Watch};

use crate::live::{Scraped, text_of};

/// No open record (the lag is zero).
const NONE_OPEN: i64 = i64::MIN;

/// The delivery's metrics as they change, and what `/metrics` reads.
pub struct DeliveryMetrics {
    registry: Registry,
    admitted: Counter,
    attempts: Counter,
    delivered: Counter,
    superseded: Counter,
    retried: Counter,
    dead: Counter,
    ignored: Counter,
    in_flight: Gauge,
    in_flight_bytes: Gauge,
    lag: Gauge<f64, AtomicU64>,
    /// The counters as last reported, to add what a pass added.
    seen: Mutex<Report>,
    /// The oldest open entry's admission (ms since the epoch), `NONE_OPEN` when none is.
    oldest_open_ms: AtomicI64,
    ready: AtomicBool,
}

impl DeliveryMetrics {
    /// The metrics of `consumer`'s delivery `delivery`, each labelled with both, with its
    /// bounds (`max_in_flight` records, `max_in_flight_bytes`) beside them.
    pub fn new(
        consumer: &str,
        delivery: &str,
        max_in_flight: usize,
        max_in_flight_bytes: usize,
    ) -> Arc<DeliveryMetrics> {
        let mut registry = Registry::with_prefix_and_labels(
            "handoff_delivery",
            [
                ("consumer".into(), consumer.to_string().into()),
                ("delivery".into(), delivery.to_string().into()),
            ]
            .into_iter(),
        );
        let metrics = DeliveryMetrics {
            registry: Registry::default(),
            admitted: Counter::default(),
            attempts: Counter::default(),
            delivered: Counter::default(),
            superseded: Counter::default(),
            retried: Counter::default(),
            dead: Counter::default(),
            ignored: Counter::default(),
            in_flight: Gauge::default(),
            in_flight_bytes: Gauge::default(),
            lag: Gauge::default(),
            seen: Mutex::new(Report::default()),
            oldest_open_ms: AtomicI64::new(NONE_OPEN),
            ready: AtomicBool::new(false),
        };
        for (name, help, counter) in [
            (
                "records_admitted",
                "Outbox records admitted to the ledger",
                &metrics.admitted,
            ),
            ("attempts", "Delivery attempts settled", &metrics.attempts),
            (
                "records_delivered",
                "Effects the sink accepted",
                &metrics.delivered,
            ),
            (
                "records_superseded",
                "Accepted writes a newer version had made unnecessary",
                &metrics.superseded,
            ),
            (
                "records_retried",
                "Transient failures, tried again later",
                &metrics.retried,
            ),
            ("records_dead", "Records that went dead", &metrics.dead),
            (
                "records_ignored",
                "Records settled without an effect",
                &metrics.ignored,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        for (name, help, gauge) in [
            (
                "in_flight_records",
                "Records being delivered now",
                &metrics.in_flight,
            ),
            (
                "in_flight_bytes",
                "Bytes of the records being delivered now",
                &metrics.in_flight_bytes,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        let bound = |value: usize| {
            let gauge: Gauge = Gauge::default();
            gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
            gauge
        };
        registry.register(
            "in_flight_records_limit",
            "At most this many records in flight (--max-in-flight)",
            bound(max_in_flight),
        );
        registry.register(
            "in_flight_bytes_limit",
            "At most this many bytes in flight (--max-in-flight-bytes)",
            bound(max_in_flight_bytes),
        );
        registry.register(
            "lag_seconds",
            "How long the oldest open record has waited since its admission",
            metrics.lag.clone(),
        );
        Arc::new(DeliveryMetrics {
            registry,
            ..metrics
        })
    }

    /// The delivery has ended: no longer ready.
    pub fn ended(&self) {
        self.ready.store(false, Ordering::SeqCst);
    }
}

impl Scraped for DeliveryMetrics {
    fn encode(&self) -> String {
        let oldest = self.oldest_open_ms.load(Ordering::SeqCst);
        let lag = if oldest == NONE_OPEN {
            0.0
        } else {
            let now = bson::DateTime::now().timestamp_millis();
            now.saturating_sub(oldest).max(0) as f64 / 1000.0
        };
        self.lag.set(lag);
        text_of(&self.registry)
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

impl Watch for DeliveryMetrics {
    fn opened(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    fn progress(&self, progress: &Progress<'_>) {
        let now = progress.report;
        if let Ok(mut seen) = self.seen.lock() {
            let add = |counter: &Counter, now: u64, before: u64| {
                counter.inc_by(now.saturating_sub(before));
            };
            add(&self.admitted, now.admitted, seen.admitted);
            add(&self.attempts, now.attempts, seen.attempts);
            add(&self.delivered, now.delivered, seen.delivered);
            add(&self.superseded, now.superseded, seen.superseded);
            add(&self.retried, now.retried, seen.retried);
            add(&self.dead, now.dead, seen.dead);
            add(&self.ignored, now.ignored, seen.ignored);
            *seen = now.clone();
        }
        self.in_flight
            .set(i64::try_from(progress.in_flight).unwrap_or(i64::MAX));
        self.in_flight_bytes
            .set(i64::try_from(progress.in_flight_bytes).unwrap_or(i64::MAX));
        self.oldest_open_ms.store(
            progress
                .oldest_open
                .map_or(NONE_OPEN, |t| t.timestamp_millis()),
            Ordering::SeqCst,
        );
    }
}
