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
