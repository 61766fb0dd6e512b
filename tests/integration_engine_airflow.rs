//! The Airflow example (`flows/airflow`), loaded as Airflow loads it (see `support::engines`).

use crate::support;
use crate::support::engines::*;

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::{Value, json};
use support::live::Live;

/// The Airflow names the DAG may import, and so the only names the stand-ins provide (Airflow 3:
/// the task SDK `airflow.sdk`; the exceptions in `airflow.sdk.exceptions` since 3.2, in
/// `airflow.exceptions` before). A misspelt or unknown name fails the import, as it would on a
/// worker.
const AIRFLOW_API: &str = r#"{
    "airflow.sdk": ["DAG", "Param", "Variable", "dag", "get_current_context", "task"],
    "airflow.sdk.exceptions": ["AirflowException", "AirflowFailException", "AirflowSkipException"],
    "airflow.exceptions": ["AirflowException", "AirflowFailException", "AirflowSkipException"]
}"#;

/// Loads a DAG file as an Airflow worker would, with stand-ins for the Airflow names it imports,
/// after reading it with `ast`: its Airflow imports, its constants, the one `@task` that runs
/// `HANDOFF_COMMAND` and that task's decorator arguments.
///
/// `inspect` reports what was read, what the DAG declared and the DAG's `retry_decision` for each
/// of the `codes` asked. `run` calls the task's function the
/// way Airflow runs a try (the DAG's params with overrides in `context["params"]`, a task instance
/// in `context["ti"]`, Variables from the request) and reports what Airflow would make of it: the
/// value returned (XCom `return_value`), the XComs pushed, the exception raised and the state —
/// success; failed for AirflowFailException (whatever retries are left); skipped for
/// AirflowSkipException; up_for_retry for any other exception while retries are left. After a
/// success the downstream task runs on the returned value.
const AIRFLOW_HARNESS: &str = r#"
import ast, collections.abc, importlib.util, json, os, sys, types, typing

path, mode, request = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
api = request["api"]
source = open(path, encoding="utf-8").read()
tree = ast.parse(source, path)

for node in ast.walk(tree):
    if isinstance(node, ast.Import):
        for alias in node.names:
            assert alias.name.split(".")[0] != "airflow", f"import {alias.name}: use from-imports"
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "airflow":
        for alias in node.names:
            assert alias.name in api.get(node.module, []), f"{node.module}.{alias.name} is not a known Airflow name"

constants = {}
for node in tree.body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        try:
            constants[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            pass

def decorator_arguments(function, name):
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Name) and decorator.id == name:
            return {}
        if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name) and decorator.func.id == name:
            return {k.arg: ast.unparse(k.value) for k in decorator.keywords}
    return None

runners = [
    f for f in ast.walk(tree)
    if isinstance(f, ast.FunctionDef) and decorator_arguments(f, "task") is not None
    and any(isinstance(n, ast.Name) and n.id == "HANDOFF_COMMAND" for n in ast.walk(f))
]
assert len(runners) == 1, "one @task runs HANDOFF_COMMAND"
runner = runners[0]

class AirflowException(Exception):
    pass

class AirflowFailException(AirflowException):
    pass

class AirflowSkipException(AirflowException):
    pass

declared = {"dags": [], "tasks": {}, "edges": []}

class XComArg:
    def __init__(self, task_id):
        self.task_id = task_id

def task(python_callable=None, **arguments):
    def wrap(function):
        declared["tasks"][function.__name__] = {"arguments": arguments, "function": function}
        def call(*args, **kwargs):
            upstream = [a.task_id for a in list(args) + list(kwargs.values()) if isinstance(a, XComArg)]
            declared["edges"].extend([u, function.__name__] for u in upstream)
            return XComArg(function.__name__)
        call.function = function
        return call
    return wrap(python_callable) if python_callable else wrap

def dag(dag_id=None, **arguments):
    def wrap(function):
        def build(*args, **kwargs):
            declared["dags"].append(dict(arguments, dag_id=dag_id or function.__name__))
            return function(*args, **kwargs)
        return build
    return wrap

class DAG:
    def __init__(self, *args, **kwargs):
        raise AssertionError("this check reads @dag-decorated DAGs")

class Param:
    def __init__(self, default=None, **schema):
        self.value = default
        self.schema = schema

class Variable:
    values = {}

    @staticmethod
    def get(key, default=None, deserialize_json=False):
        if key in Variable.values:
            return Variable.values[key]
        if default is not None:
            return default
        raise KeyError(f"Variable {key} does not exist")

context = {}

def get_current_context():
    return context

exceptions = {"AirflowException": AirflowException,
              "AirflowFailException": AirflowFailException,
              "AirflowSkipException": AirflowSkipException}
stand_ins = {
    "airflow": {},
    "airflow.sdk": {"DAG": DAG, "Param": Param, "Variable": Variable, "dag": dag,
                    "get_current_context": get_current_context, "task": task},
    "airflow.sdk.exceptions": exceptions,
    "airflow.exceptions": exceptions,
}
for name in ["airflow"] + sorted(api):
    assert name == "airflow" or sorted(stand_ins[name]) == sorted(api[name]), name
    module = types.ModuleType(name)
    module.__path__ = []
    module.__dict__.update(stand_ins[name])
    sys.modules[name] = module

spec = importlib.util.spec_from_file_location("handoff_dag_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert len(declared["dags"]) == 1, "the file declares one DAG"
the_dag = declared["dags"][0]
params = {k: (v.value if isinstance(v, Param) else v) for k, v in the_dag.get("params", {}).items()}

if mode == "inspect":
    result = {
        "constants": {k: v for k, v in constants.items() if isinstance(v, (list, dict, str, int))},
        "runner": runner.name,
        "runner_decorator": decorator_arguments(runner, "task"),
        "dag": {k: (v if isinstance(v, (str, int, bool, type(None))) else repr(v))
                for k, v in the_dag.items() if k != "params"},
        "params": params,
        "tasks": {name: {k: repr(v) for k, v in t["arguments"].items()} for name, t in declared["tasks"].items()},
        "retries": declared["tasks"][runner.name]["arguments"].get("retries", 0),
        "edges": declared["edges"],
        "decisions": {str(code): module.retry_decision(code) for code in request["codes"]},
    }
else:
    Variable.values = request["variables"]
    os.environ.clear()
    os.environ.update(request["environ"])
    params.update(request["params"])

    class TaskInstance:
        def __init__(self):
            self.xcom = {}

        def xcom_push(self, key, value):
            json.dumps(value)
            self.xcom[key] = value

    ti = TaskInstance()
    context.clear()
    context.update(params=params, ti=ti)
    retries = declared["tasks"][runner.name]["arguments"].get("retries", 0)
    result = {"returned": None, "raised": None, "message": None}
    try:
        result["returned"] = declared["tasks"][runner.name]["function"]()
        result["state"] = "success"
    except AirflowFailException as error:
        result.update(raised=type(error).__name__, message=str(error), state="failed")
    except AirflowSkipException as error:
        result.update(raised=type(error).__name__, message=str(error), state="skipped")
    except Exception as error:
        result.update(raised=type(error).__name__, message=str(error),
                      state="up_for_retry" if retries > 0 else "failed")
    if result["state"] == "success":
        # Airflow pushes the value returned as `return_value` and, when the task has multiple
        # outputs (asked for, or inferred from a Mapping return annotation), each key on its own.
        function = declared["tasks"][runner.name]["function"]
        multiple = declared["tasks"][runner.name]["arguments"].get("multiple_outputs")
        if multiple is None:
            hint = typing.get_type_hints(function).get("return") if "return" in function.__annotations__ else None
            origin = getattr(hint, "__origin__", hint)
            multiple = isinstance(origin, type) and issubclass(origin, collections.abc.Mapping)
        ti.xcom_push("return_value", result["returned"])
        if multiple:
            for key, value in result["returned"].items():
                ti.xcom_push(key, value)
    result["xcom"] = ti.xcom
    if result["state"] == "success":
        for upstream, downstream in declared["edges"]:
            if upstream == runner.name:
                declared["tasks"][downstream]["function"](result["returned"])
with open(request["result"], "w", encoding="utf-8") as file:
    json.dump(result, file)
"#;

fn airflow(mode: &str, request: Value) -> (Value, String) {
    let dag = root().join("flows/airflow/handoff_dag.py");
    let dir = tempfile::tempdir().unwrap();
    let result_file = dir.path().join("result.json");
    let mut request = request;
    request["api"] = serde_json::from_str(AIRFLOW_API).unwrap();
    request["result"] = json!(result_file);
    let output = Command::new("python3")
        .arg("-c")
        .arg(AIRFLOW_HARNESS)
        .arg(&dag)
        .arg(mode)
        .arg(request.to_string())
        .output()
        .expect("python3");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the DAG did not load: {printed}");
    let result = std::fs::read_to_string(&result_file).expect("a result");
    (serde_json::from_str(&result).unwrap(), printed)
}

#[test]
fn airflow_dag_hands_off_and_retries_only_what_a_later_attempt_can_fix() {
    let codes = documented_exit_codes();
    let (dag, _) = airflow("inspect", json!({ "codes": codes }));
    let constants = &dag["constants"];
    assert_eq!(
        constants["HANDOFF_COMMAND"],
        json!(["handoff", "run", "--outputs-file"])
    );
    let declared_retryable: BTreeSet<i64> = constants["RETRYABLE_EXIT_CODES"]
        .as_object()
        .expect("RETRYABLE_EXIT_CODES")
        .keys()
        .map(|k| k.parse().unwrap())
        .collect();
    assert_eq!(
        declared_retryable,
        RETRYABLE.iter().map(|&c| i64::from(c)).collect()
    );
    let uri_variable = constants["URI_VARIABLE"].as_str().expect("URI_VARIABLE");
    // Airflow masks the value of a Variable whose name holds a sensitive word.
    assert!(uri_variable.contains("secret"), "{uri_variable}");
    assert!(dag["retries"].as_u64().unwrap() >= 1, "{dag}");
    assert!(dag["runner_decorator"]["retry_delay"].is_string(), "{dag}");
    assert_eq!(dag["dag"]["max_active_runs"], 1, "one run at a time");
    assert_eq!(dag["dag"]["catchup"], false);
    for (name, default) in [
        ("database", json!("change_demo")),
        ("collection", json!("orders")),
        ("consumer_id", json!("orders-to-outbox")),
        ("checkpoint_collection", json!("kestra_change_checkpoints")),
        ("outbox_collection", json!("kestra_change_outbox")),
        ("max_events", json!(50)),
        ("max_wait_seconds", json!(10)),
    ] {
        assert_eq!(dag["params"][name], default, "{name}");
    }
    // The DAG's own decision function, for every documented exit code.
    for code in &codes {
        let expected = match *code {
            0 => "success",
            c if retryable(c) => "retry",
            _ => "fail",
        };
        assert_eq!(
            dag["decisions"][code.to_string()],
            expected,
            "exit code {code}"
        );
    }
    let runner = dag["runner"].as_str().unwrap();
    assert!(
        dag["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e[0] == runner),
        "a downstream task reads the returned outputs: {dag}"
    );

    let live = Live::start();
    let uri = live.uri();
    let run = |params: Value, path: String| {
        let (result, printed) = airflow(
            "run",
            json!({
                "variables": {(uri_variable): uri},
                "environ": {
                    "PATH": path,
                    "HANDOFF_CACHE_DIR": support::cache_dir(),
                },
                "params": params,
            }),
        );
        assert!(!printed.contains(&uri), "the URI was printed: {printed}");
        (result, printed)
    };
    let params = json!({"database": live.db, "max_wait_seconds": 1});
    let success = |status: &str, events: usize| {
        let (result, printed) = run(params.clone(), path_with(&handoff_dir()));
        assert_eq!(result["state"], "success", "{result} {printed}");
        // Returned (XCom return_value, and each key on its own: a dict return annotation) and
        // pushed as XCom `outputs`: the same dict.
        assert_eq!(result["xcom"]["return_value"], result["returned"]);
        assert_eq!(result["xcom"]["outputs"], result["returned"]);
        assert_eq!(result["xcom"]["status"], status);
        check_success(&as_strings(&result["returned"]), status, events, "airflow");
    };
    success("IDLE", 0);
    insert_two_orders(&live);
    success("HANDED_OFF", 2);
    assert_eq!(live.outbox_len(), 2);

    // A failing run: failed at once (no retry), its outputs pushed to XCom.
    let mut bad = params.clone();
    bad["max_events"] = json!(0);
    let (result, printed) = run(bad, path_with(&handoff_dir()));
    assert_eq!(result["state"], "failed", "{result} {printed}");
    assert_eq!(result["raised"], "AirflowFailException");
    let outputs = &result["xcom"]["outputs"];
    assert_eq!(outputs["status"], "FAILED");
    assert_eq!(outputs["error_class"], "bad_input");
    assert_eq!(outputs["exit_code"], 2);
    assert!(
        result["message"].as_str().unwrap().contains("bad_input"),
        "{result}"
    );

    // Every documented exit code, with a stand-in handoff: the state Airflow gives the try.
    let stand_ins = tempfile::tempdir().unwrap();
    for &code in &codes {
        let dir = stand_ins.path().join(code.to_string());
        let calls = fake_handoff(&dir, code);
        let (result, printed) = run(params.clone(), path_with(&dir));
        let expected = match code {
            0 => "success",
            c if retryable(c) => "up_for_retry",
            _ => "failed",
        };
        assert_eq!(
            result["state"], expected,
            "exit code {code}: {result} {printed}"
        );
        assert_eq!(count_calls(&calls), 1);
        let outputs = &result["xcom"]["outputs"];
        let status = if code == 0 || code == 12 {
            "IDLE"
        } else {
            "FAILED"
        };
        assert_eq!(outputs["status"], status, "exit code {code}: {result}");
        if code != 0 && code != 12 {
            assert_eq!(outputs["exit_code"], code, "{result}");
        }
    }
}
