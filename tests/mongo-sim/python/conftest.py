"""Starts the mongo-sim binary on an ephemeral port for the PyMongo tests."""

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from pymongo import MongoClient

WORKSPACE = Path(__file__).resolve().parents[3]
DEFAULT_BIN = WORKSPACE / "target" / "debug" / "mongo-sim"


class SimServer:
    def __init__(self, *args):
        binary = Path(os.environ.get("MONGO_SIM_BIN", DEFAULT_BIN))
        if not binary.is_absolute():
            binary = (Path.cwd() / binary).resolve()
        if not binary.exists():
            raise RuntimeError(f"mongo-sim binary not found at {binary}; run `cargo build -p mongo-sim`")
        self.log = tempfile.NamedTemporaryFile(prefix="mongo-sim-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(binary), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"mongo-sim did not start: {line!r}; log in {self.log.name}")
        self.address = line.split(" ", 1)[1]
        self.host, port = self.address.rsplit(":", 1)
        self.port = int(port)
        self.set_name = "rs0"
        for i, a in enumerate(args):
            if a == "--set-name":
                self.set_name = args[i + 1]

    @property
    def uri(self):
        return f"mongodb://{self.address}/?replicaSet={self.set_name}"

    @property
    def direct_uri(self):
        return f"mongodb://{self.address}/?directConnection=true"

    def client(self, **kwargs):
        kwargs.setdefault("serverSelectionTimeoutMS", 5000)
        return MongoClient(self.uri, **kwargs)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def server():
    s = SimServer()
    yield s
    s.stop()


@pytest.fixture
def start_server():
    started = []

    def start(*args):
        s = SimServer(*args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def client(server):
    c = server.client()
    yield c
    c.close()
