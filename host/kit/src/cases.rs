//! Policy test cases: a recorded stream plus expected results, run on a fresh store.
//!
//! A case is a directory holding `stream.jsonl` (a recorded change stream, see the fixture format)
//! and `case.json`:
//!
//! ```json
//! {
//!   "description": "what the case shows",
//!   "runs": 2,
//!   "inputs": { "max_events": 50, "max_wait_seconds": 10 },
//!   "params": { "batch_size": "3" },
//!   "expect": [ { "status": "HANDED_OFF", "events_handed_off": 2, "outbox": ["…"], … }, … ]
//! }
//! ```
//!
//! Each run's result is compared with its expectation: exit class, status, counts, the outbox and
//! quarantine IDs it added (in order, with quarantine reasons), and the checkpoint after it (token
//! as relaxed Extended JSON and mode). A mismatch prints a readable diff; `--update` writes the
//! results as the new expectations.
//!
//! A case with `"delivery": { "sink": "webhook" }` (or `projection`, `cache`, `broker`; and
//! optionally `"name"`, the delivery's, `default` when left out) also expects, per run, the
//! request the policy's effects (contract 1.6, or the default's) make of each record the run
//! added: `"requests": [ { "id", "operation", "key", "version", "headers", "body" } | { "id",
//! "refused" } | { "id", "error" }, … ]`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bson::Bson;
use serde_json::{Map, Value, json};

use handoff_backend::memory::MemoryStore;
use handoff_backend::replay::{Fixture, ReplaySource};
use handoff_domain::effect::{Decided, DefaultEffects, EffectPolicy, SinkKind};
use handoff_domain::error::{HandoffError, Result};
use handoff_domain::{CheckpointStore, Dump, StopSignal};
use handoff_run::{Plan, RawInputs, StreamOptions, begin};
use handoff_runtime::effects::PolicyEffects;
use handoff_runtime::{Limits, Policy, Runtime};
use handoff_session::OutboxOptions;

/// Which cases `policy test --filter` runs.
pub enum Filter {
    All,
    /// Names containing the text.
    Contains(String),
    /// Names matching a glob (`*`, `?`, `[...]`).
    Glob(glob::Pattern),
}

impl Filter {
    /// A pattern with `*`, `?` or `[` is a glob; other text selects names that contain it.
    pub fn parse(pattern: Option<&str>) -> Result<Filter> {
        match pattern {
            None => Ok(Filter::All),
            Some(text) if text.contains(['*', '?', '[']) => glob::Pattern::new(text)
                .map(Filter::Glob)
                .map_err(|e| HandoffError::BadInput(format!("--filter {text:?}: {e}"))),
            Some(text) => Ok(Filter::Contains(text.to_string())),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Contains(text) => name.contains(text.as_str()),
            Filter::Glob(glob) => glob.matches(name),
        }
    }
}

/// One case as read from disk.
pub struct Case {
    pub name: String,
    pub dir: PathBuf,
    pub spec: Map<String, Value>,
    pub fixture: Fixture,
}

/// What running a case did.
pub struct Execution {
    /// Each run, in the form expectations are written in.
    pub actual: Vec<Value>,
    /// The checkpoint, outbox and quarantine after the last run.
    pub dump: Dump,
    /// The errors of the runs that failed, in order.
    pub failures: Vec<HandoffError>,
}

/// The outcome of one case.
pub struct Outcome {
    pub name: String,
    pub actual: Vec<Value>,
    /// `None` when the case matched; otherwise a unified diff of expected vs actual.
    pub diff: Option<String>,
    pub had_expectations: bool,
}

fn bad(dir: &Path, what: impl std::fmt::Display) -> HandoffError {
    HandoffError::BadInput(format!("case {}: {what}", dir.display()))
}

impl Case {
    pub fn load(dir: &Path) -> Result<Case> {
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let spec_path = dir.join("case.json");
        let text = std::fs::read_to_string(&spec_path)
            .map_err(|e| bad(dir, format!("cannot read case.json: {e}")))?;
        let spec = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(bad(dir, "case.json must be a JSON object")),
            Err(e) => return Err(bad(dir, format!("case.json is not JSON: {e}"))),
        };
        let fixture = Fixture::read(&dir.join("stream.jsonl")).map_err(|e| bad(dir, e))?;
        Ok(Case {
            name,
            dir: dir.to_path_buf(),
            spec,
            fixture,
        })
    }

    /// Every case directory under `root` (a directory holding `case.json`), sorted by name.
    pub fn discover(root: &Path) -> Result<Vec<Case>> {
        if root.join("case.json").exists() {
            return Ok(vec![Case::load(root)?]);
        }
        let entries = std::fs::read_dir(root).map_err(|e| {
            HandoffError::BadInput(format!(
                "cannot read cases directory {}: {e}",
                root.display()
            ))
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("case.json").exists())
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(HandoffError::BadInput(format!(
                "no case (a directory with case.json) under {}",
                root.display()
            )));
        }
        dirs.iter().map(|d| Case::load(d)).collect()
    }

    fn runs(&self) -> Result<usize> {
        match self.spec.get("runs") {
            None => Ok(1),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=100).contains(n))
                .map(|n| n as usize)
                .ok_or_else(|| bad(&self.dir, "runs must be an integer from 1 to 100")),
        }
    }

    fn input(&self, key: &str, default: &str) -> String {
        match self.spec.get("inputs").and_then(|i| i.get(key)) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => default.to_string(),
        }
    }

    /// `inputs.outbox_keep_event` (`true` by default) and `inputs.invalidate_marker` (`false`) of
    /// the case.
    fn outbox(&self) -> Result<OutboxOptions> {
        let flag = |key: &str, default: &str| match self.input(key, default).as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(bad(
                &self.dir,
                HandoffError::BadInput(format!(
                    "inputs.{key} must be true or false, not {other:?}"
                )),
            )),
        };
        Ok(OutboxOptions {
            keep_event: flag("outbox_keep_event", "true")?,
            invalidate_marker: flag("invalidate_marker", "false")?,
        })
    }

    pub(crate) fn params(&self) -> Result<Vec<(String, String)>> {
        match self.spec.get("params") {
            None => Ok(Vec::new()),
            Some(Value::Object(map)) => Ok(map
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    )
                })
                .collect()),
            Some(_) => Err(bad(&self.dir, "params must be an object of strings")),
        }
    }

    /// The sink and delivery name of `delivery`, when the case expects requests.
    fn delivery(&self) -> Result<Option<(SinkKind, String)>> {
        let Some(spec) = self.spec.get("delivery") else {
            return Ok(None);
        };
        let sink = match spec.get("sink").and_then(Value::as_str) {
            Some("projection") => SinkKind::Projection,
            Some("webhook") => SinkKind::Webhook,
            Some("cache") => SinkKind::Cache,
            Some("broker") => SinkKind::Broker,
            _ => {
                return Err(bad(
                    &self.dir,
                    "delivery.sink must be projection, webhook, cache or broker",
                ));
            }
        };
        let name = match spec.get("name") {
            None => "default".to_string(),
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            Some(_) => return Err(bad(&self.dir, "delivery.name must be a non-empty string")),
        };
        Ok(Some((sink, name)))
    }

    /// Runs the case on a fresh in-memory store: each run described as expectations are
    /// written, what the store holds after the last, and the errors of the runs that failed.
    pub fn execute(&self, runtime: &Runtime, policy: &Policy) -> Result<Execution> {
        let source = self.fixture.deployment.as_ref().map(|d| d.source.clone());
        let (database, collection) = source.as_deref().and_then(|s| s.split_once('.')).map_or(
            ("change_demo".to_string(), "orders".to_string()),
            |(d, c)| (d.to_string(), c.to_string()),
        );
        let inputs = RawInputs {
            database,
            collection,
            consumer_id: self.input("consumer_id", "orders-to-outbox"),
            checkpoint_collection: "checkpoints".into(),
            outbox_collection: "outbox".into(),
            quarantine_collection: "quarantine".into(),
            runs_collection: "runs".into(),
            runs_keep: 10,
            max_events: self.input("max_events", "50"),
            max_wait_seconds: self.input("max_wait_seconds", "10"),
        }
        .validate()
        .map_err(|e| bad(&self.dir, e))?;
        let store = Arc::new(MemoryStore::new());
        let fixture = Arc::new(self.fixture.clone());
        let plan = Plan {
            inputs,
            params: self.params()?,
            limits: Limits::default(),
            stop: StopSignal::default(),
            outbox: self.outbox()?,
            stream: StreamOptions::default(),
            follow: None,
            live: Default::default(),
        };
        // A parameter the policy does not read makes the case itself wrong.
        runtime
            .check_params(policy, &plan.params)
            .map_err(|e| bad(&self.dir, e))?;
        let inputs = &plan.inputs;
        let delivery = self.delivery()?;
        let mut effects: Option<Box<dyn EffectPolicy>> = match &delivery {
            None => None,
            Some(_) => Some(
                match PolicyEffects::load(runtime.engine(), policy, &plan.limits, &plan.stop)? {
                    Some(effects) => Box::new(effects),
                    None => Box::new(DefaultEffects),
                },
            ),
        };
        let mut actual = Vec::new();
        let mut failures = Vec::new();
        let mut before = Dump::default();
        for _ in 0..self.runs()? {
            let result = plan
                .execute(
                    runtime,
                    policy,
                    Box::new(ReplaySource::new(fixture.clone())),
                    store.clone(),
                    begin(&plan.limits),
                )
                .map_err(HandoffError::from);
            let after = store
                .dump(&inputs.consumer_id)
                .map_err(|e| HandoffError::Unavailable(e.to_string()))?;
            let mut run = describe(&result, &before, &after);
            if let (Some((sink, name)), Some(effects), Value::Object(run)) =
                (&delivery, effects.as_mut(), &mut run)
            {
                let added = &after.outbox[before.outbox.len().min(after.outbox.len())..];
                let requests = added
                    .iter()
                    .map(|record| describe_request(effects.as_mut(), name, *sink, record))
                    .collect();
                run.insert("requests".into(), Value::Array(requests));
            }
            actual.push(run);
            failures.extend(result.err());
            before = after;
        }
        Ok(Execution {
            actual,
            dump: before,
            failures,
        })
    }

    /// Runs the case on a fresh in-memory store and compares with its expectations.
    pub fn run(&self, runtime: &Runtime, policy: &Policy) -> Result<Outcome> {
        let actual = self.execute(runtime, policy)?.actual;
        let expected = self.spec.get("expect").cloned();
        let actual_value = Value::Array(actual.clone());
        let diff = match &expected {
            Some(expected) if *expected == actual_value => None,
            Some(expected) => Some(unified_diff(expected, &actual_value)),
            None => Some(unified_diff(&Value::Null, &actual_value)),
        };
        Ok(Outcome {
            name: self.name.clone(),
            actual,
            diff,
            had_expectations: expected.is_some(),
        })
    }

    /// Makes `dir` (holding a recorded `stream.jsonl`) a complete case: a `case.json` with
    /// `description`, one run, and the results of `policy` on the recording as its expectations.
    /// An existing `case.json` is left alone (refused).
    pub fn create(
        dir: &Path,
        description: &str,
        runtime: &Runtime,
        policy: &Policy,
    ) -> Result<Case> {
        let spec_path = dir.join("case.json");
        if spec_path.exists() {
            return Err(bad(
                dir,
                "case.json exists already: choose a new case folder",
            ));
        }
        let spec = json!({ "description": description, "runs": 1 });
        let text =
            serde_json::to_string_pretty(&spec).map_err(|e| HandoffError::Internal(e.into()))?;
        std::fs::write(&spec_path, text + "\n")
            .map_err(|e| bad(dir, format!("cannot write case.json: {e}")))?;
        let mut case = Case::load(dir)?;
        let outcome = case.run(runtime, policy)?;
        case.update(&outcome.actual)?;
        Ok(case)
    }

    /// Writes `actual` as the case's expectations.
    pub fn update(&mut self, actual: &[Value]) -> Result<()> {
        self.spec
            .insert("expect".into(), Value::Array(actual.to_vec()));
        let text = serde_json::to_string_pretty(&Value::Object(self.spec.clone()))
            .map_err(|e| HandoffError::Internal(e.into()))?;
        std::fs::write(self.dir.join("case.json"), text + "\n")
            .map_err(|e| bad(&self.dir, format!("cannot write case.json: {e}")))
    }
}

fn relaxed(value: &Bson) -> Value {
    value.clone().into_relaxed_extjson()
}

/// The event ID part of a record `_id` (`<consumer>/<id>`).
fn record_id(record: &bson::Document) -> String {
    let id = record.get_str("_id").unwrap_or_default();
    id.split_once('/').map_or(id, |(_, rest)| rest).to_string()
}

/// An outbox record as expectations show it: its event ID, or for a policy-shaped record the ID
/// and the fields the policy chose.
fn describe_record(record: &bson::Document) -> Value {
    if !record.contains_key("eventType") {
        return json!(record_id(record));
    }
    let mut shown = Map::new();
    shown.insert("id".into(), json!(record_id(record)));
    for key in [
        "eventType",
        "schemaVersion",
        "aggregateId",
        "aggregateVersion",
        "payload",
    ] {
        if let Some(value) = record.get(key) {
            shown.insert(key.into(), relaxed(value));
        }
    }
    shown.insert("keepsEvent".into(), json!(record.contains_key("event")));
    Value::Object(shown)
}

/// The request the effects make of `record`, as expectations show it.
fn describe_request(
    effects: &mut dyn EffectPolicy,
    delivery: &str,
    sink: SinkKind,
    record: &bson::Document,
) -> Value {
    let id = record_id(record);
    match effects.effect(delivery, sink, record) {
        Ok(Decided::Request(request)) => {
            let headers: Vec<Value> = request
                .headers
                .iter()
                .map(|(name, value)| json!([name, value]))
                .collect();
            json!({
                "id": id,
                "operation": request.operation.as_str(),
                "key": relaxed(&request.target),
                "version": request.version.map(handoff_domain::delivery::version_number),
                "headers": headers,
                "body": relaxed(&Bson::Document(request.body)),
            })
        }
        Ok(Decided::Refused(reason)) => json!({ "id": id, "refused": reason }),
        Err(error) => {
            let message: String = error.to_string().chars().take(200).collect();
            json!({ "id": id, "error": message })
        }
    }
}

/// What one run did, in the form expectations are written in.
fn describe(result: &Result<handoff_session::RunSummary>, before: &Dump, after: &Dump) -> Value {
    let mut run = Map::new();
    match result {
        Ok(summary) => {
            run.insert("exit".into(), json!("ok"));
            run.insert("status".into(), json!(summary.status.as_str()));
            run.insert(
                "events_handed_off".into(),
                json!(summary.committed.handed_off),
            );
            run.insert("events_skipped".into(), json!(summary.committed.skipped));
            run.insert(
                "events_quarantined".into(),
                json!(summary.committed.quarantined),
            );
            // Shown only when a run met records it had already handed off.
            if summary.committed.duplicates_suppressed > 0 {
                run.insert(
                    "duplicates_suppressed".into(),
                    json!(summary.committed.duplicates_suppressed),
                );
            }
        }
        Err(error) => {
            run.insert("exit".into(), json!(error.kind()));
            let message: String = error.to_string().chars().take(200).collect();
            run.insert("error".into(), json!(message));
        }
    }
    let outbox: Vec<Value> = after.outbox[before.outbox.len().min(after.outbox.len())..]
        .iter()
        .map(describe_record)
        .collect();
    run.insert("outbox".into(), Value::Array(outbox));
    let quarantine: Vec<Value> = after.quarantine
        [before.quarantine.len().min(after.quarantine.len())..]
        .iter()
        .map(|r| json!({ "id": record_id(r), "reason": r.get_str("reason").unwrap_or_default() }))
        .collect();
    run.insert("quarantine".into(), Value::Array(quarantine));
    let checkpoint = after.checkpoint.as_ref().map_or(Value::Null, |c| {
        json!({
            "token": c.get("token").map_or(Value::Null, relaxed),
            "mode": c.get("mode").map_or(Value::Null, relaxed),
        })
    });
    run.insert("checkpoint".into(), checkpoint);
    Value::Object(run)
}

fn unified_diff(expected: &Value, actual: &Value) -> String {
    let expected = serde_json::to_string_pretty(expected).unwrap_or_default();
    let actual = serde_json::to_string_pretty(actual).unwrap_or_default();
    similar::TextDiff::from_lines(&expected, &actual)
        .unified_diff()
        .context_radius(3)
        .header("expected", "actual")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::Filter;

    #[test]
    fn filters_select_by_text_or_glob() {
        let all = Filter::parse(None).unwrap();
        assert!(all.matches("anything"));
        let text = Filter::parse(Some("invalid")).unwrap();
        assert!(text.matches("invalidate-then-start-after"));
        assert!(!text.matches("max-events"));
        let glob = Filter::parse(Some("*-after")).unwrap();
        assert!(glob.matches("invalidate-then-start-after"));
        assert!(!glob.matches("after-all"));
        assert!(Filter::parse(Some("[unclosed")).is_err());
    }
}
