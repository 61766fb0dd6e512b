"""The SDK's run loop against a host in memory: the default policy's semantics, natively, for
change runs and snapshot runs.

Run with `python -m unittest` (or pytest) from guest/python.
"""

import hashlib
import types
import unittest

import handoff_policy as handoff
from handoff_policy import Event, FakeHost, HandOff, HostError, PolicyError, Quarantine, Record, Settings, Skip

# A vector computed with PyMongo: sha256(json_util.dumps(token, sort_keys=True)).
TOKEN = '{"_data": "8263515EAC000000022B0429296E1404"}'
TOKEN_ID = "90d614360615f9af0e8d46d835dc09302520a8e3fa7366b9216af848e57acb5f"


def token(n):
    return '{"_data": "%02d"}' % n


def events(*operations):
    return [Event(token(i + 1), op, "change_demo.orders", (1793527200, i + 1)) for i, op in enumerate(operations)]


def default_policy():
    return types.SimpleNamespace(decide=lambda event: handoff.hand_off(event.id))


def settings(max_events=50, max_wait_ms=10000, params=()):
    return Settings(max_events, max_wait_ms, params)


class EventIds(unittest.TestCase):
    def test_the_baseline_id_is_the_sha256_of_the_token_text(self):
        self.assertEqual(handoff.event_id(TOKEN), TOKEN_ID)
        self.assertEqual(Event(TOKEN, "insert").id, TOKEN_ID)

    def test_non_ascii_is_hashed_as_utf8(self):
        self.assertEqual(handoff.event_id("\u00e9"), hashlib.sha256(b"\xc3\xa9").hexdigest())


class DefaultRun(unittest.TestCase):
    def test_each_event_is_handed_off_in_its_own_commit_then_the_watermark_is_saved(self):
        host = FakeHost(events("insert", "update", "delete"), watermark='{"_data": "99"}')
        report = handoff.run(default_policy(), settings(), host)
        self.assertEqual(host.opened, ("now", None))
        self.assertEqual(
            host.commits,
            [
                (None, token(1), "resume-after", [HandOff(handoff.event_id(token(1)))]),
                (token(1), token(2), "resume-after", [HandOff(handoff.event_id(token(2)))]),
                (token(2), token(3), "resume-after", [HandOff(handoff.event_id(token(3)))]),
            ],
        )
        self.assertEqual(host.advanced, [(token(3), '{"_data": "99"}')])
        self.assertEqual(report, handoff.Report("handed-off", 3, handoff.event_id(token(3))))

    def test_a_saved_token_resumes_with_its_mode(self):
        for mode in ("resume-after", "start-after"):
            host = FakeHost([], token=TOKEN, mode=mode, watermark=TOKEN)
            report = handoff.run(default_policy(), settings(), host)
            self.assertEqual(host.opened, (mode, TOKEN))
            self.assertEqual(host.advanced, [], "a watermark equal to the token is not saved again")
            self.assertEqual(report, handoff.Report("idle", 0, ""))

    def test_an_invalidation_is_skipped_saved_with_start_after_and_ends_the_run(self):
        host = FakeHost(events("insert", "drop", "invalidate", "insert"), watermark='{"_data": "99"}')
        report = handoff.run(default_policy(), settings(), host)
        self.assertEqual([c[2] for c in host.commits], ["resume-after", "resume-after", "start-after"])
        self.assertEqual(host.commits[-1][3], [Skip("invalidate")])
        self.assertEqual(host.advanced, [], "no watermark after an invalidation")
        self.assertEqual(report, handoff.Report("invalidated", 2, handoff.event_id(token(3))))
        self.assertEqual(len(host.events), 1, "the run ends at the invalidation")

    def test_decide_never_sees_an_invalidation(self):
        seen = []
        policy = types.SimpleNamespace(decide=lambda e: seen.append(e.operation_type) or handoff.hand_off())
        handoff.run(policy, settings(), FakeHost(events("insert", "invalidate")))
        self.assertEqual(seen, ["insert"])

    def test_max_events_stops_the_run_without_a_watermark(self):
        host = FakeHost(events("insert", "insert", "insert"), watermark='{"_data": "99"}')
        report = handoff.run(default_policy(), settings(max_events=2), host)
        self.assertEqual(len(host.commits), 2)
        self.assertEqual(host.advanced, [])
        self.assertEqual(report.events_handed_off, 2)

    def test_a_run_reads_past_max_events_to_finish_a_source_transaction(self):
        evs = events("insert", "insert", "update", "insert")
        place = lambda i: handoff.SourceTransaction("t1", i, 3)
        host = FakeHost(evs, transactions={token(1): place(0), token(2): place(1), token(3): place(2)})
        report = handoff.run(default_policy(), Settings(2, 3000), host)
        # max_events 2 ends inside t1: the run takes its third event, not the fourth.
        self.assertEqual(report.events_handed_off, 3)
        self.assertEqual([c[1] for c in host.commits], [token(1), token(2), token(3)])
        self.assertEqual(evs[1].source_transaction(), place(1))

    def test_a_run_that_follows_ends_only_when_the_host_stops_it(self):
        evs = events("insert", "insert")
        stop = HostError("rejected: the run is stopping")
        host = FakeHost(evs + [None] * 6 + [stop], follow=True, watermark="W")
        with self.assertRaises(HostError):
            handoff.run(default_policy(), Settings(1, 1000), host)
        # Past max_events 1, and idle six times the 1 s wait: only the host's refusal ended it.
        self.assertEqual(len(host.commits), 2)
        self.assertEqual(host.clock, 6 * FakeHost.WAIT_MS)

    def test_no_token_and_no_watermark_refuses_to_leave_a_gap(self):
        host = FakeHost([])
        with self.assertRaises(PolicyError) as raised:
            handoff.run(default_policy(), settings(), host)
        self.assertEqual(str(raised.exception), handoff.NO_IDLE_TOKEN)

    def test_the_wait_restarts_after_each_event(self):
        # 1 s per empty wait, 2.5 s of patience: two empty waits between events are fine.
        stream = [None, None, *events("insert"), None, None]
        stream.append(Event(token(9), "insert"))
        host = FakeHost(stream)
        report = handoff.run(default_policy(), settings(max_wait_ms=2500), host)
        self.assertEqual(report.events_handed_off, 2)

    def test_the_run_ends_after_max_wait_without_events(self):
        host = FakeHost([None, None, None, *events("insert")], token=TOKEN)
        report = handoff.run(default_policy(), settings(max_wait_ms=2000), host)
        self.assertEqual(report.events_handed_off, 0)
        self.assertEqual(len(host.events), 2, "the run stopped waiting")

    def test_a_host_error_ends_the_run_after_what_was_committed(self):
        stream = [*events("insert"), HostError("history lost")]
        host = FakeHost(stream)
        with self.assertRaises(HostError) as raised:
            handoff.run(default_policy(), settings(), host)
        self.assertEqual(str(raised.exception), "history lost")
        self.assertEqual(len(host.commits), 1)


class Decisions(unittest.TestCase):
    def run_with(self, decide, *operations, init=None, params=()):
        policy = types.SimpleNamespace(decide=decide)
        if init is not None:
            policy.init = init
        host = FakeHost(events(*operations), watermark='{"_data": "99"}')
        report = handoff.run(policy, settings(params=params), host)
        return host, report

    def test_hand_off_without_an_id_uses_the_baseline_id(self):
        host, _ = self.run_with(lambda e: handoff.hand_off(), "insert")
        self.assertEqual(host.outbox(), [handoff.event_id(token(1))])

    def test_skips_and_quarantines_are_committed_and_not_counted_as_hand_offs(self):
        def decide(event):
            if event.operation_type == "delete":
                return handoff.skip("deletes are not published")
            if event.operation_type == "update":
                return handoff.quarantine("q-" + event.id[:8], "poison")
            return handoff.hand_off("custom-" + event.id[:8])

        host, report = self.run_with(decide, "insert", "update", "delete")
        decisions = [c[3][0] for c in host.commits]
        self.assertEqual(decisions[1], Quarantine("q-" + handoff.event_id(token(2))[:8], "poison"))
        self.assertEqual(decisions[2], Skip("deletes are not published"))
        self.assertEqual(report, handoff.Report("handed-off", 1, "custom-" + handoff.event_id(token(1))[:8]))

    def test_only_skips_report_idle(self):
        _, report = self.run_with(lambda e: handoff.skip("no"), "insert")
        self.assertEqual(report, handoff.Report("idle", 0, ""))

    def test_a_shaped_record_goes_through_commit_records(self):
        def decide(event):
            return handoff.record(event.id, "OrderCreated", 1, '"o-1"', {"sku": "A"})

        host, report = self.run_with(decide, "insert")
        self.assertIsInstance(host.commits[0][3][0], Record)
        self.assertEqual(report.last_event_id, handoff.event_id(token(1)))

    def test_a_value_that_is_not_a_decision_fails_the_run(self):
        with self.assertRaises(PolicyError) as raised:
            self.run_with(lambda e: "yes", "insert")
        self.assertIn("not a decision", str(raised.exception))

    def test_an_exception_in_decide_fails_the_run_naming_the_event(self):
        def decide(event):
            raise KeyError("sku")

        with self.assertRaises(PolicyError) as raised:
            self.run_with(decide, "insert")
        self.assertIn(handoff.event_id(token(1)), str(raised.exception))
        self.assertIn("KeyError", str(raised.exception))

    def test_init_reads_the_params_and_may_refuse_them(self):
        seen = {}

        def init(s):
            seen.update(s.params)
            if s.param("mode") not in ("a", "b"):
                raise ValueError("mode must be a or b")

        self.run_with(lambda e: handoff.hand_off(), "insert", init=init, params=[("mode", "a"), ("mode", "z")])
        self.assertEqual(seen, {"mode": "a"}, "the first value of a repeated key")
        with self.assertRaises(PolicyError) as raised:
            self.run_with(lambda e: handoff.hand_off(), "insert", init=init, params=[("mode", "c")])
        self.assertEqual(str(raised.exception), "init refused the settings: ValueError: mode must be a or b")

    def test_fields_logs_and_identity_reach_the_host(self):
        def decide(event):
            handoff.log.info("deciding", op=event.operation_type)
            handoff.log.warning("careful")
            status = event.value("fullDocument.status")
            who = handoff.deployment().consumer
            assert handoff.checkpoint().token is None
            assert handoff.monotonic_ms() >= 0
            return handoff.hand_off("%s-%s" % (who, status))

        policy = types.SimpleNamespace(decide=decide)
        host = FakeHost(events("insert"), fields={(token(1), "fullDocument.status"): '"paid"'})
        handoff.run(policy, settings(), host)
        self.assertEqual(host.outbox(), ["orders-to-outbox-paid"])
        self.assertEqual(host.logs, [("info", "deciding", [("op", "insert")]), ("warn", "careful", [])])
        self.assertIsNone(Event(TOKEN, "insert").field("x"), "an event without a host has no fields")

    def test_the_host_is_unreachable_outside_a_run(self):
        with self.assertRaises(RuntimeError):
            handoff.deployment()
        with self.assertRaises(ValueError):
            handoff._Log()("loud", "x")


def snapshot_host(kind, *keys, deleted=()):
    """A snapshot run's host delivering the documents `keys` (`deleted` ones as corrections of
    documents the source no longer holds)."""
    host = FakeHost(kind=kind)
    for i, key in enumerate(keys):
        document = "null" if key in deleted else '{"_id": "%s", "status": "paid"}' % key
        host.snapshot(token(10 + i), '"%s"' % key, document)
    return host


class SnapshotRuns(unittest.TestCase):
    def test_each_document_is_committed_with_the_decision_of_decide_in_delivery_order(self):
        def decide(event):
            key = event.value("documentKey._id")
            if key == "o-2":
                return handoff.skip("not published")
            if key == "o-3":
                return handoff.quarantine("q-" + key, "poison")
            if key == "o-4":
                document = event.value("fullDocument")
                return handoff.record(event.id, "OrderPaid", 1, event.field("documentKey._id"), document)
            return handoff.hand_off()

        host = snapshot_host("backfill", "o-1", "o-2", "o-3", "o-4")
        report = handoff.run(types.SimpleNamespace(decide=decide), settings(max_events=4), host)
        paid = {"_id": "o-4", "status": "paid"}
        self.assertEqual(host.opened, ("now", None))
        self.assertEqual(
            [(c[0], c[1], c[3]) for c in host.commits],
            [
                (None, token(10), [HandOff(handoff.event_id(token(10)))]),
                (token(10), token(11), [Skip("not published")]),
                (token(11), token(12), [Quarantine("q-o-3", "poison")]),
                (token(12), token(13), [Record(handoff.event_id(token(13)), "OrderPaid", 1, '"o-4"', paid)]),
            ],
        )
        self.assertEqual(host.advanced, [])
        self.assertEqual(report, handoff.Report("handed-off", 2, handoff.event_id(token(13))))

    def test_decide_sees_snapshot_events_with_their_baseline_ids_and_the_run_kind(self):
        seen = []

        def decide(event):
            seen.append((event.operation_type, event.namespace, event.id, handoff.run_kind()))
            return handoff.hand_off()

        handoff.run(types.SimpleNamespace(decide=decide), settings(max_events=2), snapshot_host("repair", "o-1", "o-2"))
        self.assertEqual(
            seen,
            [
                ("snapshot", "change_demo.orders", handoff.event_id(token(10)), "repair"),
                ("snapshot", "change_demo.orders", handoff.event_id(token(11)), "repair"),
            ],
        )
        handoff.run(types.SimpleNamespace(decide=decide), settings(), FakeHost(events("insert")))
        self.assertEqual(seen[-1][3], "changes")

    def test_a_deleted_document_reaches_decide_with_a_null_full_document(self):
        def decide(event):
            if event.value("fullDocument") is None:
                return handoff.record(event.id, "OrderDeleted", 1, event.field("documentKey._id"), {})
            return handoff.hand_off()

        host = snapshot_host("repair", "o-1", "o-2", deleted=("o-2",))
        handoff.run(types.SimpleNamespace(decide=decide), settings(max_events=2), host)
        self.assertEqual(
            [c[3][0] for c in host.commits],
            [HandOff(handoff.event_id(token(10))), Record(handoff.event_id(token(11)), "OrderDeleted", 1, '"o-2"', {})],
        )

    def test_the_default_decisions_hand_every_document_off_under_its_baseline_id(self):
        host = snapshot_host("backfill", "o-1", "o-2", deleted=("o-2",))
        report = handoff.run(default_policy(), settings(max_events=2), host)
        self.assertEqual(host.outbox(), [handoff.event_id(token(10)), handoff.event_id(token(11))])
        self.assertEqual(report, handoff.Report("handed-off", 2, handoff.event_id(token(11))))

    def test_a_run_past_the_documents_ends_without_a_watermark(self):
        host = snapshot_host("backfill", "o-1")
        report = handoff.run(default_policy(), settings(max_events=2), host)
        self.assertEqual((len(host.commits), host.advanced), (1, []))
        self.assertEqual(report.events_handed_off, 1)

    def test_an_exception_in_decide_or_init_fails_the_run_naming_its_cause(self):
        def decide(event):
            if event.value("documentKey._id") == "o-2":
                raise KeyError("sku")
            return handoff.hand_off()

        host = snapshot_host("backfill", "o-1", "o-2")
        with self.assertRaises(PolicyError) as raised:
            handoff.run(types.SimpleNamespace(decide=decide), settings(max_events=2), host)
        self.assertEqual(
            str(raised.exception), "decide failed on event %s (snapshot): KeyError: 'sku'" % handoff.event_id(token(11))
        )

        def init(s):
            raise ValueError("no prefix")

        host = snapshot_host("backfill", "o-1")
        with self.assertRaises(PolicyError) as raised:
            handoff.run(types.SimpleNamespace(init=init, decide=decide), settings(max_events=1), host)
        self.assertEqual(str(raised.exception), "init refused the settings: ValueError: no prefix")
        self.assertEqual((host.opened, host.commits), (None, []))


RECORD_JSON = (
    '{"_id": "c/abc", "event": {"operationType": "delete", "documentKey": {"_id": {"$oid": "6740a1b2c3d4e5f601234567"}}}}'
)


class DeliveryTest(unittest.TestCase):
    """Contract 1.6: the decisions module's optional ``effect`` and ``classify``."""

    def record(self, sink=handoff.WEBHOOK):
        return handoff.DeliveryRecord("hooks", sink, RECORD_JSON)

    def test_a_record_reads_by_dotted_path(self):
        record = self.record()
        self.assertEqual(record.id, "c/abc")
        self.assertEqual(record.field("event.operationType"), "delete")
        self.assertEqual(record.field("event.documentKey._id"), {"$oid": "6740a1b2c3d4e5f601234567"})
        self.assertIsNone(record.field("event.fullDocument.total"))
        self.assertIsNone(record.field("_id.nothing"))

    def test_a_module_without_effect_or_classify_gets_the_hosts_default(self):
        decisions = default_policy()
        self.assertIsNone(handoff.effect_of(decisions, self.record()))
        failure = handoff.DeliveryFailure("c/abc", handoff.WEBHOOK, 1, True, 503, "503")
        self.assertIsNone(handoff.classify_failure(decisions, failure))

    def test_requests_are_serialized_as_the_contract_takes_them(self):
        def effect(record):
            if record.sink == handoff.PROJECTION:
                return None
            if record.field("event.operationType") == "delete":
                return handoff.request(
                    handoff.POST,
                    key=record.field("event.documentKey._id"),
                    version=7,
                    body={"deleted": True, "id": record.id},
                    headers={"x-kind": "removal"},
                )
            return handoff.refuse("not shaped")

        decisions = types.SimpleNamespace(effect=effect)
        self.assertIsNone(handoff.effect_of(decisions, self.record(handoff.PROJECTION)))
        answer = handoff.effect_of(decisions, self.record())
        self.assertEqual(
            answer,
            handoff.SinkRequest(
                "post",
                '{"$oid":"6740a1b2c3d4e5f601234567"}',
                7,
                '{"deleted":true,"id":"c/abc"}',
                [("x-kind", "removal")],
            ),
        )
        self.assertEqual(handoff.request(handoff.UPSERT, key="o-1").key, '"o-1"')
        self.assertEqual(handoff.request(handoff.DELETE, body='{"a": 1}').body, '{"a": 1}')
        refusing = types.SimpleNamespace(effect=lambda r: handoff.refuse(42))
        self.assertEqual(handoff.effect_of(refusing, self.record()), handoff.Refuse("42"))

    def test_a_wrong_request_or_answer_is_refused_at_once(self):
        for bad in (
            lambda: handoff.request("shout"),
            lambda: handoff.request(handoff.POST, version=-1),
            lambda: handoff.request(handoff.POST, version=2**64),
            lambda: handoff.request(handoff.POST, version=True),
            lambda: handoff.request(handoff.POST, version=1.5),
            lambda: handoff.request(handoff.POST, body=[1, 2]),
            lambda: handoff.request(handoff.POST, headers=[("a", 1)]),
            lambda: handoff.request(handoff.POST, headers=[("a",)]),
        ):
            with self.assertRaises(ValueError):
                bad()
        with self.assertRaises(PolicyError):
            handoff.effect_of(types.SimpleNamespace(effect=lambda r: "post"), self.record())
        with self.assertRaises(PolicyError):
            handoff.classify_failure(types.SimpleNamespace(classify=lambda f: "later"), None)

    def test_classify_answers_a_verdict_or_none(self):
        def classify(failure):
            if failure.http_status == 409:
                return handoff.IGNORE
            if failure.attempt >= 3:
                return handoff.DEAD
            return None

        decisions = types.SimpleNamespace(classify=classify)
        failure = lambda status, attempt: handoff.DeliveryFailure("c/abc", handoff.WEBHOOK, attempt, False, status, "")
        self.assertEqual(handoff.classify_failure(decisions, failure(409, 1)), "ignore")
        self.assertEqual(handoff.classify_failure(decisions, failure(500, 3)), "dead")
        self.assertIsNone(handoff.classify_failure(decisions, failure(500, 1)))


if __name__ == "__main__":
    unittest.main()
