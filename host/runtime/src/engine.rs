//! The wasmtime engine: one per process, shared by every run.
//!
//! Configuration: no component-model concurrency, epoch interruption driven by a ticker thread,
//! a bounded guest stack. Compiled policies come from the artifact cache when possible.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, UpdateDeadline};

use super::bindings::{HandoffPolicy, RunState, export, types};
use super::cache::{ArtifactCache, Lookup};
use super::limits::{Limiter, Limits};
use super::policy::{Policy, PolicySource, STUBBED_IMPORTS, check_contract};
use super::wasi::{Waits, wasi_ctx};
use handoff_domain::error::{HandoffError, Result};
use handoff_session::{Failed, PolicyReport, RunSummary, Session, Status};

/// How often the epoch advances; the granularity of the compute slice and run deadline.
const TICK: Duration = Duration::from_millis(10);
/// The guest's stack.
const MAX_WASM_STACK: usize = 512 << 10;

/// The run's settings as the policy receives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub max_events: u32,
    pub max_wait_ms: u64,
    pub params: Vec<(String, String)>,
}

/// The policy runtime of one process: the engine, the linker with the contract's imports and
/// the artifact cache; each run instantiates a policy in a store of its own.
pub struct Runtime {
    engine: Engine,
    linker: Linker<RunState>,
    cache: Option<ArtifactCache>,
}

impl Runtime {
    /// Builds the engine. `cache_dir: None` disables the artifact cache.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Runtime> {
        let engine = build_engine()?;
        let linker = build_linker(&engine)?;
        let cache = cache_dir.map(|dir| ArtifactCache::new(&engine, dir));
        Ok(Runtime {
            engine,
            linker,
            cache,
        })
    }

    /// Builds the engine and loads a policy, as `new` then `load` do, but defines the host's
    /// imports on another thread while the policy is read (from the cache), verified and checked:
    /// the two are independent, and each is a large part of a warm start.
    pub fn with_policy(
        cache_dir: Option<PathBuf>,
        source: &PolicySource,
    ) -> Result<(Runtime, Policy)> {
        let engine = build_engine()?;
        let cache = cache_dir.map(|dir| ArtifactCache::new(&engine, dir));
        let (linker, policy) = std::thread::scope(|scope| {
            let linker = std::thread::Builder::new()
                .name("linker".into())
                .spawn_scoped(scope, || build_linker(&engine));
            let policy = load_policy(&engine, cache.as_ref(), source);
            let linker = match linker {
                Ok(handle) => handle.join().unwrap_or_else(|_| {
                    Err(HandoffError::Internal(anyhow::anyhow!(
                        "defining the host's imports panicked"
                    )))
                }),
                // No thread to spare: define them here.
                Err(_) => build_linker(&engine),
            };
            (linker, policy)
        });
        let policy = policy?;
        Ok((
            Runtime {
                engine,
                linker: linker?,
                cache,
            },
            policy,
        ))
    }

    /// The parameters `component` declares it reads (`None`: it declares none), asked in a store
    /// of this runtime's engine, whose epoch ticker bounds the answer.
    pub fn parameters(
        &self,
        component: &wasmtime::component::Component,
        origin: &str,
    ) -> Result<Option<Vec<super::declared::Parameter>>> {
        super::declared::parameters(&self.engine, component, origin)
    }

    /// Refuses parameters `policy` does not read (see [`declared::check_given`]).
    ///
    /// [`declared::check_given`]: super::declared::check_given
    pub fn check_params(&self, policy: &Policy, given: &[(String, String)]) -> Result<()> {
        super::declared::check_given(&self.engine, policy, given)
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The artifact cache, when one is used.
    pub fn cache(&self) -> Option<&ArtifactCache> {
        self.cache.as_ref()
    }

    /// Compiles (or loads from the cache) and checks a policy. Only a component that passed the
    /// contract check is cached.
    pub fn load(&self, source: &PolicySource) -> Result<Policy> {
        load_policy(&self.engine, self.cache.as_ref(), source)
    }

    /// Runs a policy over a session within the limits, then verifies its report. The session
    /// says when the run ends (its deadline and stop flag) and which clocks the policy sees (real,
    /// or a recorded stream's virtual ones).
    pub fn run(
        &self,
        policy: &Policy,
        session: Session,
        settings: &Settings,
        limits: &Limits,
    ) -> Result<RunSummary, Failed> {
        // A policy importing what is linked without an implementation gets functions that trap.
        let stubbed = policy
            .component
            .component_type()
            .imports(&self.engine)
            .any(|(name, _)| name.starts_with(STUBBED_IMPORTS));
        let linker = if stubbed {
            let mut linker = self.linker.clone();
            linker
                .define_unknown_imports_as_traps(&policy.component)
                .map_err(|e| Failed::before_commits(HandoffError::Internal(e.into())))?;
            std::borrow::Cow::Owned(linker)
        } else {
            std::borrow::Cow::Borrowed(&self.linker)
        };
        let slice = limits.slice;
        let run_timeout = limits.run_timeout;
        let run_deadline = session.deadline();
        let virtual_time = session.virtual_time();
        let waits = Waits::new(
            virtual_time.as_ref(),
            slice,
            run_timeout,
            run_deadline,
            session.stop().clone(),
        );
        let state = RunState {
            session,
            // Nothing is granted: no preopens, environment, arguments, network or stdio.
            wasi: wasi_ctx(virtual_time.as_ref(), &policy.sha256),
            table: resource_table(),
            limiter: Limiter::new(limits),
            slice_started: Instant::now(),
            interrupted: None,
            waits,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |mut hook| {
            let state = hook.data_mut();
            let reason = if state.session.stop_requested() {
                Some("the run was stopped by a signal".to_string())
            } else if Instant::now() >= run_deadline {
                Some(format!(
                    "the policy exceeded the run deadline of {} s",
                    run_timeout.as_secs_f64()
                ))
            } else if state.slice_started.elapsed() > slice {
                Some(format!(
                    "the policy computed for more than {} ms without calling the host (an endless loop?)",
                    slice.as_millis()
                ))
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    state.interrupted = Some(reason.clone());
                    Err(wasmtime::Error::msg(reason))
                }
                None => Ok(UpdateDeadline::Continue(1)),
            }
        });

        let wit_settings = types::Settings {
            max_events: settings.max_events,
            max_wait_ms: settings.max_wait_ms,
            params: settings.params.clone(),
        };
        let outcome = HandoffPolicy::instantiate(&mut store, &policy.component, &linker)
            .map_err(|e| {
                HandoffError::Policy(format!("the policy {} cannot start: {e:#}", policy.origin))
            })
            .and_then(|instance| {
                store.data_mut().slice_started = Instant::now();
                instance
                    .handoff_policy_policy()
                    .call_run(&mut store, &wit_settings)
                    .map_err(|trap| classify_trap(store.data(), trap))
            });
        let mut state = store.into_data();
        // What the policy grew to (memories and tables never shrink within a run): what an
        // operator sizes `--policy-memory-mib` by.
        tracing::info!(
            target: "handoff::policy",
            memory_bytes = state.limiter.used_bytes() as u64,
            memory_cap_bytes = limits.memory_bytes as u64,
            "policy memory"
        );
        let finished = match outcome {
            Ok(result) => state.session.finish(result.map(report_from)),
            // Stopped while computing: nothing was in flight, the commits stand.
            Err(_) if state.session.stop_requested() && state.session.failure().is_none() => {
                state.session.finish(Err(String::new()))
            }
            Err(error) => match state.session.failure() {
                // A host-reported failure explains the trap better than the trap itself.
                Some(_) => state.session.finish(Err(String::new())),
                None => Err(error),
            },
        };
        finished.map_err(|error| Failed {
            error,
            committed: Box::new(state.session.committed().clone()),
        })
    }
}

/// How many host resources (streams, pollables) a policy may hold at once: each costs host
/// memory outside its memory cap.
const MAX_RESOURCES: usize = 10_000;

fn resource_table() -> ResourceTable {
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_RESOURCES);
    table
}

/// The engine: component model without concurrency, epoch interruption driven by a ticker thread,
/// a bounded guest stack.
fn build_engine() -> Result<Engine> {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .concurrency_support(false)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK);
    let engine = Engine::new(&config).map_err(|e| HandoffError::Internal(e.into()))?;
    tracing::debug!(target: "handoff::startup", "engine built");
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("epoch-ticker".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(TICK);
            }
        })
        .map_err(|e| HandoffError::Internal(e.into()))?;
    Ok(engine)
}

/// What the host grants a policy: the WASI interfaces (without capabilities) and the contract.
fn build_linker(engine: &Engine) -> Result<Linker<RunState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| HandoffError::Internal(e.into()))?;
    super::wasi::add_bounded_waits(&mut linker).map_err(|e| HandoffError::Internal(e.into()))?;
    HandoffPolicy::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
        .map_err(|e| HandoffError::Internal(e.into()))?;
    super::bindings::add_bounded_imports(&mut linker)
        .map_err(|e| HandoffError::Internal(e.into()))?;
    Ok(linker)
}

/// Compiles (or loads from the cache) and checks a policy. Only a component that passed the
/// contract check is cached.
fn load_policy(
    engine: &Engine,
    cache: Option<&ArtifactCache>,
    source: &PolicySource,
) -> Result<Policy> {
    source.check_format()?;
    let lookup = match cache {
        Some(cache) => cache.load(engine, &source.sha256),
        None => Lookup::Refused,
    };
    let store = matches!(lookup, Lookup::Miss);
    let component = match lookup {
        Lookup::Hit(component) => component,
        Lookup::Miss | Lookup::Refused => {
            wasmtime::component::Component::new(engine, &source.bytes).map_err(|e| {
                HandoffError::Policy(format!(
                    "the policy {} does not compile: {e:#}",
                    source.origin
                ))
            })?
        }
    };
    let contract = check_contract(engine, &component, &source.origin)?;
    if let (true, Some(cache)) = (store, cache) {
        cache.store(&source.sha256, &component);
    }
    Ok(Policy {
        component,
        sha256: source.sha256.clone(),
        origin: source.origin.clone(),
        contract,
    })
}

fn report_from(report: export::Report) -> PolicyReport {
    PolicyReport {
        status: match report.status {
            types::RunStatus::Idle => Status::Idle,
            types::RunStatus::HandedOff => Status::HandedOff,
            types::RunStatus::Invalidated => Status::Invalidated,
        },
        events_handed_off: report.events_handed_off,
        last_event_id: report.last_event_id,
    }
}

fn classify_trap(state: &RunState, error: wasmtime::Error) -> HandoffError {
    let suffix = "; nothing after the last commit was written";
    if let Some(reason) = &state.interrupted {
        return HandoffError::Policy(format!("{reason}{suffix}"));
    }
    if state.limiter.memory_refused {
        return HandoffError::Policy(format!("the policy exceeded its memory cap{suffix}"));
    }
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::StackOverflow) => {
            HandoffError::Policy(format!("the policy overflowed its stack{suffix}"))
        }
        Some(trap) => HandoffError::Policy(format!("the policy trapped: {trap}{suffix}")),
        None => HandoffError::Policy(format!("the policy failed: {error:#}{suffix}")),
    }
}
