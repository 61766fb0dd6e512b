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
/// in `context["ti"]` with its try number, Variables from the request, the task state store of
/// Airflow 3.3 unless `state_store` is false) and reports what Airflow would make of it: the
/// value returned (XCom `return_value`), the XComs pushed, the exception raised and the state —
/// success; failed for AirflowFailException (whatever retries are left); skipped for
/// AirflowSkipException; up_for_retry for any other exception while retries are left — and the
/// task log (`log`: the task's log records at their levels, what reached the task's stdout at INFO
/// and its stderr at ERROR, as Airflow 3 logs them). A try left up_for_retry is followed by the
/// next, up to `tries`, each starting with no XComs (`tries` lists them all; the result is the
/// last one's). `timeout_seconds` stands for the task's execution_timeout: Airflow raises
/// AirflowTaskTimeout in the task when it expires (a try left up_for_retry). After a success the
/// downstream task runs on the returned value.
const AIRFLOW_HARNESS: &str = r#"
import ast, collections.abc, importlib.util, json, logging, os, signal, sys, tempfile, types, typing

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

class AirflowTaskTimeout(BaseException):
    """What Airflow's execution_timeout raises in the task (from SIGALRM)."""

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

NOTSET = object()

class Variable:
    values = {}

    @staticmethod
    def get(key, default=NOTSET, deserialize_json=False):
        if key in Variable.values:
            value = Variable.values[key]
            return json.loads(value) if deserialize_json else value
        if default is not NOTSET:
            return default
        raise KeyError(f"Variable {key} does not exist")

    @staticmethod
    def set(key, value, description=None, serialize_json=False):
        Variable.values[key] = json.dumps(value) if serialize_json else str(value)

    @staticmethod
    def delete(key):
        Variable.values.pop(key, None)

class TaskStateStore:
    """context["task_state_store"] (Airflow 3.3 and later): JSON values kept across the tries of a
    task instance."""
    def __init__(self):
        self.values = {}

    def get(self, key, default=None):
        return json.loads(self.values[key]) if key in self.values else default

    def set(self, key, value, *, retention=None):
        if value is None:
            raise ValueError("Cannot set value as None")
        self.values[key] = json.dumps(value)

    def delete(self, key):
        self.values.pop(key, None)

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
    Variable.values = dict(request["variables"])
    os.environ.clear()
    os.environ.update(request["environ"])
    params.update(request["params"])
    retries = declared["tasks"][runner.name]["arguments"].get("retries", 0)
    store = TaskStateStore() if request.get("state_store", True) else None

    class TaskInstance:
        dag_id = the_dag["dag_id"]
        task_id = runner.name
        run_id = "manual__2026-01-01T00:05:00+00:00"
        max_tries = retries

        def __init__(self, try_number):
            self.try_number = try_number
            self.xcom = {}

        def xcom_push(self, key, value):
            json.dumps(value)
            self.xcom[key] = value

    class Records(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.records = []

        def emit(self, record):
            self.records.append([record.levelname, record.name, record.getMessage()])

    # The task log as Airflow 3 writes it: the task's log records at their levels, and whatever
    # reaches the task process's file descriptors (its own and its children's): stdout at INFO,
    # stderr at ERROR. The logging level is Airflow's default, INFO.
    root = logging.getLogger()
    root.setLevel(logging.INFO)

    def run_try(try_number):
        ti = TaskInstance(try_number)
        context.clear()
        context.update(params=params, ti=ti)
        if store is not None:
            context["task_state_store"] = store
        records = Records()
        root.addHandler(records)
        captured = {}
        saved = {}
        for fd in (1, 2):
            sys.stdout.flush(); sys.stderr.flush()
            captured[fd] = tempfile.TemporaryFile()
            saved[fd] = os.dup(fd)
            os.dup2(captured[fd].fileno(), fd)
        result = {"try_number": try_number, "returned": None, "raised": None, "message": None}
        def time_out(signum, frame):
            raise AirflowTaskTimeout("Timeout")
        signal.signal(signal.SIGALRM, time_out)
        signal.setitimer(signal.ITIMER_REAL, request.get("timeout_seconds", 0))
        try:
            result["returned"] = declared["tasks"][runner.name]["function"]()
            result["state"] = "success"
        except AirflowTaskTimeout as error:
            result.update(raised=type(error).__name__, message=str(error),
                          state="up_for_retry" if try_number <= retries else "failed")
        except AirflowFailException as error:
            result.update(raised=type(error).__name__, message=str(error), state="failed")
        except AirflowSkipException as error:
            result.update(raised=type(error).__name__, message=str(error), state="skipped")
        except Exception as error:
            result.update(raised=type(error).__name__, message=str(error),
                          state="up_for_retry" if try_number <= retries else "failed")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout.flush(); sys.stderr.flush()
            for fd in (1, 2):
                os.dup2(saved[fd], fd)
                os.close(saved[fd])
            root.removeHandler(records)
        log = list(records.records)
        for fd, level, name in ((1, "INFO", "task.stdout"), (2, "ERROR", "task.stderr")):
            captured[fd].seek(0)
            for line in captured[fd].read().decode("utf-8", "replace").splitlines():
                log.append([level, name, line])
        result["log"] = log
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
        # A new try starts with no XComs (Airflow clears the task instance's XComs when it starts
        # running), so only the last try's are kept.
        result["xcom"] = ti.xcom
        return result

    # Tries as Airflow runs them: a try left up_for_retry is followed by the next one, up to
    # `tries` in this check (Variables and the task state store are kept across them).
    tries = []
    while True:
        tries.append(run_try(len(tries) + 1))
        if tries[-1]["state"] != "up_for_retry" or len(tries) >= request.get("tries", 1):
            break
    result = dict(tries[-1], tries=tries, variables=sorted(Variable.values))
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
    let run_tries = |params: Value, path: String, tries: usize, state_store: bool| {
        let (result, printed) = airflow(
            "run",
            json!({
                "variables": {(uri_variable): uri},
                "environ": {
                    "PATH": path,
                    "HANDOFF_CACHE_DIR": support::cache_dir(),
                },
                "params": params,
                "tries": tries,
                "state_store": state_store,
            }),
        );
        assert!(!printed.contains(&uri), "the URI was printed: {printed}");
        assert!(
            !result.to_string().contains(&uri),
            "the URI was logged: {result}"
        );
        (result, printed)
    };
    let run = |params: Value, path: String| run_tries(params, path, 1, true);
    let params = json!({"database": live.db, "max_wait_seconds": 1});
    let logged = |result: &Value, level: &str| -> Vec<String> {
        result["log"]
            .as_array()
            .expect("the task log")
            .iter()
            .filter(|entry| entry[0] == level)
            .map(|entry| entry[2].as_str().unwrap().to_string())
            .collect()
    };
    let success = |status: &str, events: usize| {
        let (result, printed) = run(params.clone(), path_with(&handoff_dir()));
        assert_eq!(result["state"], "success", "{result} {printed}");
        // Returned (XCom return_value, and each key on its own: a dict return annotation): the
        // outputs, with every try's report; the outputs alone pushed as XCom `outputs`.
        let returned = &result["returned"];
        assert_eq!(result["xcom"]["return_value"], *returned);
        let mut outputs = returned.clone();
        let object = outputs.as_object_mut().unwrap();
        let tries = object.remove("tries").expect("every try's report");
        let all = object
            .remove("events_handed_off_all_tries")
            .expect("what every try handed off");
        assert_eq!(result["xcom"]["outputs"], outputs);
        assert_eq!(result["xcom"]["status"], status);
        assert_eq!(
            tries,
            json!([{"try_number": 1, "exit_code": 0, "outputs": outputs}])
        );
        assert_eq!(result["xcom"]["tries"], tries);
        assert_eq!(all, events);
        check_success(&as_strings(&outputs), status, events, "airflow");
        // Routine logs keep their level: a successful run logs no error.
        assert_eq!(logged(&result, "ERROR"), Vec::<String>::new(), "{result}");
        let info = logged(&result, "INFO");
        assert!(
            info.iter().any(|line| line.starts_with("run finished")
                && line.contains(&format!("status={status}"))),
            "{info:?}"
        );
    };
    success("IDLE", 0);
    insert_two_orders(&live);
    success("HANDED_OFF", 2);
    assert_eq!(live.outbox_len(), 2);

    // A failing run: failed at once (no retry), its outputs pushed to XCom, the failure's line
    // the one error handoff logged.
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
    let errors = logged(&result, "ERROR");
    assert_eq!(errors.len(), 1, "{result}");
    assert!(errors[0].starts_with("error[bad_input]"), "{errors:?}");

    // The task's execution_timeout expires while handoff waits: handoff gets SIGTERM, stops after
    // its in-flight commit, and the try still reports what it committed.
    let mut waiting = params.clone();
    waiting["max_wait_seconds"] = json!(30);
    let started = std::time::Instant::now();
    let (result, printed) = airflow(
        "run",
        json!({
            "variables": {(uri_variable): uri},
            "environ": {
                "PATH": path_with(&handoff_dir()),
                "HANDOFF_CACHE_DIR": support::cache_dir(),
            },
            "params": waiting,
            "timeout_seconds": 3,
        }),
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "handoff ran on after the timeout: {printed}"
    );
    assert_eq!(result["state"], "up_for_retry", "{result} {printed}");
    assert_eq!(result["raised"], "AirflowTaskTimeout");
    assert_eq!(result["xcom"]["outputs"]["stopped"], true, "{result}");
    let reports = result["xcom"]["tries"].as_array().expect("XCom tries");
    assert_eq!(reports.len(), 1, "{result}");
    assert_eq!(reports[0]["exit_code"], 12, "{result}");

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

    // Retried tries: each try starts with no XComs, yet the last one reports what every try
    // committed, whether the task ends in a success or in a failure, with the task state store
    // (Airflow 3.3) or without (a Variable of the DAG run, removed by the last try).
    let max_tries = dag["retries"].as_u64().unwrap() as usize + 1;
    for state_store in [true, false] {
        let what = format!("state store: {state_store}");
        let dir = stand_ins.path().join(format!("retried-{state_store}"));
        let calls = scripted_handoff(&dir, &[(10, 3), (12, 1), (0, 2)]);
        let (result, printed) = run_tries(params.clone(), path_with(&dir), max_tries, state_store);
        assert_eq!(count_calls(&calls), 3, "{what}: {printed}");
        assert_eq!(result["state"], "success", "{what}: {result}");
        let states: Vec<&Value> = result["tries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["state"])
            .collect();
        assert_eq!(
            states,
            [
                &json!("up_for_retry"),
                &json!("up_for_retry"),
                &json!("success")
            ]
        );
        let returned = &result["returned"];
        let reports = returned["tries"].as_array().expect("every try's report");
        let summary: Vec<(u64, i64, u64)> = reports
            .iter()
            .map(|t| {
                (
                    t["try_number"].as_u64().unwrap(),
                    t["exit_code"].as_i64().unwrap(),
                    t["outputs"]["events_handed_off"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(summary, [(1, 10, 3), (2, 12, 1), (3, 0, 2)], "{what}");
        assert_eq!(returned["events_handed_off_all_tries"], 6, "{what}");
        assert_eq!(
            returned["events_handed_off"], 2,
            "{what}: the last try's own"
        );
        assert_eq!(result["xcom"]["tries"], returned["tries"], "{what}");
        assert_eq!(reports[0]["outputs"]["error_class"], "stand_in", "{what}");
        assert_eq!(reports[1]["outputs"]["stopped"], true, "{what}");
        // Nothing left behind in the Variables but the URI's.
        assert_eq!(result["variables"], json!([uri_variable]), "{what}");

        // A try that committed and failed, then a permanent failure: the failed task's XComs
        // still report the first try's commits.
        let dir = stand_ins.path().join(format!("failed-{state_store}"));
        let calls = scripted_handoff(&dir, &[(3, 4), (6, 0)]);
        let (result, printed) = run_tries(params.clone(), path_with(&dir), max_tries, state_store);
        assert_eq!(count_calls(&calls), 2, "{what}: {printed}");
        assert_eq!(result["state"], "failed", "{what}: {result}");
        let reports = result["xcom"]["tries"].as_array().expect("XCom tries");
        assert_eq!(reports.len(), 2, "{what}: {result}");
        assert_eq!(reports[0]["outputs"]["events_handed_off"], 4, "{what}");
        assert_eq!(reports[0]["exit_code"], 3, "{what}");
        assert_eq!(reports[1]["exit_code"], 6, "{what}");
        assert_eq!(result["xcom"]["outputs"], reports[1]["outputs"], "{what}");
        assert_eq!(result["variables"], json!([uri_variable]), "{what}");

        // Every retry used: the last try's XComs report them all.
        let dir = stand_ins.path().join(format!("exhausted-{state_store}"));
        let calls = scripted_handoff(&dir, &[(10, 1)]);
        let (result, printed) = run_tries(params.clone(), path_with(&dir), max_tries, state_store);
        assert_eq!(count_calls(&calls), max_tries, "{what}: {printed}");
        assert_eq!(result["state"], "failed", "{what}: {result}");
        let reports = result["xcom"]["tries"].as_array().expect("XCom tries");
        assert_eq!(reports.len(), max_tries, "{what}: {result}");
        assert_eq!(result["variables"], json!([uri_variable]), "{what}");
    }
}
