//! What a policy declares before any run (contract 1.4, world `declared-policy`): the parameters
//! it reads. The host asks once per loaded policy, in a store of its own whose contract imports
//! trap (no run exists yet) and with the run's memory cap and a short deadline, and refuses a run
//! given a parameter the policy does not read.

use std::time::Duration;

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::limits::{Limiter, Limits};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::text::{did_you_mean, escape_untrusted, needs_escape};

/// The generated bindings of the world that declares.
mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "declared-policy",
    });
}

/// The export a declaring policy carries, before its version.
pub const DECLARED_PREFIX: &str = "handoff:policy/declared@";

/// The most parameters a policy may declare, and the longest name and summary.
const MAX_PARAMETERS: usize = 100;
const MAX_NAME: usize = 64;
const MAX_SUMMARY: usize = 300;

/// How long the policy may take to answer, in epoch ticks of the engine (10 ms each).
const TICKS: u64 = 200;

/// A parameter a policy reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    pub summary: String,
}

struct Asking {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
}

impl WasiView for Asking {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Whether `component` exports the `declared` interface.
pub fn declares(engine: &Engine, component: &Component) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with(DECLARED_PREFIX))
}

/// Asks the policy for its parameters. `None` when it declares none (built before 1.4, or on
/// the world without `declared`).
pub fn parameters(
    engine: &Engine,
    component: &Component,
    origin: &str,
) -> Result<Option<Vec<Parameter>>> {
    if !declares(engine, component) {
        return Ok(None);
    }
    let refused = |what: String| {
        HandoffError::Policy(format!(
            "the policy {origin} cannot say which parameters it reads: {what}"
        ))
    };
    let mut linker: Linker<Asking> = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| HandoffError::Internal(e.into()))?;
    linker
        .define_unknown_imports_as_traps(component)
        .map_err(|e| HandoffError::Internal(e.into()))?;
    let mut store = Store::new(
        engine,
        Asking {
            // Nothing is granted: no preopens, environment, arguments, network or stdio.
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
            limiter: Limiter::new(&Limits::default()),
        },
    );
    store.limiter(|state| &mut state.limiter);
    store.set_epoch_deadline(TICKS);
    store.epoch_deadline_callback(|_| {
        Err(wasmtime::Error::msg(format!(
            "it took longer than {} s",
            Duration::from_millis(10 * TICKS).as_secs_f64()
        )))
    });
    let declared = generated::DeclaredPolicy::instantiate(&mut store, component, &linker)
        .and_then(|policy| policy.handoff_policy_declared().call_parameters(&mut store))
        .map_err(|e| refused(escape_untrusted(&format!("{e:#}"), 500)))?;
    if declared.len() > MAX_PARAMETERS {
        return Err(refused(format!(
            "it declares {} parameters, more than {MAX_PARAMETERS}",
            declared.len()
        )));
    }
    let mut parameters: Vec<Parameter> = Vec::with_capacity(declared.len());
    for parameter in declared {
        let name = parameter.name;
        if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(needs_escape) {
            return Err(refused(format!(
                "a parameter's name must be 1-{MAX_NAME} printable characters, not {}",
                escape_untrusted(&name, MAX_NAME)
            )));
        }
        if parameters.iter().any(|p| p.name == name) {
            return Err(refused(format!(
                "it declares {} twice",
                escape_untrusted(&name, MAX_NAME)
            )));
        }
        parameters.push(Parameter {
            name,
            summary: escape_untrusted(&parameter.summary, MAX_SUMMARY),
        });
    }
    Ok(Some(parameters))
}

/// Refuses `given` parameters the policy does not declare (nothing is checked for a policy that
/// declares none: it was built before 1.4 or without `declared`, and a warning says so).
pub fn check_given(
    declared: Option<&[Parameter]>,
    given: &[(String, String)],
    origin: &str,
) -> Result<()> {
    let Some(declared) = declared else {
        if !given.is_empty() {
            tracing::warn!(
                policy = %escape_untrusted(origin, 200),
                "the policy declares no parameters (built before contract 1.4 or without \
                 `declared`): the names of --policy-param are not checked"
            );
        }
        return Ok(());
    };
    let names = || declared.iter().map(|p| p.name.as_str());
    for (key, _) in given {
        if names().any(|n| n == key) {
            continue;
        }
        let key = escape_untrusted(key, MAX_NAME);
        let reads = if declared.is_empty() {
            "it reads none".to_string()
        } else {
            format!("it reads {}", names().collect::<Vec<_>>().join(", "))
        };
        return Err(HandoffError::BadInput(format!(
            "--policy-param {key}: the policy {} reads no parameter {key}; {reads}{}",
            escape_untrusted(origin, 200),
            did_you_mean(&key, names())
        )));
    }
    Ok(())
}
