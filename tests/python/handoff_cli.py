"""Runs the `handoff` binary the way the workflow engine does."""

import json
import os
import subprocess
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", WORKSPACE / "target"))
HANDOFF_BIN = Path(os.environ.get("HANDOFF_BIN", TARGET / "debug" / "handoff"))


def handoff_run(uri, database, **env):
    """Runs `handoff run` as the engine does and returns (exit code, outputs or None, stderr)."""
    if not HANDOFF_BIN.exists():
        raise RuntimeError(f"handoff binary not found at {HANDOFF_BIN}; run `cargo build -p handoff`")
    environment = {k: v for k, v in os.environ.items() if k not in ("HANDOFF_POLICY", "CONSUMER_ID")}
    environment.update({"MONGODB_URI": uri, "SOURCE_DATABASE": database, "MAX_WAIT_SECONDS": "1"})
    environment.update({k: str(v) for k, v in env.items()})
    proc = subprocess.run([str(HANDOFF_BIN), "run"], env=environment, capture_output=True, text=True, timeout=120)
    outputs = None
    for line in proc.stdout.splitlines():
        if line.startswith("::") and line.endswith("::"):
            value = json.loads(line[2:-2])
            if "outputs" in value:
                outputs = value["outputs"]
    return proc.returncode, outputs, proc.stderr


def delivery_case(into):
    """guest/default's every-operation case copied into `into`, expecting a webhook delivery's
    requests (contract 1.6) and none yet: `policy test --update` writes what the policy made."""
    source = WORKSPACE / "guest" / "default" / "cases" / "every-operation"
    case = into / "every-operation"
    case.mkdir(parents=True)
    (case / "stream.jsonl").write_text((source / "stream.jsonl").read_text())
    spec = json.loads((source / "case.json").read_text())
    spec["delivery"] = {"sink": "webhook", "name": "hooks"}
    (case / "case.json").write_text(json.dumps(spec, indent=2))
    return case


def assert_effects_made(case):
    """The requests `policy test --update` wrote into `case` (see `delivery_case`) are those of
    the effects the test policies in Python and JavaScript decide: a delete refused, every other
    event posted with a body and a header of the policy's, under the source document's key."""
    spec = json.loads((case / "case.json").read_text())
    first, second = spec["expect"][0]["requests"], spec["expect"][1]["requests"]
    ids = [r if isinstance(r, str) else r["id"] for r in spec["expect"][0]["outbox"]]
    assert second == [], second
    assert [r["id"] for r in first] == ids, first
    *posted, deleted = first
    assert deleted == {"id": ids[-1], "refused": "deletes are settled by hand"}, deleted
    operations = []
    for request in posted:
        assert request["operation"] == "post", request
        assert request["body"]["id"] == request["id"], request
        operations.append(request["body"]["op"])
        assert request["headers"] == [["x-op", request["body"]["op"]]], request
        assert request["key"] is not None and isinstance(request["version"], int), request
    assert operations == ["insert", "update", "replace"], operations
