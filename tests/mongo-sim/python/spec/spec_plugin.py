"""Pytest plugin for the unified spec run (`run_spec.py` loads it with `-p spec_plugin`).

- Sets up PyMongo's test client context (`test.setup()` / `test.teardown()`) for the session.
- Marks the tests listed in the expected-failures file as strict expected failures: a listed test
  that passes fails the run (a stale entry), and so does a listed test that is skipped or that
  names no test.
- Prints the totals: passed, expected failures, skipped, failed, out of the tests collected.
- With `--update-expected`, rewrites the list from the run: the tests that failed, keeping the
  reasons of entries that remain; a new entry's reason starts with `unexplained:` and quotes the
  error, to be replaced by a real one.
"""

from __future__ import annotations

import re
import unittest
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TIMEOUT_MARK = "Timeout (>"
NEW_REASON_PREFIX = "unexplained:"


@dataclass
class ExpectedFailures:
    path: Path
    header: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> ExpectedFailures:
        listed = cls(path)
        if not path.exists():
            return listed
        in_header = True
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                if in_header:
                    listed.header.append(raw)
                continue
            in_header = False
            test, _, rest = line.partition(" ")
            rest = rest.strip()
            if not rest.startswith("#") or not rest[1:].strip():
                raise pytest.UsageError(f"{path}:{number}: expected `test id  # reason`, got {raw!r}")
            if test in listed.reasons:
                raise pytest.UsageError(f"{path}:{number}: {test} is listed twice")
            listed.reasons[test] = rest[1:].strip()
        while listed.header and not listed.header[-1].strip():
            listed.header.pop()
        return listed

    def write(self, reasons: dict[str, str]) -> None:
        lines = list(self.header)
        if lines:
            lines.append("")
        previous = None
        for test, reason in sorted(reasons.items(), key=lambda kv: (kv[1], kv[0])):
            if previous is not None and reason != previous:
                lines.append("")
            lines.append(f"{test}  # {reason}")
            previous = reason
        self.path.write_text("\n".join(lines) + "\n")


def test_key(nodeid: str) -> str:
    """`Class::test_method`, the id the list uses."""
    return "::".join(nodeid.split("::")[1:])


def pytest_addoption(parser):
    group = parser.getgroup("mongo-sim spec")
    group.addoption("--expected-failures", required=True, help="the expected-failures list")
    group.addoption(
        "--update-expected",
        action="store_true",
        help="rewrite the expected-failures list from this run",
    )


class SpecRun:
    def __init__(self, config):
        self.config = config
        self.listed = ExpectedFailures.read(Path(config.getoption("expected_failures")))
        self.collected: list[str] = []
        self.unknown: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        # Before any deselection (-k), so that an entry naming no test is told from one whose
        # test was not selected.
        known = {test_key(item.nodeid) for item in items}
        self.unknown = sorted(t for t in self.listed.reasons if t not in known)
        for item in items:
            reason = self.listed.reasons.get(test_key(item.nodeid))
            if reason is not None:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        self.collected = [test_key(item.nodeid) for item in session.items]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        key = test_key(item.nodeid)
        if call.excinfo is not None and not report.passed and key not in self.messages:
            if not call.excinfo.errisinstance((pytest.skip.Exception, unittest.SkipTest)):
                text = call.excinfo.exconly().strip().splitlines()
                self.messages[key] = text[0] if text else call.excinfo.typename

    def pytest_runtest_logreport(self, report):
        key = test_key(report.nodeid)
        current = self.outcomes.get(key, "passed")
        if hasattr(report, "wasxfail"):
            new = "xfailed" if report.skipped else "xpassed"
        elif report.failed:
            new = "xpassed" if "[XPASS(strict)]" in str(report.longrepr) else "failed"
        elif report.skipped:
            new = "skipped"
            if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
                self.messages.setdefault(key, str(report.longrepr[2]))
        else:
            new = "passed"
        rank = ["passed", "skipped", "xfailed", "xpassed", "failed"]
        if rank.index(new) > rank.index(current):
            current = new
        self.outcomes[key] = current

    def counts(self):
        counts = dict.fromkeys(["passed", "xfailed", "skipped", "failed", "xpassed"], 0)
        for key in self.collected:
            counts[self.outcomes.get(key, "failed")] += 1
        return counts

    def stale(self):
        """Listed tests that ran without failing, or were skipped."""
        return [
            t
            for t in self.collected
            if t in self.listed.reasons and self.outcomes.get(t) in ("passed", "xpassed", "skipped")
        ]

    def unexpected(self):
        return [
            t
            for t in self.collected
            if t not in self.listed.reasons and self.outcomes.get(t, "failed") == "failed"
        ]

    def new_reasons(self):
        reasons = {}
        ran = set(self.collected)
        for test, reason in self.listed.reasons.items():
            if test not in ran and test not in self.unknown:
                reasons[test] = reason  # not selected this time: kept as it is
        for test in self.collected:
            if self.outcomes.get(test, "failed") not in ("failed", "xfailed"):
                continue
            reason = self.listed.reasons.get(test)
            if reason is None:
                message = self.messages.get(test, "no error recorded")
                message = re.sub(r"\s+", " ", message)[:140]
                if TIMEOUT_MARK in message:
                    message = "hangs: " + message
                reason = f"{NEW_REASON_PREFIX} {message}"
            reasons[test] = reason
        return reasons

    def pytest_sessionfinish(self, session):
        if self.config.getoption("update_expected"):
            self.listed.write(self.new_reasons())
            session.exitstatus = pytest.ExitCode.OK
            return
        if self.unknown or self.stale():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        c = self.counts()
        total = len(self.collected)
        applicable = total - c["skipped"]
        tr.section("mongo-sim unified spec fidelity")
        for test in self.unexpected():
            tr.write_line(f"unexpected failure: {test}  # {self.messages.get(test, '')[:200]}")
        for test in self.stale():
            tr.write_line(f"stale entry (the test {self.outcomes.get(test)}): {test}")
        for test in self.unknown:
            tr.write_line(f"stale entry (no such test): {test}")
        tr.write_line(
            f"spec totals: {c['passed']} passed / {c['xfailed']} expected failures / "
            f"{c['skipped']} skipped out of {total} "
            f"({c['passed']} of {applicable} applicable pass; "
            f"{c['failed']} unexpected failures, {c['xpassed']} stale entries)"
        )
        if self.config.getoption("update_expected"):
            tr.write_line(f"rewrote {self.listed.path}")
        elif self.unexpected() or self.stale() or self.unknown:
            tr.write_line(
                f"fix the server, or list the test with its reason in {self.listed.path} "
                "(run_spec.py --update-expected rewrites the list from a run)"
            )


def pytest_configure(config):
    config.pluginmanager.register(SpecRun(config), "mongo_sim_spec_run")


@pytest.fixture(scope="session", autouse=True)
def _pymongo_client_context():
    """What PyMongo's own test/conftest.py does for its package: connect the client context."""
    import test

    test.setup()
    # A single-node replica set has no secondary: a test that selects one fails after a few
    # seconds rather than after PyMongo's 30.
    test.client_context.default_client_options.setdefault("serverSelectionTimeoutMS", 3000)
    yield
    test.teardown()
