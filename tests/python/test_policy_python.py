"""Python policies end to end: the default policy written in Python (guest/python/default on the
SDK guest/python/handoff_policy.py) built with componentize-py passes the default's cases and
replays like the Rust default; `policy new --lang python` → `policy build` → `policy check` →
`policy test` works as generated, and an edited `decide` changes the results; `backfill` and
`reconcile --repair` hand their documents to the same `decide` as snapshot events.

componentize-py is the pinned one tests/run installs into this virtual environment
(tests/python/requirements-componentize-py.txt); it missing is a failure, not a skip.
"""

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from bson import json_util

from handoff_cli import HANDOFF_BIN, WORKSPACE

PIN = next(
    line.split("==")[1].strip()
    for line in (WORKSPACE / "tests/python/requirements-componentize-py.txt").read_text().splitlines()
    if line.startswith("componentize-py==")
)
COMPONENTIZE_PY = Path(sys.executable).parent / "componentize-py"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of every handoff subprocess: the pinned componentize-py, and an artifact
    cache of this module's own (each component is compiled once)."""
    if not HANDOFF_BIN.exists():
        raise RuntimeError(f"handoff binary not found at {HANDOFF_BIN}; run `cargo build -p handoff`")
    if not COMPONENTIZE_PY.exists():
        raise RuntimeError(
            f"{COMPONENTIZE_PY} is missing: install it with "
            f"`{Path(sys.executable).parent / 'pip'} install -r tests/python/requirements-componentize-py.txt`"
        )
    cache = tmp_path_factory.mktemp("cache")
    os.chmod(cache, 0o700)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    environment.update(
        {
            "HANDOFF_COMPONENTIZE_PY": str(COMPONENTIZE_PY),
            "HANDOFF_CACHE_DIR": str(cache),
            "PATH": f"{COMPONENTIZE_PY.parent}{os.pathsep}{environment.get('PATH', '')}",
        }
    )
    return environment


def handoff(env, *args, cwd=WORKSPACE, timeout=900):
    return subprocess.run(
        [str(HANDOFF_BIN), *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def precompiled(env, wasm):
    """Compiles the component into the module's artifact cache, outside the watchdog that bounds
    each run (a Python component carries an interpreter: compiling it under a debug host is
    slow), and returns it."""
    proc = handoff(env, "policy", "precompile", wasm)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return wasm


def outputs_of(proc):
    for line in proc.stdout.splitlines():
        if line.startswith("::") and line.endswith("::"):
            value = json.loads(line[2:-2])
            if "outputs" in value:
                return value["outputs"]
    raise AssertionError(f"no outputs line:\n{proc.stdout}\n{proc.stderr}")


def componentized(env, decisions, wasm):
    """The policy module in the folder `decisions` on the SDK, built with componentize-py's default
    options and compiled into the module's artifact cache."""
    proc = subprocess.run(
        [
            str(COMPONENTIZE_PY),
            "-d", "wit", "-w", "handoff-policy",
            "componentize", "handoff_policy",
            "-p", str(decisions), "-p", "guest/python",
            "-o", str(wasm),
        ],
        cwd=WORKSPACE, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return precompiled(env, wasm)


@pytest.fixture(scope="module")
def python_default(env, tmp_path_factory):
    """guest/python/default built with componentize-py's default options."""
    return componentized(env, "guest/python/default", tmp_path_factory.mktemp("default") / "default.wasm")


def test_the_pinned_componentize_py_is_installed():
    proc = subprocess.run([str(COMPONENTIZE_PY), "--version"], capture_output=True, text=True)
    assert proc.stdout.split() == ["componentize-py", PIN]
    pyproject = (WORKSPACE / "guest/python/default/pyproject.toml").read_text()
    assert f'componentize-py = "{PIN}"' in pyproject


def test_the_python_default_passes_the_defaults_cases(env, python_default):
    check = handoff(env, "policy", "check", python_default)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "verdict:   this host runs it" in check.stdout
    proc = handoff(env, "policy", "test", "--policy", python_default, "guest/default/cases")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = sorted(p.name for p in (WORKSPACE / "guest/default/cases").iterdir() if (p / "case.json").is_file())
    for case in cases:
        assert any(line.split()[:2] == ["ok", case] for line in proc.stdout.splitlines()), proc.stdout


def test_the_python_default_replays_like_the_rust_default(env, python_default, tmp_path):
    def replay(state, *policy):
        proc = handoff(env, "replay", "tests/fixtures/demo.jsonl", "--state", tmp_path / state, "--max-wait-seconds", "1", *policy)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        inspected = handoff(env, "inspect", "--state", tmp_path / state)
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
        documents = [json.loads(line) for line in inspected.stdout.splitlines() if line.strip()]
        # The checkpoint's last owner names the process that held the lease, and its policy
        # the component that decided.
        for document in documents:
            document.pop("owner", None)
            document.pop("policy", None)
        return outputs_of(proc), documents

    rust_outputs, rust_state = replay("rust.redb")
    python_outputs, python_state = replay("python.redb", "--policy", python_default)
    assert python_outputs.pop("policy_sha256") != rust_outputs.pop("policy_sha256")
    assert python_outputs == rust_outputs
    assert python_outputs["events_handed_off"] > 0
    assert len(python_state) > 1
    assert python_state == rust_state


def test_a_new_python_project_builds_checks_and_passes_its_cases(env, tmp_path):
    created = handoff(env, "policy", "new", "shop", "--lang", "python", "--dir", tmp_path)
    assert created.returncode == 0, created.stdout + created.stderr
    project = tmp_path / "shop"
    for name in ("policy.py", "handoff_policy.py", "test_policy.py", "pyproject.toml", "README.md", "wit/policy.wit"):
        assert (project / name).is_file(), name
    assert (project / "handoff_policy.py").read_text() == (WORKSPACE / "guest/python/handoff_policy.py").read_text()
    assert (project / "wit/policy.wit").read_text() == (WORKSPACE / "wit/policy.wit").read_text()
    assert f'componentize-py = "{PIN}"' in (project / "pyproject.toml").read_text()
    assert (project / "cases/sample/case.json").is_file()

    # Its unit tests, with plain CPython.
    unit = subprocess.run([sys.executable, "-m", "unittest", "-q"], cwd=project, capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr

    built = handoff(env, "policy", "build", project)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "verdict:   this host runs it" in built.stdout
    wasm = precompiled(env, project / "build/policy.wasm")
    check = handoff(env, "policy", "check", wasm)
    assert check.returncode == 0 and "verdict:   this host runs it" in check.stdout, check.stdout + check.stderr
    tested = handoff(env, "policy", "test", "--policy", wasm, project / "cases")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert any(line.split()[:2] == ["ok", "sample"] for line in tested.stdout.splitlines()), tested.stdout

    # An edited decide: deletes are skipped. The sample (recorded with the default) now differs.
    policy = project / "policy.py"
    policy.write_text(
        policy.read_text().replace(
            "    return handoff.hand_off(event.id)\n",
            '    if event.operation_type == "delete":\n'
            '        return handoff.skip("deletes are not published")\n'
            "    return handoff.hand_off(event.id)\n",
        )
    )
    assert "deletes are not published" in policy.read_text()
    rebuilt = handoff(env, "policy", "build", project)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    precompiled(env, wasm)
    failed = handoff(env, "policy", "test", "--policy", wasm, project / "cases")
    assert failed.returncode != 0, failed.stdout
    assert "sample" in failed.stdout + failed.stderr, failed.stdout
    # Accepting the new results records the skip; the edited policy then passes.
    updated = handoff(env, "policy", "test", "--policy", wasm, project / "cases", "--update", "--yes")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    case = json.loads((project / "cases/sample/case.json").read_text())
    assert case["expect"][0]["events_skipped"] == 1, case
    passed = handoff(env, "policy", "test", "--policy", wasm, project / "cases")
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_building_without_the_pinned_componentize_py_says_what_to_install(env, tmp_path):
    created = handoff(env, "policy", "new", "pinned", "--lang", "python", "--dir", tmp_path)
    assert created.returncode == 0, created.stdout + created.stderr
    project = tmp_path / "pinned"

    missing = handoff({**env, "HANDOFF_COMPONENTIZE_PY": str(tmp_path / "no-such-tool")}, "policy", "build", project)
    assert missing.returncode != 0
    assert f"pip install componentize-py=={PIN}" in missing.stderr, missing.stderr

    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'componentize-py = "{PIN}"', 'componentize-py = "0.0.1"'))
    other = handoff(env, "policy", "build", project)
    assert other.returncode != 0
    assert f"componentize-py {PIN}" in other.stderr and "pins 0.0.1" in other.stderr, other.stderr
    assert not (project / "build/policy.wasm").exists()


SNAPSHOT_DECISIONS = """\
import handoff_policy as handoff


def decide(event):
    if event.operation_type != "snapshot":
        return handoff.hand_off(event.id)
    document = event.value("fullDocument")
    if document is None:
        key = event.field("documentKey._id")
        return handoff.record(event.id, "OrderRemoved", 1, key, {"run": handoff.run_kind()})
    if "card" in document:
        return handoff.quarantine(event.id, "a card number")
    if document.get("status") == "draft":
        return handoff.skip("drafts are not published")
    return handoff.hand_off(event.id)
"""


def test_backfill_and_repair_documents_reach_the_python_decide_as_snapshot_events(env, sim, tmp_path):
    decisions = tmp_path / "decisions"
    decisions.mkdir()
    (decisions / "policy.py").write_text(SNAPSHOT_DECISIONS)
    wasm = componentized(env, decisions, tmp_path / "snapshots.wasm")
    database = "snapshots_" + uuid.uuid4().hex[:8]
    client = sim.client()
    db = client[database]
    db.orders.insert_many(
        [{"_id": 1, "total": 10}, {"_id": 2, "status": "draft"}, {"_id": 3, "card": "4111111111111111"}]
    )
    deployment = {**env, "MONGODB_URI": sim.uri, "SOURCE_DATABASE": database}

    backfill = handoff(deployment, "backfill", "--policy", wasm, "--reason", "initial load", "--json")
    assert backfill.returncode == 0, backfill.stdout + backfill.stderr
    done = json.loads(backfill.stdout)["this_run"]
    assert (done["handed_off"], done["skipped"], done["quarantined"]) == (1, 1, 1), done
    [record] = db.kestra_change_outbox.find()
    assert (record["event"]["operationType"], record["event"]["documentKey"]) == ("snapshot", {"_id": 1})
    # The policy's ID is the baseline's: the SHA-256 of the snapshot token's canonical text.
    token_text = json_util.dumps(record["event"]["_id"], sort_keys=True)
    assert record["_id"] == "orders-to-outbox/" + hashlib.sha256(token_text.encode()).hexdigest()
    [held] = db.kestra_change_quarantine.find()
    assert (held["reason"], held["event"]["documentKey"]) == ("a card number", {"_id": 3})

    # The consumer's record of a delete is lost: the repair's correction of the document the
    # source no longer holds reaches decide with a null fullDocument.
    db.orders.delete_one({"_id": 1})
    run = handoff(deployment, "run", "--policy", wasm, "--max-wait-seconds", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert db.kestra_change_outbox.delete_one({"event.operationType": "delete"}).deleted_count == 1
    repair = handoff(deployment, "reconcile", "--json", "--policy", wasm, "--repair", "--reason", "a lost delete")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    report = json.loads(repair.stdout)
    assert (report["orphan"]["keys"], report["repair"]["written"]) == (["1"], 1), report
    removed = db.kestra_change_outbox.find_one({"eventType": "OrderRemoved"})
    assert (removed["aggregateId"], removed["payload"]) == (1, {"run": "repair"}), removed
    assert removed["event"]["fullDocument"] is None
    client.close()
