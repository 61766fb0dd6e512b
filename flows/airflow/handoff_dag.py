"""Hands MongoDB change-stream events to the outbox with `handoff run`, one bounded run per DAG run.

Deploy: copy this file to the DAGs folder, install `handoff` on the workers' PATH, set the Airflow
Variable `handoff_mongodb_uri_secret` (or the same key in a secrets backend) and unpause the DAG.
See flows/README.md.

The task's outputs are the run's outputs file as a dict: returned when the run succeeds (XCom
`return_value`, and each key as an XCom of its own), and pushed as XCom `outputs` on success and on
failure (status FAILED, error_class, exit_code, guidance and what was committed).

Every try's report (try number, exit code, outputs) is kept in the task's state store (Airflow 3.3
and later; a Variable named after the DAG run before 3.3), so a retried task still reports what its
earlier tries committed: the list is pushed as XCom `tries` by every try, and the dict returned
adds `tries` and `events_handed_off_all_tries`.

Logs: `handoff` writes JSON log lines (`HANDOFF_LOG_FORMAT=json`) and the task logs each one at its
own level, so a routine run logs INFO lines only; the failure's final `error[class]: ...` line is
logged as an error.

Exit codes (README): 3 conflict, 10 unavailable and 12 stopped by a signal are retried with the
task's retries; every other failure (2 bad input, 6 history lost, ...) raises AirflowFailException,
which fails the task without retrying.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import tempfile
import threading
from datetime import datetime, timedelta, timezone

from airflow.sdk import Param, Variable, dag, get_current_context, task

try:  # Airflow 3.2 and later
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
except ImportError:  # Airflow 3.0 and 3.1
    from airflow.exceptions import AirflowException, AirflowFailException

# The exit codes worth another attempt: the checkpoint moved under the run or another run holds
# the state (3), the deployment was unreachable (10), a signal stopped the run after its last
# commit (12). Nothing else gets better by running again.
RETRYABLE_EXIT_CODES = {3: "conflict", 10: "unavailable", 12: "stopped by a signal"}

HANDOFF_COMMAND = ["handoff", "run", "--outputs-file"]

# The Variable holding the replica set's URI. Its name contains "secret", so Airflow masks its value
# in task logs and hides it in the UI.
URI_VARIABLE = "handoff_mongodb_uri_secret"

# Where each try's report is kept until the next try: the key in the task's state store (Airflow 3.3
# and later), or the prefix of a Variable named after the DAG run (before 3.3).
TRIES_KEY = "handoff_tries"

log = logging.getLogger("airflow.task")

# handoff's JSON log levels (tracing's names) as the logging module's.
LOG_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
}


def retry_decision(exit_code: int) -> str:
    """What Airflow should do after `handoff run` exited with `exit_code`: `success`, `retry`
    (raise an ordinary exception: the task's retries apply) or `fail` (AirflowFailException: the
    task fails now, whatever retries are left)."""
    if exit_code == 0:
        return "success"
    if exit_code in RETRYABLE_EXIT_CODES:
        return "retry"
    return "fail"


def log_line(line: str) -> None:
    """Logs one line `handoff` printed, at its own level. A JSON log line (`HANDOFF_LOG_FORMAT=json`)
    keeps its level and fields; the task protocol lines on stdout (the outputs and metrics, already
    in the outputs file) are debug; anything else is the failure's final `error[class]: ...` line on
    stderr, or a crash, and is an error."""
    line = line.rstrip("\n")
    if not line:
        return
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if isinstance(record, dict) and record.get("level") in LOG_LEVELS:
        fields = dict(record.get("fields") or {})
        message = str(fields.pop("message", ""))
        details = " ".join(f"{key}={value}" for key, value in fields.items())
        log.log(LOG_LEVELS[record["level"]], "%s", f"{message} {details}".strip())
    elif line.startswith("::{") and line.endswith("}::"):
        log.debug("%s", line)
    else:
        log.error("%s", line)


def run_handoff(arguments: list, env: dict) -> tuple:
    """Runs `handoff` with its log lines logged at their own levels. Returns its exit code and, if
    the task was stopped meanwhile (its execution_timeout expired), the exception that
    stopped it: handoff then got SIGTERM, finished its in-flight commit and wrote its outputs."""
    process = subprocess.Popen(
        arguments,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    readers = [
        threading.Thread(target=lambda stream=stream: [log_line(line) for line in stream], daemon=True)
        for stream in (process.stdout, process.stderr)
    ]
    for reader in readers:
        reader.start()
    try:
        return process.wait(), None
    except BaseException as stopped:
        process.send_signal(signal.SIGTERM)
        return process.wait(), stopped
    finally:
        for reader in readers:
            reader.join()


def tries_variable(ti) -> str:
    """The Variable that carries the reports between tries before Airflow 3.3."""
    name = f"{TRIES_KEY}__{ti.dag_id}__{ti.task_id}__{ti.run_id}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:250]


def record_try(context: dict, report: dict, final: bool) -> list:
    """Adds this try's report to the earlier tries' and returns them all, oldest first."""
    store = context.get("task_state_store")
    if store is not None:
        tries = list(store.get(TRIES_KEY, default=None) or [])
        tries.append(report)
        store.set(TRIES_KEY, tries)
        return tries
    key = tries_variable(context["ti"])
    tries = list(Variable.get(key, default=None, deserialize_json=True) or [])
    tries.append(report)
    if final:
        Variable.delete(key)  # the last try: its XComs keep the list
    else:
        Variable.set(key, tries, serialize_json=True)
    return tries


def read_outputs(path: str, exit_code: int) -> dict:
    """The run's outputs file; a run that ended without writing it (killed by a second signal)
    reports only its exit code."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        return {"status": "FAILED", "exit_code": exit_code}


@dag(
    dag_id="handoff",
    schedule="*/5 * * * *",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["handoff", "mongodb"],
    params={
        "database": Param("change_demo", type="string"),
        "collection": Param("orders", type="string"),
        "consumer_id": Param("orders-to-outbox", type="string"),
        "checkpoint_collection": Param("kestra_change_checkpoints", type="string"),
        "outbox_collection": Param("kestra_change_outbox", type="string"),
        "max_events": Param(50, type="integer"),
        "max_wait_seconds": Param(10, type="integer"),
    },
)
def handoff():
    @task(
        retries=3,
        retry_delay=timedelta(seconds=10),
        retry_exponential_backoff=2.0,
        max_retry_delay=timedelta(minutes=5),
        execution_timeout=timedelta(minutes=15),
    )
    def hand_off() -> dict:
        context = get_current_context()
        params = context["params"]
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "MONGODB_URI": Variable.get(URI_VARIABLE),
            "SOURCE_DATABASE": str(params["database"]),
            "SOURCE_COLLECTION": str(params["collection"]),
            "CONSUMER_ID": str(params["consumer_id"]),
            "CHECKPOINT_COLLECTION": str(params["checkpoint_collection"]),
            "OUTBOX_COLLECTION": str(params["outbox_collection"]),
            "MAX_EVENTS": str(params["max_events"]),
            "MAX_WAIT_SECONDS": str(params["max_wait_seconds"]),
            "HANDOFF_LOG": "info",
            "HANDOFF_LOG_FORMAT": "json",
        }
        for name in ("HOME", "XDG_CACHE_HOME", "HANDOFF_CACHE_DIR", "HANDOFF_POLICY"):
            if name in os.environ:
                env[name] = os.environ[name]
        with tempfile.TemporaryDirectory(prefix="handoff-") as workdir:
            outputs_file = os.path.join(workdir, "outputs.json")
            # The URI is passed in the environment only and handoff never prints it.
            exit_code, stopped = run_handoff(HANDOFF_COMMAND + [outputs_file], env)
            outputs = read_outputs(outputs_file, exit_code)
        ti = context["ti"]
        decision = retry_decision(exit_code)
        # The last try: it succeeded, it failed for good, or it used the last retry.
        final = (decision != "retry" and stopped is None) or ti.try_number > ti.max_tries
        tries = record_try(
            context, {"try_number": ti.try_number, "exit_code": exit_code, "outputs": outputs}, final
        )
        ti.xcom_push(key="outputs", value=outputs)
        ti.xcom_push(key="tries", value=tries)
        if stopped is not None:
            raise stopped
        if decision == "success":
            return dict(
                outputs,
                tries=tries,
                events_handed_off_all_tries=sum(
                    t["outputs"].get("events_handed_off", 0) for t in tries
                ),
            )
        summary = (
            f"handoff exited {exit_code} ({outputs.get('error_class', 'no outputs')}) after "
            f"{outputs.get('events_handed_off', 0)} event(s) handed off: {outputs.get('guidance', '')}"
        )
        if decision == "retry":
            raise AirflowException(summary)
        raise AirflowFailException(summary)

    @task
    def report(outputs: dict) -> None:
        print(
            f"{outputs['events_handed_off']} event(s) handed off; status {outputs['status']}; "
            f"last event {outputs['last_event_id'] or 'none'}; policy {outputs['policy_sha256']}; "
            f"{outputs['events_handed_off_all_tries']} in all over {len(outputs['tries'])} tries."
        )
        if outputs["status"] == "INVALIDATED":
            print(
                "The watched collection was invalidated (dropped or renamed); the consumer saved its "
                "invalidate token and the next run starts after it."
            )

    report(hand_off())


handoff()
