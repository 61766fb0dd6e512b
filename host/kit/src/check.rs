//! `handoff policy check`: what a `.wasm` file is, whether this host can run it, and why not.

use wasmtime::component::Component;

use handoff_domain::error::{HandoffError, Result};
use handoff_runtime::Runtime;
use handoff_runtime::policy::{CONTRACT, EXPORT_PREFIX, PolicySource, check_contract, granted};

/// What a check found.
pub struct CheckReport {
    pub lines: Vec<String>,
    /// The refusal, if the host would not run the file.
    pub refusal: Option<HandoffError>,
}

/// Inspects a policy file without running it.
pub fn check(source: &PolicySource) -> Result<CheckReport> {
    let mut lines = vec![
        format!("file:      {}", source.origin),
        format!("size:      {} bytes", source.bytes.len()),
        format!("sha256:    {}", source.sha256),
    ];
    if let Err(refusal) = source.check_format() {
        lines.push("component: no".into());
        return Ok(CheckReport {
            lines,
            refusal: Some(refusal),
        });
    }
    lines.push("component: yes".into());
    // The runtime's engine: the one a run compiles with, whose epoch ticker bounds the policy's
    // answer about its parameters.
    let runtime = Runtime::new(None)?;
    let engine = runtime.engine();
    let component = match Component::new(engine, &source.bytes) {
        Ok(component) => component,
        Err(e) => {
            let refusal = HandoffError::Policy(format!(
                "the policy {} does not compile: {e:#}",
                source.origin
            ));
            return Ok(CheckReport {
                lines,
                refusal: Some(refusal),
            });
        }
    };
    let ty = component.component_type();
    for (name, _) in ty.exports(engine) {
        let note = if name.starts_with(EXPORT_PREFIX) {
            "  (the policy's run)"
        } else {
            ""
        };
        lines.push(format!("export:    {name}{note}"));
    }
    for (name, _) in ty.imports(engine) {
        lines.push(match granted(name) {
            Some(what) => format!("import:    {name}  (granted: {what})"),
            None => format!("import:    {name}  (NOT granted: the host refuses the policy)"),
        });
    }
    let refusal = match check_contract(engine, &component, &source.origin) {
        Ok(version) => {
            lines.push(format!(
                "contract:  {version} (this host implements {CONTRACT}): compatible"
            ));
            // What it reads: a run given another parameter is refused.
            match runtime.parameters(&component, &source.origin) {
                Ok(None) => lines
                    .push("params:    not declared (--policy-param names are not checked)".into()),
                Ok(Some(declared)) if declared.is_empty() => {
                    lines.push("params:    none (a run given one is refused)".into());
                }
                Ok(Some(declared)) => {
                    for parameter in declared {
                        lines.push(format!(
                            "param:     {}  {}",
                            parameter.name, parameter.summary
                        ));
                    }
                }
                Err(refusal) => {
                    return Ok(CheckReport {
                        lines,
                        refusal: Some(refusal),
                    });
                }
            }
            None
        }
        Err(refusal) => Some(refusal),
    };
    Ok(CheckReport { lines, refusal })
}
