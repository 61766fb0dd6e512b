"""A deployment switches between the Python task and `handoff` mid-stream, in both directions,
with no event lost or handed off twice; event IDs are computed here by PyMongo itself."""

import datetime
import hashlib
import uuid

from bson import json_util

from handoff_cli import handoff_run
from baseline_task import run_handoff  # the baseline task's logic, run as a test oracle

CONSUMER = "orders-to-outbox"


def baseline_event_id(token):
    return hashlib.sha256(json_util.dumps(token, sort_keys=True).encode()).hexdigest()


def python_task(sim, db):
    return run_handoff(sim.uri, db, "orders", CONSUMER, "kestra_change_checkpoints", "kestra_change_outbox", 50, 1)


def rust_task(sim, db):
    code, outputs, stderr = handoff_run(sim.uri, db)
    assert code == 0, stderr
    return outputs


def test_switching_between_the_python_task_and_handoff_loses_and_repeats_nothing(sim):
    client = sim.client()
    db_name = "compat_" + uuid.uuid4().hex[:8]
    db = client[db_name]
    orders = db["orders"]

    assert python_task(sim, db_name)["status"] == "IDLE"  # the Python task starts the consumer
    orders.insert_many([{"_id": i} for i in range(3)])
    assert python_task(sim, db_name)["events_handed_off"] == 3

    orders.insert_many([{"_id": i} for i in range(3, 6)])
    out = rust_task(sim, db_name)  # handoff continues after the Python task's checkpoint
    assert (out["status"], out["events_handed_off"]) == ("HANDED_OFF", 3)

    orders.update_one({"_id": 0}, {"$set": {"x": 1}})
    orders.delete_one({"_id": 1})
    assert python_task(sim, db_name)["events_handed_off"] == 2  # and the Python task after handoff

    orders.drop()
    out = rust_task(sim, db_name)
    assert out["status"] == "INVALIDATED"
    checkpoint = db["kestra_change_checkpoints"].find_one({"_id": CONSUMER})
    assert checkpoint["mode"] == "startAfter"

    db["orders"].insert_one({"_id": "reborn"})
    result = python_task(sim, db_name)  # the Python task honours handoff's startAfter
    assert result["events_handed_off"] == 1

    db["orders"].insert_one({"_id": "again"})
    assert rust_task(sim, db_name)["events_handed_off"] == 1

    records = list(db["kestra_change_outbox"].find({}))
    ops = [r["event"]["operationType"] for r in records]
    assert ops == ["insert"] * 6 + ["update", "delete", "drop", "insert", "insert"]
    ids = [r["_id"] for r in records]
    assert len(set(ids)) == len(ids)
    for record in records:
        # Both writers derive the same ID from the token, byte for byte.
        assert record["_id"] == f"{CONSUMER}/{baseline_event_id(record['event']['_id'])}"
        assert record["consumer"] == CONSUMER and record["source"] == f"{db_name}.orders"
    client.close()


def test_handoff_reads_outputs_the_flow_expects(sim):
    db_name = "outputs_" + uuid.uuid4().hex[:8]
    code, outputs, stderr = handoff_run(sim.uri, db_name)
    assert code == 0, stderr
    assert outputs["status"] == "IDLE"
    assert isinstance(outputs["events_handed_off"], int)
    assert outputs["consumer_id"] == CONSUMER
    assert len(outputs["policy_sha256"]) == 64


def test_the_python_task_ignores_the_lease_revision_and_configuration_handoff_records(sim):
    client = sim.client()
    db_name = "binding_" + uuid.uuid4().hex[:8]
    db = client[db_name]
    checkpoints = db["kestra_change_checkpoints"]

    assert rust_task(sim, db_name)["status"] == "IDLE"  # handoff creates the consumer
    created = checkpoints.find_one({"_id": CONSUMER})
    assert created["revision"] >= 2 and created["owner"].startswith("handoff@")
    assert created["config"]["fullDocument"] == "updateLookup"
    assert created["configDigest"].startswith("sha256:")

    # A run elsewhere holds the lease: handoff stops at its start, the Python task (which knows
    # no lease) goes on, its compare-and-set on {_id, token, source} unaffected by the new fields.
    held_until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
    checkpoints.update_one({"_id": CONSUMER}, {"$set": {"owner": "handoff@elsewhere:1:1", "leaseUntil": held_until}})
    db["orders"].insert_many([{"_id": i} for i in range(3)])
    code, outputs, stderr = handoff_run(sim.uri, db_name)
    assert code == 3 and "holds this consumer" in stderr, stderr
    assert outputs["events_handed_off"] == 0
    assert python_task(sim, db_name)["events_handed_off"] == 3
    after_python = checkpoints.find_one({"_id": CONSUMER})
    assert after_python["revision"] == created["revision"]  # the Python task counts nothing
    assert after_python["config"] == created["config"] and after_python["owner"] == "handoff@elsewhere:1:1"

    # Once the lease has expired, handoff continues after the Python task's checkpoint.
    checkpoints.update_one({"_id": CONSUMER}, {"$set": {"leaseUntil": datetime.datetime(2000, 1, 1)}})
    db["orders"].insert_many([{"_id": i} for i in range(3, 5)])
    out = rust_task(sim, db_name)
    assert out["events_handed_off"] == 2
    final = checkpoints.find_one({"_id": CONSUMER})
    assert final["revision"] > after_python["revision"] and final["owner"] != "handoff@elsewhere:1:1"

    records = list(db["kestra_change_outbox"].find({}))
    ids = [r["_id"] for r in records]
    assert len(ids) == 5 and len(set(ids)) == 5
    client.close()
