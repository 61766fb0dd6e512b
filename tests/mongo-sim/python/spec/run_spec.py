#!/usr/bin/env python3
"""Runs PyMongo's unified-format spec tests for change streams and transactions against mongo-sim.

    python run_spec.py [--bin PATH] [--timeout SECONDS] [--update-expected] [PYTEST ARGS...]

Run it with the Python of the test virtual environment (tests/mongo-sim/python/.venv), where
../requirements.txt and requirements.txt are installed. It

1. downloads PyMongo's source distribution with pip (the version and sha256 of sdist.txt) and
   unpacks its test suite into the cache directory (once);
2. starts the mongo-sim binary as a replica-set primary on a free port;
3. runs the tests of `unified_spec.py` with pytest, PyMongo's test suite pointed at the server
   (DB_IP / DB_PORT), a per-test timeout, and the expected failures of expected_failures.txt
   (`spec_plugin.py`).

It fails when a test not in the list fails, or a listed test does not (a stale entry); with
`--update-expected` it rewrites the list from the run instead. Arguments it does not know go to
pytest (`-k EXPR`, `-x`, `-v`, ...).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKSPACE = HERE.parents[3]
SDIST_REQUIREMENT = HERE / "sdist.txt"
DEFAULT_CACHE = HERE / ".cache"
DEFAULT_EXPECTED = HERE / "expected_failures.txt"
DEFAULT_TIMEOUT = 5.0


def pinned_sdist() -> tuple[str, str, str]:
    """(name, version, sha256) from sdist.txt."""
    for raw in SDIST_REQUIREMENT.read_text().splitlines():
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        spec, _, hash_part = line.partition("--hash=sha256:")
        name, _, version = spec.strip().partition("==")
        if name and version and hash_part:
            return name, version, hash_part.strip()
    raise SystemExit(f"{SDIST_REQUIREMENT}: no `name==version --hash=sha256:HEX` line")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def spec_suite(cache: Path) -> Path:
    """The unpacked source distribution's root (holding `test/`), downloaded if not cached."""
    name, version, digest = pinned_sdist()
    root = cache / f"{name}-{version}"
    stamp = root / ".sha256"
    if stamp.exists() and stamp.read_text().strip() == digest:
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        download = Path(tmp) / "download"
        # Metadata is built with the pinned backend of requirements.txt, so no unpinned build
        # dependency is fetched; --require-hashes checks the archive against sdist.txt.
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "--require-hashes",
                "-r", str(SDIST_REQUIREMENT), "-d", str(download),
            ],
            check=True,
        )
        archives = list(download.glob(f"{name}-{version}.tar.gz"))
        if len(archives) != 1 or sha256(archives[0]) != digest:
            raise SystemExit(f"the downloaded {name} {version} archive is not the one sdist.txt names")
        unpacked = Path(tmp) / "unpacked"
        prefix = f"{name}-{version}/test/"
        with tarfile.open(archives[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            if not members:
                raise SystemExit(f"{archives[0].name} holds no test/ directory")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(unpacked, members=members, filter="data")
            else:
                for m in members:
                    if not (m.isfile() or m.isdir()) or ".." in Path(m.name).parts:
                        raise SystemExit(f"unexpected archive member {m.name}")
                tar.extractall(unpacked, members=members)
        (unpacked / f"{name}-{version}" / ".sha256").write_text(digest + "\n")
        if root.exists():
            shutil.rmtree(root)
        (unpacked / f"{name}-{version}").rename(root)
    return root


def server_binary(given: str | None) -> Path:
    if given:
        binary = Path(given)
    elif os.environ.get("MONGO_SIM_BIN"):
        binary = Path(os.environ["MONGO_SIM_BIN"])
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR", WORKSPACE / "target"))
        binary = target / "debug" / "mongo-sim"
    binary = binary if binary.is_absolute() else (Path.cwd() / binary).resolve()
    if not binary.exists():
        raise SystemExit(f"mongo-sim binary not found at {binary}; run `cargo build -p mongo-sim`")
    return binary


class Server:
    """mongo-sim as a replica-set primary on a free port, its log in a temporary file."""

    def __init__(self, binary: Path, args: list[str]):
        self.log = tempfile.NamedTemporaryFile(prefix="mongo-sim-spec-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(binary), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening "):
            self.stop(keep_log=True)
            raise SystemExit(f"mongo-sim did not start: {line!r}; log in {self.log.name}")
        self.host, port = line.split(" ", 1)[1].rsplit(":", 1)
        self.port = int(port)

    def stop(self, keep_log: bool) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()
        if not keep_log:
            os.unlink(self.log.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", help="the mongo-sim binary (default: $MONGO_SIM_BIN, else the debug build)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the PyMongo test suite is unpacked")
    parser.add_argument("--expected", type=Path, default=DEFAULT_EXPECTED, help="the expected-failures list")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds a test may take")
    parser.add_argument("--update-expected", action="store_true", help="rewrite the expected-failures list from this run")
    parser.add_argument("--server-arg", action="append", default=[], help="an extra mongo-sim argument (repeatable)")
    parser.add_argument("--keep-log", action="store_true", help="keep the server's log (kept anyway on failure)")
    args, pytest_args = parser.parse_known_args()

    try:
        import pytest_timeout  # noqa: F401
    except ImportError:
        raise SystemExit(f"pytest-timeout is missing: pip install -r {HERE / 'requirements.txt'}") from None
    name, version, _ = pinned_sdist()
    installed = importlib.metadata.version(name)
    if installed != version:
        raise SystemExit(f"{name} {installed} is installed, but the spec tests are those of {version} (sdist.txt)")

    binary = server_binary(args.bin)
    root = spec_suite(args.cache.resolve())
    server = Server(binary, args.server_arg)
    env = dict(os.environ)
    env.update(
        DB_IP=server.host,
        DB_PORT=str(server.port),
        MONGO_SIM_SPEC_TESTS=str(root / "test"),
        PYTHONPATH=os.pathsep.join([str(HERE), str(root)]),
    )
    for var in ("MONGODB_URI", "DB_USER", "DB_PASSWORD", "COMPRESSORS", "MONGODB_API_VERSION",
                "TEST_LOAD_BALANCER", "TEST_DATA_LAKE"):
        env.pop(var, None)
    command = [
        sys.executable, "-m", "pytest", str(HERE / "unified_spec.py"),
        "-c", str(HERE / "pytest.ini"), "--rootdir", str(HERE), "--noconftest",
        "-p", "spec_plugin", "--expected-failures", str(args.expected.resolve()),
        "--timeout", str(args.timeout),
    ]
    if args.update_expected:
        command.append("--update-expected")
    ok = False
    try:
        # PyMongo's test modules put the working directory on sys.path to import `test`.
        code = subprocess.run([*command, *pytest_args], cwd=root, env=env).returncode
        ok = code == 0
    finally:
        keep = args.keep_log or not ok
        server.stop(keep_log=keep)
        if keep:
            print(f"mongo-sim log: {server.log.name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
