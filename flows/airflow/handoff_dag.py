"""Hands MongoDB change-stream events to the outbox with `handoff run`, one bounded run per DAG run.

Deploy: copy this file to the DAGs folder, install `handoff` on the workers' PATH, set the Airflow
Variable `handoff_mongodb_uri_secret` (or the same key in a secrets backend) and unpause the DAG.
See flows/README.md.

The task's outputs are the run's outputs file as a dict: returned when the run succeeds (XCom
`return_value`, and each key as an XCom of its own), and pushed as XCom `outputs` on success and on
failure (status FAILED, error_class, exit_code, guidance and what was committed).

Exit codes (README): 3 conflict, 10 unavailable and 12 stopped by a signal are retried with the
task's retries; every other failure (2 bad input, 6 history lost, ...) raises AirflowFailException,
which fails the task without retrying.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
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


def retry_decision(exit_code: int) -> str:
    """What Airflow should do after `handoff run` exited with `exit_code`: `success`, `retry`
    (raise an ordinary exception: the task's retries apply) or `fail` (AirflowFailException: the
    task fails now, whatever retries are left)."""
    if exit_code == 0:
        return "success"
    if exit_code in RETRYABLE_EXIT_CODES:
        return "retry"
    return "fail"


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
        }
        for name in ("HOME", "XDG_CACHE_HOME", "HANDOFF_CACHE_DIR", "HANDOFF_POLICY"):
            if name in os.environ:
                env[name] = os.environ[name]
        with tempfile.TemporaryDirectory(prefix="handoff-") as workdir:
            outputs_file = os.path.join(workdir, "outputs.json")
            # stdout (the outputs as protocol lines) and stderr (logs) go to the task log; the URI
            # is passed in the environment only and handoff never prints it.
            exit_code = subprocess.run(HANDOFF_COMMAND + [outputs_file], env=env, check=False).returncode
            outputs = read_outputs(outputs_file, exit_code)
        context["ti"].xcom_push(key="outputs", value=outputs)
        decision = retry_decision(exit_code)
        if decision == "success":
            return outputs
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
            f"last event {outputs['last_event_id'] or 'none'}; policy {outputs['policy_sha256']}."
        )
        if outputs["status"] == "INVALIDATED":
            print(
                "The watched collection was invalidated (dropped or renamed); the consumer saved its "
                "invalidate token and the next run starts after it."
            )

    report(hand_off())


handoff()
