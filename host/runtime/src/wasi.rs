//! The WASI a policy gets, and every wait it can start in host code bounded.
//!
//! Epoch interruption stops a policy only while it computes. A policy that sleeps
//! (`wasi:clocks/monotonic-clock` `subscribe-*` then `wasi:io/poll` `block` or `poll`) waits in
//! host code instead, so the linker's `wasi:io/poll` and `wasi:clocks/monotonic-clock` are
//! replaced here:
//!
//! - `block` and `poll` wait at most until the end of the compute slice (a wait counts against
//!   the slice like computing does) and the run deadline, and check the stop flag every
//!   [`CHECK_EVERY`]; past the bound they trap with the reason, like the epoch callback does;
//! - under a replay, waiting on the monotonic clock moves the virtual clock to the earliest
//!   deadline at once (see [`super::clock`]); the virtual time waited counts against the slice.
//!
//! Nothing else in the granted WASI can wait: stdin is a closed stream, stdout and stderr are
//! sinks, and no file, socket or network is granted.

use std::time::{Duration, Instant};

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::bindings::sync::io::poll as sync_poll;
use wasmtime_wasi::runtime::in_tokio;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder};
use wasmtime_wasi_io::bindings::wasi::io::poll as async_poll;
use wasmtime_wasi_io::poll::{DynPollable, Pollable, subscribe};

use super::bindings::RunState;
use super::clock::{self, Clock};
use handoff_domain::StopSignal;
use handoff_domain::time::{VirtualClock, VirtualTime};

/// How often a waiting policy checks the stop flag and its bounds.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);

/// The WASI context of a run: nothing granted (no preopens, environment, arguments, network or
/// stdio); clocks and random sources real, or virtual under a replay.
///
/// `wasi:sockets` is linked, because the runtimes of interpreted languages import it, but every
/// use is denied: no TCP, no UDP, no name lookup, and no address passes the check.
pub(crate) fn wasi_ctx(virtual_time: Option<&VirtualTime>, policy_sha256: &str) -> WasiCtx {
    let mut builder = WasiCtxBuilder::new();
    builder
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }));
    if let Some(time) = virtual_time {
        clock::make_deterministic(&mut builder, time, policy_sha256);
    }
    builder.build()
}

/// What bounds the waits of one run.
pub struct Waits {
    clock: Clock,
    slice: Duration,
    run_deadline: Instant,
    run_timeout: Duration,
    stop: StopSignal,
}

impl Waits {
    /// The bounds of the waits of a run ending at `run_deadline`, on the real clock or the
    /// replay's virtual one.
    pub(crate) fn new(
        virtual_time: Option<&VirtualTime>,
        slice: Duration,
        run_timeout: Duration,
        run_deadline: Instant,
        stop: StopSignal,
    ) -> Waits {
        Waits {
            clock: match virtual_time {
                Some(time) => Clock::Virtual(time.clock.clone()),
                None => Clock::Real(Instant::now()),
            },
            slice,
            run_deadline,
            run_timeout,
            stop,
        }
    }

    fn slice_passed(&self) -> String {
        format!(
            "the policy waited (wasi:io/poll) past its compute slice of {} ms without calling the host (an endless sleep?)",
            self.slice.as_millis()
        )
    }

    fn deadline_passed(&self) -> String {
        format!(
            "the policy exceeded the run deadline of {} s while waiting (wasi:io/poll)",
            self.run_timeout.as_secs_f64()
        )
    }
}

/// Why a wait ended early.
const STOPPED: &str = "the run was stopped by a signal";

/// The view the replaced interfaces work on.
pub struct WaitView<'a> {
    table: &'a mut ResourceTable,
    slice_started: &'a mut Instant,
    interrupted: &'a mut Option<String>,
    waits: &'a Waits,
}

struct BoundedWaits;

impl HasData for BoundedWaits {
    type Data<'a> = WaitView<'a>;
}

impl<'a> WaitView<'a> {
    /// The view of a store's state whose waits `waits` bounds.
    pub(crate) fn new(
        table: &'a mut ResourceTable,
        slice_started: &'a mut Instant,
        interrupted: &'a mut Option<String>,
        waits: &'a Waits,
    ) -> WaitView<'a> {
        WaitView {
            table,
            slice_started,
            interrupted,
            waits,
        }
    }
}

fn view(state: &mut RunState) -> WaitView<'_> {
    WaitView::new(
        &mut state.table,
        &mut state.slice_started,
        &mut state.interrupted,
        &state.waits,
    )
}

/// Replaces the linker's `wasi:io/poll` and `wasi:clocks/monotonic-clock` (added by
/// `add_to_linker_sync` before) with the bounded ones.
pub(crate) fn add_bounded_waits(linker: &mut Linker<RunState>) -> wasmtime::Result<()> {
    add_bounded_waits_with(linker, view)
}

/// [`add_bounded_waits`] for a store of another state, seen through `view`.
pub(crate) fn add_bounded_waits_with<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> WaitView<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    sync_poll::add_to_linker::<T, BoundedWaits>(linker, view)?;
    monotonic_clock::add_to_linker::<T, BoundedWaits>(linker, view)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// How a bounded wait ended.
enum Waited<T> {
    Ready(T),
    Interrupted(String),
}

impl WaitView<'_> {
    /// Runs the wait `make` starts (once, or again after the virtual clock moved) within the
    /// bounds; traps with the reason when they pass.
    fn bounded<T>(
        &mut self,
        make: impl for<'t> Fn(
            &'t mut ResourceTable,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = wasmtime::Result<T>> + Send + 't>,
        >,
    ) -> wasmtime::Result<T> {
        let waits = self.waits;
        if let Clock::Virtual(clock) = &waits.clock {
            // `None`: waiting on something other than the clock, bounded in real time below.
            if let Some(result) = self.virtual_wait(clock, &make)? {
                return Ok(result);
            }
        }
        let bound = self
            .slice_started
            .checked_add(waits.slice)
            .map_or(waits.run_deadline, |end| end.min(waits.run_deadline));
        let table = &mut *self.table;
        let outcome = in_tokio(async {
            let mut wait = make(table);
            loop {
                if waits.stop.requested() {
                    return Waited::Interrupted(STOPPED.to_string());
                }
                let now = Instant::now();
                if now >= bound {
                    return Waited::Interrupted(if bound >= waits.run_deadline {
                        waits.deadline_passed()
                    } else {
                        waits.slice_passed()
                    });
                }
                let step = (bound - now).min(CHECK_EVERY);
                if let Ok(result) = tokio::time::timeout(step, &mut wait).await {
                    return Waited::Ready(result);
                }
            }
        });
        match outcome {
            Waited::Ready(result) => result,
            Waited::Interrupted(reason) => Err(self.interrupt(reason)),
        }
    }

    /// A wait under a replay: when nothing is ready, the virtual clock moves to the earliest
    /// deadline waited for. `None` when the wait is on something else (bounded in real time).
    fn virtual_wait<T>(
        &mut self,
        clock: &VirtualClock,
        make: &impl for<'t> Fn(
            &'t mut ResourceTable,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = wasmtime::Result<T>> + Send + 't>,
        >,
    ) -> wasmtime::Result<Option<T>> {
        let started = clock.now_ns();
        clock.take_wait();
        let mut result = in_tokio(futures_util::future::poll_immediate(make(self.table)));
        if result.is_none()
            && let Some(deadline) = clock.take_wait()
        {
            clock.advance_to_ns(deadline);
            result = in_tokio(futures_util::future::poll_immediate(make(self.table)));
        }
        let Some(result) = result else {
            return Ok(None);
        };
        // The virtual time waited counts against the slice, as a real wait would.
        let waited = Duration::from_nanos(clock.now_ns().saturating_sub(started));
        match self.slice_started.checked_sub(waited) {
            Some(start) if start.elapsed() <= self.waits.slice => {
                *self.slice_started = start;
                result.map(Some)
            }
            _ => {
                let reason = self.waits.slice_passed();
                Err(self.interrupt(reason))
            }
        }
    }

    fn interrupt(&mut self, reason: String) -> wasmtime::Error {
        tracing::debug!(%reason, "policy wait interrupted");
        *self.interrupted = Some(reason.clone());
        wasmtime::Error::msg(reason)
    }
}

impl sync_poll::Host for WaitView<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        self.bounded(move |table| {
            let pollables: Vec<_> = pollables
                .iter()
                .map(|p| Resource::new_borrow(p.rep()))
                .collect();
            Box::pin(async move { async_poll::Host::poll(table, pollables).await })
        })
    }
}

impl sync_poll::HostPollable for WaitView<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        in_tokio(async { async_poll::HostPollable::ready(&mut *self.table, pollable).await })
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        let rep = pollable.rep();
        self.bounded(move |table| {
            Box::pin(async move {
                async_poll::HostPollable::block(table, Resource::new_borrow(rep)).await
            })
        })
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        async_poll::HostPollable::drop(&mut *self.table, pollable)
    }
}

/// A deadline on the policy's monotonic clock.
struct Sleep {
    clock: Clock,
    at_ns: u64,
}

#[wasmtime_wasi_io::async_trait]
impl Pollable for Sleep {
    async fn ready(&mut self) {
        let now = self.clock.now_ns();
        if now >= self.at_ns {
            return;
        }
        match &self.clock {
            Clock::Real(_) => {
                match tokio::time::Instant::now()
                    .checked_add(Duration::from_nanos(self.at_ns - now))
                {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            }
            Clock::Virtual(clock) => {
                // The bounded wait moves the clock here if nothing else is ready.
                clock.note_wait(self.at_ns);
                std::future::pending().await
            }
        }
    }
}

impl WaitView<'_> {
    fn sleep_until(&mut self, at_ns: u64) -> wasmtime::Result<Resource<DynPollable>> {
        let sleep = self.table.push(Sleep {
            clock: self.waits.clock.clone(),
            at_ns,
        })?;
        subscribe(self.table, sleep)
    }
}

impl monotonic_clock::Host for WaitView<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(self.waits.clock.now_ns())
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.sleep_until(when)
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let at = self.waits.clock.now_ns().saturating_add(duration);
        self.sleep_until(at)
    }
}
