"""Starts the mongo-sim binary on an ephemeral port for the PyMongo tests.

With MONGODB_URI set (and not empty), the tests that need nothing but a replica set use that
deployment instead, each in a database of its own; those that need a server configured for them
(`start_server`) or the test server itself (`sim_server`) still start the binary.
"""

import itertools
import os
import re
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


class UriDeployment:
    """The replica set MONGODB_URI names, in place of a test server."""

    def __init__(self, uri):
        self.uri = uri
        with self.client() as c:
            self.set_name = c.admin.command("hello").get("setName", "")

    def client(self, **kwargs):
        kwargs.setdefault("serverSelectionTimeoutMS", 5000)
        return MongoClient(self.uri, **kwargs)

    def stop(self):
        pass


def shared_uri():
    """The deployment MONGODB_URI names, when it is set and not empty."""
    return os.environ.get("MONGODB_URI") or None


_databases = itertools.count()


def database_name(test):
    """A database no other test uses, on a deployment other runs may share:
    `py_<test>_<process id>_<counter>`, within MongoDB's 63 characters."""
    return f"py_{re.sub(r'[^A-Za-z0-9]', '_', test)[:32]}_{os.getpid()}_{next(_databases)}"


@pytest.fixture(scope="session")
def sim_server():
    """A test server, whatever MONGODB_URI says."""
    s = SimServer()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def server(request):
    """The deployment MONGODB_URI names, else the session's test server."""
    uri = shared_uri()
    if uri:
        return UriDeployment(uri)
    return request.getfixturevalue("sim_server")


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


@pytest.fixture
def sim_client(sim_server):
    c = sim_server.client()
    yield c
    c.close()


@pytest.fixture
def db(client, request):
    """A database of the test's own on `server`."""
    return client[database_name(request.node.name)]
