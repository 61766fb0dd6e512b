"""JavaScript policies end to end: the default policy on the JavaScript SDK (guest/javascript)
passes the default's cases, and a project from `handoff policy new --lang javascript` names the
SDK package by version and carries none of it, installs it offline, builds, checks, passes its
sample case and the default's cases, changes its results when its decisions change, and gets a fix
released as a new SDK version by moving to it; `backfill` and `reconcile --repair` hand their
documents to the same `decide` as snapshot events.

Needs Node.js and npm, and guest/javascript/node_modules (tests/run installs it with `npm ci`).
The SDK's tarball is HANDOFF_SDK_DIR's (tests/run packs it there), else one this module packs
offline from guest/javascript/sdk.
The compiled components are kept in one artifact cache for the module (HANDOFF_CACHE_DIR), so
each is compiled once."""

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from bson import json_util

from handoff_cli import HANDOFF_BIN, WORKSPACE, assert_effects_made, delivery_case

GUEST = WORKSPACE / "guest" / "javascript"
SDK_VERSION = json.loads((GUEST / "sdk" / "package.json").read_text())["version"]
DEFAULT_CASES = WORKSPACE / "guest" / "default" / "cases"
# Compiling a JavaScript component (its engine is several MiB of code) under a debug host is slow.
TIMEOUT = 1800


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    environment = dict(os.environ)
    environment["HANDOFF_CACHE_DIR"] = str(tmp_path_factory.mktemp("artifacts"))
    # npm install of a generated project takes what the npm cache holds before the registry.
    environment.setdefault("npm_config_prefer_offline", "true")
    return environment


def run(command, env, cwd=None):
    proc = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    return proc


def handoff(env, *args, cwd=None):
    return run([HANDOFF_BIN, *args], env, cwd=cwd)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def pack(source, into):
    """The SDK package in `source` packed offline into `into`; the tarball's path."""
    proc = subprocess.run(["npm", "pack", "--offline", "--pack-destination", str(into)],
                          cwd=source, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return into / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdk_dir(tmp_path_factory):
    """The directory holding the SDK's tarball: HANDOFF_SDK_DIR when it holds this version's."""
    given = os.environ.get("HANDOFF_SDK_DIR")
    if given and (Path(given) / f"handoff-policy-{SDK_VERSION}.tgz").is_file():
        return Path(given)
    packed = tmp_path_factory.mktemp("sdk")
    pack(GUEST / "sdk", packed)
    return packed


def code_lines(source):
    return [line for line in source.splitlines() if line.strip() and not line.strip().startswith("//")]


def componentized(env, folder, name, decisions, *options):
    """The policy module `decisions` on a copy of the SDK, built with componentize-js (and
    `options`) into `folder/name.wasm`."""
    (folder / "sdk").mkdir(exist_ok=True)
    shutil.copy(GUEST / "sdk" / "handoff.js", folder / "sdk" / "handoff.js")
    source = folder / name
    source.mkdir()
    (source / "policy.js").write_text(decisions)
    shutil.copy(GUEST / "default" / "component.js", source / "component.js")
    wasm = folder / f"{name}.wasm"
    ok(run([GUEST / "node_modules" / ".bin" / "componentize-js",
            "--wit", WORKSPACE / "wit" / "policy.wit", "--world-name", "effects-policy", *options,
            "--out", wasm, f"{name}/component.js"], env, cwd=folder))  # fmt: skip
    return wasm


def policy_test(env, wasm, cases):
    """`policy test`, after compiling the component into the module's cache (outside the
    watchdog that bounds each case's run)."""
    ok(handoff(env, "policy", "precompile", wasm))
    return handoff(env, "policy", "test", "--policy", wasm, cases)


def test_the_sdk_and_the_default_pass_their_unit_tests(env):
    assert (GUEST / "node_modules").is_dir(), "run `npm ci` in guest/javascript first (tests/run does)"
    out = ok(run(["npm", "test"], env, cwd=GUEST))
    assert "# fail 0" in out, out


def test_the_default_policy_in_javascript_passes_the_default_cases(env):
    assert (GUEST / "node_modules").is_dir(), "run `npm ci` in guest/javascript first (tests/run does)"
    wasm = GUEST / "build" / "default.wasm"
    if wasm.exists():
        wasm.unlink()
    ok(run(["npm", "run", "build"], env, cwd=GUEST))
    out = ok(policy_test(env, wasm, DEFAULT_CASES))
    cases = sorted(p.name for p in DEFAULT_CASES.iterdir() if (p / "case.json").is_file())
    assert len(cases) >= 5
    for case in cases:
        assert f"ok       {case}" in out, out


@pytest.fixture(scope="module")
def project(env, sdk_dir, tmp_path_factory):
    """`policy new x --lang javascript` with the SDK packages' directory, then `policy build`
    (npm install, componentize-js, check)."""
    root = tmp_path_factory.mktemp("js-project")
    out = ok(handoff({**env, "HANDOFF_SDK_DIR": str(sdk_dir)}, "policy", "new", "x", "--lang", "javascript", "--dir", root))
    assert "created" in out
    project = root / "x"
    for name in ["package.json", "policy.js", "policy.test.js", "README.md"]:
        assert (project / name).is_file(), name
    # No SDK source, no entry and no contract: the SDK is named by version and brings them.
    for name in ["handoff.js", "fake-host.js", "component.js", "wit"]:
        assert not (project / name).exists(), name
    package = json.loads((project / "package.json").read_text())
    assert package["dependencies"] == {"handoff-policy": f"file:{sdk_dir / f'handoff-policy-{SDK_VERSION}.tgz'}"}
    assert "handoff:policy" not in (project / "policy.js").read_text()
    # The smallest policy is the generated one: at most 5 lines of code.
    assert len(code_lines((project / "policy.js").read_text())) <= 5, (project / "policy.js").read_text()
    assert '"expect"' in (project / "cases" / "sample" / "case.json").read_text()
    build = handoff(env, "policy", "build", project)
    return project, build


def test_a_new_project_builds_checks_and_passes_its_sample(env, project):
    project, build = project
    out = ok(build)
    assert "verdict:   this host runs it" in out, out
    assert "NOT granted" not in out, out
    wasm = project / "build" / "policy.wasm"
    assert wasm.is_file()
    assert "# fail 0" in ok(run(["npm", "test"], env, cwd=project))
    ok(policy_test(env, wasm, project / "cases"))
    # As generated it is the default policy.
    out = ok(handoff(env, "policy", "test", "--policy", wasm, DEFAULT_CASES))
    assert " passed, 0 failed" in out, out
    # The SDK the build used is the installed package, at the version the project names.
    installed = json.loads((project / "node_modules" / "handoff-policy" / "package.json").read_text())
    assert installed["version"] == SDK_VERSION


def test_an_edited_decide_changes_the_results(env, project, tmp_path):
    project, build = project
    ok(build)
    # A copy of the project sharing its installed toolchain; the SDK is copied (the engine reads
    # the component's sources from inside the project only).
    edited = tmp_path / "edited"
    shutil.copytree(project, edited, ignore=shutil.ignore_patterns("node_modules", "build"))
    (edited / "node_modules").mkdir()
    for installed in (project / "node_modules").iterdir():
        if installed.name != "handoff-policy":
            (edited / "node_modules" / installed.name).symlink_to(installed)
    shutil.copytree(project / "node_modules" / "handoff-policy", edited / "node_modules" / "handoff-policy")
    policy = edited / "policy.js"
    source = policy.read_text()
    source = source.replace(
        "import { handOff } from './node_modules/handoff-policy/handoff.js';",
        "import { handOff, skip } from './node_modules/handoff-policy/handoff.js';",
    )
    source = source.replace(
        "  return handOff(event.id);",
        "  if (event.operationType === 'delete') return skip('deletes stay in the source');\n  return handOff(event.id);",
    )
    assert "skip('deletes" in source
    policy.write_text(source)
    ok(handoff(env, "policy", "build", edited))
    wasm = edited / "build" / "policy.wasm"
    failed = policy_test(env, wasm, edited / "cases")
    assert failed.returncode != 0, failed.stdout
    assert "sample" in failed.stdout + failed.stderr, failed.stdout
    # Accepting the new results records the skip.
    ok(handoff(env, "policy", "test", "--policy", wasm, edited / "cases", "--update", "--yes"))
    expected = (edited / "cases" / "sample" / "case.json").read_text()
    assert '"events_skipped": 1' in expected, expected
    ok(handoff(env, "policy", "test", "--policy", wasm, edited / "cases"))


def test_a_fix_to_the_sdk_reaches_an_existing_project_by_its_new_version(env, project, tmp_path):
    project, build = project
    ok(build)
    # A copy of the project, installed as its author installs it (offline: the npm cache and the
    # SDK's tarball).
    kept = tmp_path / "kept"
    shutil.copytree(project, kept, ignore=shutil.ignore_patterns("node_modules", "build"))
    install = ["npm", "install", "--offline", "--no-audit", "--no-fund"]
    ok(run(install, env, cwd=kept))
    probe = ["node", "--input-type=module", "--eval",
             "import * as sdk from 'handoff-policy'; console.log(sdk.FIXED === true)"]  # fmt: skip
    assert ok(run(probe, env, cwd=kept)).split() == ["false"]

    # The next SDK release: a fix, and the version moved on.
    source = tmp_path / "sdk-source"
    shutil.copytree(GUEST / "sdk", source)
    major_minor, patch = SDK_VERSION.rsplit(".", 1)
    fixed = f"{major_minor}.{int(patch) + 1}"
    manifest = json.loads((source / "package.json").read_text())
    manifest["version"] = fixed
    (source / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    with open(source / "handoff.js", "a") as module:
        module.write("\n/** The fix of this release. */\nexport const FIXED = true;\n")
    released = pack(source, tmp_path)
    assert released.name == f"handoff-policy-{fixed}.tgz"

    # The project moves to it: its dependency names the new release, then `npm install`.
    package = json.loads((kept / "package.json").read_text())
    package["dependencies"]["handoff-policy"] = f"file:{released}"
    (kept / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    ok(run(install, env, cwd=kept))
    assert json.loads((kept / "node_modules" / "handoff-policy" / "package.json").read_text())["version"] == fixed
    assert ok(run(probe, env, cwd=kept)).split() == ["true"]
    assert "# fail 0" in ok(run(["npm", "test"], env, cwd=kept))


FETCHER = """\
// Hands every event off like the default; with the parameter fetch=1 it first tries the network.
import { handOff } from '../sdk/handoff.js';

export function init(settings) {
  return { fetch: settings.param('fetch', '0') === '1' };
}

export async function decide(event, context) {
  if (context.fetch) {
    await fetch('http://127.0.0.1:9/' + event.id);
  }
  return handOff(event.id);
}
"""


def test_a_component_built_with_componentize_js_defaults_runs_and_cannot_fetch(env, tmp_path):
    """componentize-js with its default features imports wasi:http (for fetch): the host links it
    without an implementation, so the policy runs, and a call ends the run with nothing written."""
    assert (GUEST / "node_modules").is_dir(), "run `npm ci` in guest/javascript first (tests/run does)"
    wasm = componentized(env, tmp_path, "fetcher", FETCHER)
    check = ok(handoff(env, "policy", "check", wasm))
    assert "import:    wasi:http/outgoing-handler@" in check, check
    assert "any call ends the run as a policy failure" in check, check
    assert "verdict:   this host runs it" in check, check
    out = ok(policy_test(env, wasm, DEFAULT_CASES))
    assert " passed, 0 failed" in out, out

    state = tmp_path / "state.redb"
    fixture = WORKSPACE / "tests" / "fixtures" / "demo.jsonl"
    proc = handoff(env, "replay", fixture, "--state", state, "--policy", wasm, "--policy-param", "fetch=1")
    assert proc.returncode == 9, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "wasi:http" in proc.stderr, proc.stderr
    # Nothing was written: the checkpoint alone, at no token.
    lines = ok(handoff(env, "inspect", "--state", state)).splitlines()
    assert len(lines) == 1, lines
    assert json.loads(lines[0])["token"] is None, lines[0]


EFFECTS = """\
import { handOff, refuse, request } from '../sdk/handoff.js';

export function decide(event) {
  return handOff();
}

export function effect(record) {
  const op = record.field('event.operationType');
  if (op === 'delete') return refuse('deletes are settled by hand');
  return request({ operation: 'post', body: { id: record.id.split('/')[1], op }, headers: { 'x-op': op } });
}

export function classify(failure) {
  return failure.httpStatus === 409 ? 'ignore' : undefined;
}
"""


def test_a_javascript_policy_decides_a_deliverys_effects_and_policy_test_checks_them(env, tmp_path):
    assert (GUEST / "node_modules").is_dir(), "run `npm ci` in guest/javascript first (tests/run does)"
    wasm = componentized(env, tmp_path, "effects", EFFECTS)
    check = ok(handoff(env, "policy", "check", wasm))
    assert "handoff:policy/delivery@1.6.0" in check, check
    case = delivery_case(tmp_path / "cases")
    ok(handoff(env, "policy", "precompile", wasm))
    ok(handoff(env, "policy", "test", "--policy", wasm, "--update", "--yes", case.parent))
    assert_effects_made(case)
    ok(policy_test(env, wasm, case.parent))
    # The host's default makes other requests of the same records: the expectations catch it.
    default = handoff(env, "policy", "test", case.parent)
    assert default.returncode != 0, default.stdout + default.stderr


SNAPSHOT_DECISIONS = """\
import { handOff, quarantine, record, runKind, skip } from '../sdk/handoff.js';

export function decide(event) {
  if (event.operationType !== 'snapshot') return handOff();
  const document = JSON.parse(event.field('fullDocument'));
  if (document === null) {
    const aggregateId = event.field('documentKey._id');
    return record({ eventType: 'OrderRemoved', aggregateId, payload: { run: runKind() } });
  }
  if ('card' in document) return quarantine(event.id, 'a card number');
  if (document.status === 'draft') return skip('drafts are not published');
  return handOff();
}
"""


def test_backfill_and_repair_documents_reach_the_javascript_decide_as_snapshot_events(env, sim, tmp_path):
    assert (GUEST / "node_modules").is_dir(), "run `npm ci` in guest/javascript first (tests/run does)"
    wasm = componentized(env, tmp_path, "snapshots", SNAPSHOT_DECISIONS, "--disable", "http", "fetch-event")
    ok(handoff(env, "policy", "precompile", wasm))
    database = "snapshots_" + uuid.uuid4().hex[:8]
    client = sim.client()
    db = client[database]
    db.orders.insert_many(
        [{"_id": 1, "total": 10}, {"_id": 2, "status": "draft"}, {"_id": 3, "card": "4111111111111111"}]
    )
    deployment = {**env, "MONGODB_URI": sim.uri, "SOURCE_DATABASE": database}

    backfill = ok(handoff(deployment, "backfill", "--policy", wasm, "--reason", "initial load", "--json"))
    done = json.loads(backfill)["this_run"]
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
    ok(handoff(deployment, "run", "--policy", wasm, "--max-wait-seconds", "1"))
    assert db.kestra_change_outbox.delete_one({"event.operationType": "delete"}).deleted_count == 1
    repair = ok(handoff(deployment, "reconcile", "--json", "--policy", wasm, "--repair", "--reason", "a lost delete"))
    report = json.loads(repair)
    assert (report["orphan"]["keys"], report["repair"]["written"]) == (["1"], 1), report
    removed = db.kestra_change_outbox.find_one({"eventType": "OrderRemoved"})
    assert (removed["aggregateId"], removed["payload"]) == (1, {"run": "repair"}), removed
    assert removed["event"]["fullDocument"] is None
    client.close()
