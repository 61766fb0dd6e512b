//! What a policy declares before any run (contract 1.4, world `declared-policy`): the parameters
//! it reads. The host asks once per loaded policy, in a store of its own in which every import
//! traps (no run exists yet, and nothing may wait), under a memory cap and a short epoch bound,
//! one parameter per call: an answer costs the host no more than its own strings, which the cap
//! bounds. A run given a parameter the policy does not read is refused.

use std::time::Duration;

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

use super::limits::{Limiter, Limits};
use super::policy::Policy;
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
const MAX_PARAMETERS: u32 = 100;
const MAX_NAME: usize = 64;
const MAX_SUMMARY: usize = 300;

/// How long the policy may take to answer, in epoch ticks of the engine (10 ms each).
const TICKS: u64 = 200;

/// The memory the policy may grow to while it answers: the start-up of a language's runtime,
/// and a bound on what one answer can make the host copy.
const MEMORY_MIB: usize = 64;

/// A parameter a policy reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    pub summary: String,
}

struct Asking {
    limiter: Limiter,
}

/// Whether `component` exports the `declared` interface.
fn declares(engine: &Engine, component: &Component) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with(DECLARED_PREFIX))
}

/// Asks the policy for its parameters. `None` when it declares none (built before 1.4, or on
/// the world without `declared`). `engine` must be the runtime's: its epoch ticker is what
/// bounds the answer ([`Runtime::parameters`](super::Runtime::parameters)).
pub(crate) fn parameters(
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
    let failed = |e: wasmtime::Error| refused(escape_untrusted(&format!("{e:#}"), 500));
    let mut linker: Linker<Asking> = Linker::new(engine);
    linker
        .define_unknown_imports_as_traps(component)
        .map_err(|e| HandoffError::Internal(e.into()))?;
    let limits = Limits {
        memory_bytes: MEMORY_MIB << 20,
        ..Limits::default()
    };
    let mut store = Store::new(
        engine,
        Asking {
            limiter: Limiter::new(&limits),
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
    let policy =
        generated::DeclaredPolicy::instantiate(&mut store, component, &linker).map_err(failed)?;
    let declared = policy.handoff_policy_declared();
    let count = declared.call_parameter_count(&mut store).map_err(failed)?;
    if count > MAX_PARAMETERS {
        return Err(refused(format!(
            "it declares {count} parameters, more than {MAX_PARAMETERS}"
        )));
    }
    let mut parameters: Vec<Parameter> = Vec::with_capacity(count as usize);
    for index in 0..count {
        let parameter = declared
            .call_parameter_at(&mut store, index)
            .map_err(failed)?;
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

/// Refuses `given` parameters `policy` does not declare. The policy is asked only when some are
/// given, so a run without parameters pays nothing for the question; nothing is checked for a
/// policy that declares none (built before 1.4 or without `declared`), and a warning says so.
pub fn check_given(engine: &Engine, policy: &Policy, given: &[(String, String)]) -> Result<()> {
    if given.is_empty() {
        return Ok(());
    }
    let origin = &policy.origin;
    let Some(declared) = parameters(engine, &policy.component, origin)? else {
        tracing::warn!(
            policy = %escape_untrusted(origin, 200),
            "the policy declares no parameters (built before contract 1.4 or without \
             `declared`): the names of --policy-param are not checked"
        );
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
