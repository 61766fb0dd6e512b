//! What a policy makes of a delivery's records (contract 1.6, `delivery`, exported in world `delivering-policy` or `effects-policy`): each
//! outbox record's sink request, and what a failed attempt is. The policy is asked in a store of
//! its own, with no run: every import of the contract's `host` traps, WASI grants nothing (its
//! waits bounded as a run's are), and each answer is bounded by the compute slice and the memory
//! cap. A policy that fails once (a trap, a bound) is not asked again: the delivery ends there.

use std::time::{Duration, Instant};

use bson::{Bson, Document};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::limits::{Limiter, Limits};
use super::policy::{Policy, STUBBED_IMPORTS};
use super::wasi::{WaitView, Waits, add_bounded_waits_with, wasi_ctx};
use handoff_domain::StopSignal;
use handoff_domain::delivery::Operation;
use handoff_domain::effect::{
    Answer, Decided, EffectPolicy, FailureNote, SinkKind, Verdict, request_from,
};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::escape_untrusted;

/// The generated bindings of the world that decides effects.
mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "effects-policy",
    });
}

use generated::exports::handoff::policy::delivery as wit;

/// The export a policy that decides effects carries, before its version.
pub const DELIVERY_PREFIX: &str = "handoff:policy/delivery@";

/// The longest refusal reason kept.
const MAX_REASON: usize = 500;

/// Whether `component` exports the `delivery` interface.
pub fn decides(engine: &Engine, component: &Component) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with(DELIVERY_PREFIX))
}

/// A resource of the contract's that cannot exist while effects are decided.
struct NoRun;

/// Every function the component imports from the contract (`handoff:policy/…`) defined as one
/// that fails: no run exists while a delivery's effects are decided. (The linker's own stubbing
/// would also shadow WASI for a component built against an older WASI patch version.)
fn trap_contract_imports(
    linker: &mut Linker<Asking>,
    engine: &Engine,
    component: &Component,
) -> wasmtime::Result<()> {
    use wasmtime::component::ResourceType;
    use wasmtime::component::types::ComponentItem;
    for (name, item) in component.component_type().imports(engine) {
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        if !name.starts_with("handoff:policy/") {
            continue;
        }
        let mut defined = linker.instance(name)?;
        let exports: Vec<(String, ComponentItem)> = instance
            .exports(engine)
            .map(|(export, item)| (export.to_string(), item.ty))
            .collect();
        for (export, item) in &exports {
            if let ComponentItem::Resource(_) = item {
                defined.resource(export, ResourceType::host::<NoRun>(), |_, _| Ok(()))?;
            }
        }
        for (export, item) in exports {
            if let ComponentItem::ComponentFunc(_) = item {
                let what = format!("{name}#{export}");
                defined.func_new(&export, move |_, _, _, _| {
                    Err(wasmtime::Error::msg(format!(
                        "{what} was called while a delivery's effects are decided: no run \
                         exists then"
                    )))
                })?;
            }
        }
    }
    Ok(())
}

struct Asking {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    slice_started: Instant,
    interrupted: Option<String>,
    waits: Waits,
}

impl WasiView for Asking {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn view(state: &mut Asking) -> WaitView<'_> {
    WaitView::new(
        &mut state.table,
        &mut state.slice_started,
        &mut state.interrupted,
        &state.waits,
    )
}

/// A loaded policy asked for a delivery's effects.
pub struct PolicyEffects {
    store: Store<Asking>,
    policy: generated::EffectsPolicy,
    origin: String,
    /// Why the policy can no longer be asked.
    broken: Option<String>,
    slice: Duration,
}

impl PolicyEffects {
    /// The policy's effects, when it decides them (`None`: built before 1.6 or without
    /// `delivery`; the default applies). `engine` must be the runtime's: its epoch ticker
    /// bounds the answers. `stop` ends a wait in WASI.
    pub fn load(
        engine: &Engine,
        policy: &Policy,
        limits: &Limits,
        stop: &StopSignal,
    ) -> Result<Option<PolicyEffects>> {
        if !decides(engine, &policy.component) {
            return Ok(None);
        }
        let origin = escape_untrusted(&policy.origin, 200);
        let internal = |e: wasmtime::Error| HandoffError::Internal(e.into());
        let mut linker: Linker<Asking> = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(internal)?;
        add_bounded_waits_with(&mut linker, view).map_err(internal)?;
        // The contract's `host`: no run exists, so every call traps.
        trap_contract_imports(&mut linker, engine, &policy.component).map_err(internal)?;
        // What the host links without an implementation (wasi:http) traps, as in a run.
        let stubbed = policy
            .component
            .component_type()
            .imports(engine)
            .any(|(name, _)| name.starts_with(STUBBED_IMPORTS));
        if stubbed {
            linker
                .define_unknown_imports_as_traps(&policy.component)
                .map_err(internal)?;
        }
        let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
        let state = Asking {
            wasi: wasi_ctx(None, &policy.sha256),
            table: ResourceTable::new(),
            limiter: Limiter::new(limits),
            slice_started: Instant::now(),
            interrupted: None,
            waits: Waits::new(None, limits.slice, limits.run_timeout, far, stop.clone()),
        };
        let mut store = Store::new(engine, state);
        store.limiter(|state| &mut state.limiter);
        let slice = limits.slice;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |mut hook| {
            let state = hook.data_mut();
            if state.slice_started.elapsed() > slice {
                let reason = format!(
                    "the policy computed for more than {} ms on one answer (an endless loop?)",
                    slice.as_millis()
                );
                state.interrupted = Some(reason.clone());
                return Err(wasmtime::Error::msg(reason));
            }
            Ok(UpdateDeadline::Continue(1))
        });
        let instance =
            generated::EffectsPolicy::instantiate(&mut store, &policy.component, &linker).map_err(
                |e| {
                    HandoffError::Policy(format!(
                        "the policy {origin} cannot start to decide a delivery's effects: {}",
                        escape_untrusted(&format!("{e:#}"), 500)
                    ))
                },
            )?;
        Ok(Some(PolicyEffects {
            store,
            policy: instance,
            origin,
            broken: None,
            slice,
        }))
    }

    /// A call's failure, told as the policy's error; the policy is not asked again.
    fn failed(&mut self, error: wasmtime::Error) -> HandoffError {
        let state = self.store.data();
        let reason = if let Some(reason) = &state.interrupted {
            reason.clone()
        } else if state.limiter.memory_refused {
            "the policy exceeded its memory cap".to_string()
        } else {
            match error.downcast_ref::<wasmtime::Trap>() {
                Some(trap) => format!("the policy trapped: {trap}"),
                // The cause first: a wasm backtrace before it says little.
                None => format!(
                    "the policy failed: {}",
                    escape_untrusted(&error.root_cause().to_string(), 500)
                ),
            }
        };
        self.broken = Some(reason.clone());
        HandoffError::Policy(format!(
            "{reason} deciding a delivery's effect ({}); the record stays unsettled",
            self.origin
        ))
    }

    fn ready(&mut self) -> Result<()> {
        if let Some(reason) = &self.broken {
            return Err(HandoffError::Policy(format!(
                "the policy {} can no longer be asked: {reason}",
                self.origin
            )));
        }
        self.store.data_mut().slice_started = Instant::now();
        self.store.data_mut().interrupted = None;
        Ok(())
    }
}

fn sink_to_wit(sink: SinkKind) -> wit::SinkKind {
    match sink {
        SinkKind::Projection => wit::SinkKind::Projection,
        SinkKind::Webhook => wit::SinkKind::Webhook,
        SinkKind::Cache => wit::SinkKind::Cache,
        SinkKind::Broker => wit::SinkKind::Broker,
    }
}

fn operation_from(operation: wit::Operation) -> Operation {
    match operation {
        wit::Operation::Upsert => Operation::Upsert,
        wit::Operation::Delete => Operation::Delete,
        wit::Operation::Publish => Operation::Publish,
        wit::Operation::Post => Operation::Post,
        wit::Operation::Ignore => Operation::Ignore,
    }
}

impl EffectPolicy for PolicyEffects {
    fn effect(&mut self, delivery: &str, sink: SinkKind, record: &Document) -> Result<Decided> {
        self.ready()?;
        let asked = wit::DeliveryRecord {
            delivery: delivery.to_string(),
            sink: sink_to_wit(sink),
            json: Bson::Document(record.clone())
                .into_canonical_extjson()
                .to_string(),
        };
        let answer = self
            .policy
            .handoff_policy_delivery()
            .call_effect_of(&mut self.store, &asked)
            .map_err(|e| self.failed(e))?;
        let request = match answer {
            wit::Effect::DefaultEffect => Answer::default(),
            wit::Effect::Refuse(reason) => {
                return Ok(Decided::Refused(escape_untrusted(&reason, MAX_REASON)));
            }
            wit::Effect::Request(request) => Answer {
                operation: Some(operation_from(request.operation)),
                key: request.key,
                version: request.version,
                body: request.body,
                headers: request.headers,
            },
        };
        request_from(request, record, sink)
            .map(|request| Decided::Request(Box::new(request)))
            .map_err(|why| {
                HandoffError::Policy(format!(
                    "the policy {} answered nonsense for the record {}: {why}; nothing was \
                     delivered for it",
                    self.origin,
                    escape_untrusted(record.get_str("_id").unwrap_or_default(), 200)
                ))
            })
    }

    fn classify(&mut self, failure: &FailureNote<'_>) -> Result<Option<Verdict>> {
        self.ready()?;
        let asked = wit::Failure {
            record_id: failure.record.to_string(),
            sink: sink_to_wit(failure.sink),
            attempt: failure.attempt,
            transient: failure.transient,
            http_status: failure.http_status,
            message: failure.message.to_string(),
        };
        let verdict = self
            .policy
            .handoff_policy_delivery()
            .call_classify(&mut self.store, &asked)
            .map_err(|e| self.failed(e))?;
        Ok(verdict.map(|v| match v {
            wit::Verdict::Retry => Verdict::Retry,
            wit::Verdict::Dead => Verdict::Dead,
            wit::Verdict::Ignore => Verdict::Ignore,
        }))
    }

    fn describe(&self) -> String {
        format!("policy {}", self.origin)
    }
}

impl std::fmt::Debug for PolicyEffects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEffects")
            .field("origin", &self.origin)
            .field("slice", &self.slice)
            .finish_non_exhaustive()
    }
}
