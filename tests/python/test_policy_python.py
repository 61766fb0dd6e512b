"""Python policies end to end: the default policy written in Python (guest/python/default on the
SDK package guest/python/handoff_policy) built with componentize-py passes the default's cases and
replays like the Rust default; `policy new --lang python` → the SDK wheel installed by version →
`policy build` → `policy check` → `policy test` works as generated, an edited `decide` changes the
results, and a fix released as a new SDK version reaches the project by moving to it; `backfill`
and `reconcile --repair` hand their documents to the same `decide` as snapshot events.

The SDK wheel is HANDOFF_SDK_DIR's (tests/run builds it there), else one this module builds
offline from guest/python.

componentize-py is the pinned one tests/run installs into this virtual environment
(tests/python/requirements-componentize-py.txt); it missing is a failure, not a skip.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from bson import json_util

from handoff_cli import HANDOFF_BIN, WORKSPACE, assert_effects_made, delivery_case

PIN = next(
    line.split("==")[1].strip()
    for line in (WORKSPACE / "tests/python/requirements-componentize-py.txt").read_text().splitlines()
    if line.startswith("componentize-py==")
)
COMPONENTIZE_PY = Path(sys.executable).parent / "componentize-py"
SDK_VERSION = next(
    line.split('"')[1]
    for line in (WORKSPACE / "guest/python/pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)


def build_wheel(source, into):
    """The SDK's wheel from `source`, built offline with the installed build backend."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-index",
         "--no-deps", "--no-build-isolation", "-w", str(into), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def sdk_dir(tmp_path_factory):
    """The directory holding the SDK's wheel: HANDOFF_SDK_DIR when it holds this version's."""
    given = os.environ.get("HANDOFF_SDK_DIR")
    if given and (Path(given) / f"handoff_policy-{SDK_VERSION}-py3-none-any.whl").is_file():
        return Path(given)
    built = tmp_path_factory.mktemp("sdk")
    build_wheel(WORKSPACE / "guest/python", built)
    return built


def project_venv(project, sdk):
    """The project's virtual environment with its requirements installed offline (the SDK by
    version from `sdk`, as its requirements.txt says); its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv")], check=True)
    python = project / ".venv" / "bin" / "python"
    # The test environment's pip installs into the project's environment.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--disable-pip-version-check",
         "--no-index", "--find-links", str(sdk), "-r", str(project / "requirements.txt")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


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
            "-w", "effects-policy",
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


EFFECTS = """\
import handoff_policy as handoff


def decide(event):
    return handoff.hand_off(event.id)


def effect(record):
    op = record.field("event.operationType")
    if op == "delete":
        return handoff.refuse("deletes are settled by hand")
    return handoff.request(handoff.POST, body={"id": record.id.split("/", 1)[1], "op": op}, headers={"x-op": op})


def classify(failure):
    return handoff.IGNORE if failure.http_status == 409 else None
"""


def test_a_python_policy_decides_a_deliverys_effects_and_policy_test_checks_them(env, tmp_path):
    folder = tmp_path / "effects"
    folder.mkdir()
    (folder / "policy.py").write_text(EFFECTS)
    wasm = componentized(env, folder, tmp_path / "effects.wasm")
    check = handoff(env, "policy", "check", wasm)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "handoff:policy/delivery@1.6.0" in check.stdout, check.stdout
    case = delivery_case(tmp_path / "cases")
    updated = handoff(env, "policy", "test", "--policy", wasm, "--update", "--yes", case.parent)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert_effects_made(case)
    again = handoff(env, "policy", "test", "--policy", wasm, case.parent)
    assert again.returncode == 0, again.stdout + again.stderr
    # The host's default makes other requests of the same records: the expectations catch it.
    default = handoff(env, "policy", "test", case.parent)
    assert default.returncode != 0, default.stdout + default.stderr


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


def test_a_new_python_project_builds_checks_and_passes_its_cases(env, sdk_dir, tmp_path):
    created = handoff({**env, "HANDOFF_SDK_DIR": str(sdk_dir)}, "policy", "new", "shop", "--lang", "python", "--dir", tmp_path)
    assert created.returncode == 0, created.stdout + created.stderr
    project = tmp_path / "shop"
    for name in ("policy.py", "test_policy.py", "pyproject.toml", "requirements.txt", "README.md"):
        assert (project / name).is_file(), name
    # No SDK source and no contract: the SDK is named by version, and brings the contract.
    assert not (project / "handoff_policy.py").exists() and not (project / "wit").exists()
    requirements = (project / "requirements.txt").read_text().splitlines()
    assert f"handoff-policy=={SDK_VERSION}" in requirements, requirements
    assert f"--find-links {sdk_dir}" in requirements, requirements
    assert f'componentize-py = "{PIN}"' in (project / "pyproject.toml").read_text()
    assert (project / "cases/sample/case.json").is_file()
    # The smallest policy: the generated one is three lines of code besides its comments.
    code = [line for line in (project / "policy.py").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(code) <= 5, code

    # The SDK installed by version into the project's environment; the unit tests, with CPython.
    python = project_venv(project, sdk_dir)
    unit = subprocess.run([str(python), "-m", "unittest", "-q"], cwd=project, capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr

    env = {**env, "VIRTUAL_ENV": str(project / ".venv")}
    built = handoff(env, "policy", "build", project)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "verdict:   this host runs it" in built.stdout
    wasm = precompiled(env, project / "build/policy.wasm")
    check = handoff(env, "policy", "check", wasm)
    assert check.returncode == 0 and "verdict:   this host runs it" in check.stdout, check.stdout + check.stderr
    tested = handoff(env, "policy", "test", "--policy", wasm, project / "cases")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert any(line.split()[:2] == ["ok", "sample"] for line in tested.stdout.splitlines()), tested.stdout
    # As generated it is the default policy: it passes the default's cases.
    default = handoff(env, "policy", "test", "--policy", wasm, WORKSPACE / "guest/default/cases")
    assert default.returncode == 0 and " passed, 0 failed" in default.stdout, default.stdout + default.stderr

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


def test_a_fix_to_the_sdk_reaches_an_existing_project_by_its_new_version(env, sdk_dir, tmp_path):
    created = handoff({**env, "HANDOFF_SDK_DIR": str(sdk_dir)}, "policy", "new", "kept", "--lang", "python", "--dir", tmp_path)
    assert created.returncode == 0, created.stdout + created.stderr
    project = tmp_path / "kept"
    python = project_venv(project, sdk_dir)
    probe = [str(python), "-c", "import handoff_policy as h; print(getattr(h, 'FIXED', False))"]
    assert subprocess.run(probe, cwd=project, capture_output=True, text=True).stdout.split() == ["False"]

    # The next SDK release: a fix, and the version moved on.
    source = tmp_path / "sdk-source"
    shutil.copytree(WORKSPACE / "guest/python", source, ignore=shutil.ignore_patterns("__pycache__", "default"))
    major_minor, patch = SDK_VERSION.rsplit(".", 1)
    fixed = f"{major_minor}.{int(patch) + 1}"
    pyproject = source / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{SDK_VERSION}"', f'version = "{fixed}"'))
    module = source / "handoff_policy" / "__init__.py"
    module.write_text(module.read_text() + "\n\nFIXED = True\n")
    released = tmp_path / "released"
    build_wheel(source, released)
    assert (released / f"handoff_policy-{fixed}-py3-none-any.whl").is_file()

    # The project moves to it: one line of its requirements, then the same install.
    requirements = project / "requirements.txt"
    requirements.write_text(requirements.read_text().replace(f"handoff-policy=={SDK_VERSION}", f"handoff-policy=={fixed}"))
    upgrade = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--disable-pip-version-check",
         "--no-index", "--find-links", str(released), "-r", str(requirements)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    assert subprocess.run(probe, cwd=project, capture_output=True, text=True).stdout.split() == ["True"]
    unit = subprocess.run([str(python), "-m", "unittest", "-q"], cwd=project, capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_building_without_the_pinned_componentize_py_says_what_to_install(env, tmp_path):
    created = handoff({k: v for k, v in env.items() if k != "HANDOFF_SDK_DIR"}, "policy", "new", "pinned", "--lang", "python", "--dir", tmp_path)
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
