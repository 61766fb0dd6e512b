"""Product-level PyMongo suites: the test server (tests/mongo-sim), or the replica set MONGODB_URI
names, and the `handoff` binary."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[2]
SIM_PYTHON = WORKSPACE / "tests" / "mongo-sim" / "python"
# The test server's own helpers: its server class and the baseline task used as an oracle.
sys.path.insert(0, str(SIM_PYTHON))
_spec = importlib.util.spec_from_file_location("mongo_sim_fixtures", SIM_PYTHON / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
SimServer = _fixtures.SimServer
UriDeployment = _fixtures.UriDeployment


@pytest.fixture
def sim():
    """A test server of the test's own; with MONGODB_URI set (and not empty), that deployment
    instead (the tests here each use a database of their own)."""
    uri = _fixtures.shared_uri()
    if uri:
        yield UriDeployment(uri)
        return
    server = SimServer()
    yield server
    server.stop()
