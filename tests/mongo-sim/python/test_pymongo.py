"""The mongo-sim server as PyMongo 4.15 sees it.

With MONGODB_URI set, the tests that hold for any replica set run against that deployment (the
same expectations, checked against MongoDB itself); those about the test server's own handshake
or configuration keep a test server (`sim_server`, `start_server`)."""

import hashlib
import threading
import time
import uuid

import pytest
from bson import ObjectId, json_util
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from baseline_task import run_handoff


def fresh(name):
    return f"{name}_{uuid.uuid4().hex[:8]}"


def test_hello_identifies_a_replica_set_primary(sim_server, sim_client):
    # Always a test server: its own handshake (one node at its address, no topologyVersion).
    server, client = sim_server, sim_client
    hello = client.admin.command("hello")
    assert hello["ok"] == 1
    assert hello["isWritablePrimary"] is True
    assert hello["secondary"] is False
    assert hello["setName"] == "rs0"
    assert hello["hosts"] == [server.address]
    assert hello["primary"] == server.address
    assert hello["me"] == server.address
    assert hello["maxWireVersion"] >= 17
    assert hello["logicalSessionTimeoutMinutes"] == 30
    assert isinstance(hello["electionId"], ObjectId)
    assert "topologyVersion" not in hello
    legacy = client.admin.command("isMaster")
    assert legacy["ismaster"] is True
    # The topology PyMongo discovered is a replica set with a writable primary.
    assert client.topology_description.topology_type_name == "ReplicaSetWithPrimary"


def test_direct_connection(sim_server):
    # Always a test server: a direct connection to the one node it is.
    server = sim_server
    with MongoClient(server.direct_uri, serverSelectionTimeoutMS=5000) as c:
        assert c.admin.command("ping")["ok"] == 1
        c.direct_db.things.insert_one({"_id": 1})
        assert c.direct_db.things.find_one({"_id": 1}) == {"_id": 1}


def test_repl_set_get_config_has_a_fixed_replica_set_id(server, client):
    first = client.admin.command("replSetGetConfig")["config"]
    second = client.admin.command("replSetGetConfig")["config"]
    rs_id = first["settings"]["replicaSetId"]
    assert isinstance(rs_id, ObjectId)
    assert rs_id == second["settings"]["replicaSetId"]
    assert first["_id"] == server.set_name


def test_replica_set_id_and_set_name_are_configurable(start_server):
    s = start_server("--replica-set-id", "65f0a1b2c3d4e5f601234567", "--set-name", "blue")
    with s.client() as c:
        assert c.admin.command("hello")["setName"] == "blue"
        config = c.admin.command("replSetGetConfig")["config"]
        assert config["settings"]["replicaSetId"] == ObjectId("65f0a1b2c3d4e5f601234567")


def test_standalone_is_refused_by_replica_set_checks(start_server):
    s = start_server("--standalone")
    with MongoClient(s.direct_uri, serverSelectionTimeoutMS=5000) as c:
        assert not c.admin.command("hello").get("setName")
        with pytest.raises(OperationFailure) as err:
            c.admin.command("replSetGetConfig")
        assert err.value.code == 76


def test_upsert_with_set_on_insert_and_find_one(db):
    coll = db[fresh("checkpoints")]
    update = {"$setOnInsert": {"source": "py_crud.orders", "replicaSetId": "x", "token": None, "mode": "resumeAfter"}}
    first = coll.update_one({"_id": "consumer"}, update, upsert=True)
    assert first.upserted_id == "consumer"
    assert first.matched_count == 0 and first.modified_count == 0
    second = coll.update_one({"_id": "consumer"}, update, upsert=True)
    assert second.upserted_id is None
    assert second.matched_count == 1 and second.modified_count == 0
    doc = coll.find_one({"_id": "consumer"})
    assert doc == {"_id": "consumer", "source": "py_crud.orders", "replicaSetId": "x", "token": None, "mode": "resumeAfter"}
    assert coll.find_one({"_id": "nobody"}) is None
    changed = coll.update_one({"_id": "consumer", "token": None, "source": "py_crud.orders"}, {"$set": {"token": {"_data": "82AB"}}})
    assert changed.matched_count == 1 and changed.modified_count == 1
    stale = coll.update_one({"_id": "consumer", "token": None, "source": "py_crud.orders"}, {"$set": {"token": {"_data": "82CD"}}})
    assert stale.matched_count == 0


def test_unacknowledged_writes(db):
    coll = db[fresh("w0")]
    coll.with_options(write_concern=WriteConcern(w=0)).insert_one({"_id": 1})
    deadline = time.monotonic() + 5
    while coll.find_one({"_id": 1}) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_with_transaction_commits_update_and_insert(client, db):
    checkpoints, outbox = db[fresh("cp")], db[fresh("out")]
    checkpoints.insert_one({"_id": "c", "token": None, "source": "py_txn.src"})

    def handoff(session):
        changed = checkpoints.update_one(
            {"_id": "c", "token": None, "source": "py_txn.src"},
            {"$set": {"token": {"_data": "8201"}, "mode": "resumeAfter"}},
            session=session,
        )
        assert changed.matched_count == 1
        outbox.insert_one({"_id": "c/1", "event": {"n": 1}}, session=session)

    with client.start_session() as session:
        session.with_transaction(handoff)
    assert checkpoints.find_one({"_id": "c"})["token"] == {"_data": "8201"}
    assert outbox.count_documents({}) == 1


def test_with_transaction_retries_an_injected_write_conflict(client, db):
    outbox = db[fresh("out")]
    client.admin.command(
        "configureFailPoint", "failCommand", mode={"times": 1}, data={"failCommands": ["insert"], "errorCode": 112}
    )
    attempts = []

    def handoff(session):
        attempts.append(1)
        outbox.insert_one({"_id": "once"}, session=session)

    try:
        with client.start_session() as session:
            session.with_transaction(handoff)
    finally:
        # Left on, it would strike the next tests on a shared deployment.
        client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert len(attempts) == 2
    assert outbox.count_documents({}) == 1


def test_aborted_transaction_leaves_nothing(client, db):
    coll = db[fresh("abort")]
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": 1}, session=session)
        session.abort_transaction()
    assert coll.find_one({"_id": 1}) is None


def watch_next(stream, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = stream.try_next()
        if event is not None:
            return event
    raise AssertionError("no change event")


def test_watch_resume_after_and_start_after(db):
    coll = db[fresh("orders")]
    options = {"full_document": "updateLookup", "max_await_time_ms": 1000}
    with coll.watch([], **options) as stream:
        assert stream.try_next() is None
        idle_token = stream.resume_token
        assert idle_token is not None and idle_token["_data"].startswith("82")
        coll.insert_one({"_id": 1, "state": "new"})
        coll.update_one({"_id": 1}, {"$set": {"state": "paid"}})
        inserted = watch_next(stream)
        assert inserted["operationType"] == "insert"
        assert inserted["fullDocument"] == {"_id": 1, "state": "new"}
        updated = watch_next(stream)
        assert updated["operationType"] == "update"
        assert updated["fullDocument"] == {"_id": 1, "state": "paid"}
        assert updated["updateDescription"]["updatedFields"] == {"state": "paid"}
        assert stream.resume_token is not None
    # Resuming after the idle token replays both events; after the insert, only the update.
    with coll.watch([], resume_after=idle_token, **options) as stream:
        assert watch_next(stream)["_id"] == inserted["_id"]
        assert watch_next(stream)["_id"] == updated["_id"]
    with coll.watch([], resume_after=inserted["_id"], **options) as stream:
        assert watch_next(stream)["_id"] == updated["_id"]
        assert stream.try_next() is None
    with coll.watch([], start_after=inserted["_id"], **options) as stream:
        assert watch_next(stream)["_id"] == updated["_id"]


def test_try_next_waits_for_max_await(db):
    coll = db[fresh("idle")]
    with coll.watch([], max_await_time_ms=1000) as stream:
        started = time.monotonic()
        assert stream.try_next() is None
        assert time.monotonic() - started >= 0.9

        def later():
            time.sleep(0.2)
            coll.insert_one({"_id": "late"})

        t = threading.Thread(target=later)
        t.start()
        event = watch_next(stream)
        t.join()
        assert event["documentKey"] == {"_id": "late"}


def test_drop_invalidates_and_start_after_continues(db):
    coll = db[fresh("dropme")]
    coll.insert_one({"_id": 0})
    with coll.watch([], max_await_time_ms=1000) as stream:
        coll.insert_one({"_id": 1})
        coll.drop()
        assert watch_next(stream)["operationType"] == "insert"
        assert watch_next(stream)["operationType"] == "drop"
        invalidate = watch_next(stream)
        assert invalidate["operationType"] == "invalidate"
        assert not stream.alive
    with pytest.raises(OperationFailure) as err:
        with coll.watch([], resume_after=invalidate["_id"]) as s:
            s.try_next()
    assert err.value.code == 260
    with coll.watch([], start_after=invalidate["_id"], max_await_time_ms=1000) as stream:
        coll.insert_one({"_id": 2})
        assert watch_next(stream)["documentKey"] == {"_id": 2}


def test_history_loss_is_reported(start_server):
    s = start_server("--history-limit", "3")
    with s.client() as c:
        coll = c.lost.events
        with coll.watch([], max_await_time_ms=100) as stream:
            coll.insert_one({"_id": 0})
            first = watch_next(stream)
        for i in range(1, 10):
            coll.insert_one({"_id": i})
        with pytest.raises(OperationFailure) as err:
            with coll.watch([], resume_after=first["_id"]) as stream:
                stream.try_next()
        assert err.value.code == 286
        assert err.value.has_error_label("NonResumableChangeStreamError")


def test_baseline_handoff_end_to_end(server, db):
    db_name = db.name
    args = dict(uri=server.uri, db_name=db_name, source_name="orders", consumer="orders-to-outbox",
                checkpoint_name="kestra_change_checkpoints", outbox_name="kestra_change_outbox")

    # First run: no checkpoint yet; catches up immediately and saves an idle watermark.
    out = run_handoff(**args, max_events=50, wait_seconds=1)
    assert out["status"] == "IDLE" and out["events_handed_off"] == 0
    checkpoint = db.kestra_change_checkpoints.find_one({"_id": "orders-to-outbox"})
    assert checkpoint["token"]["_data"].startswith("82")
    assert checkpoint["mode"] == "resumeAfter"

    # Events written between runs are handed off exactly once, in order.
    for i in range(5):
        db.orders.insert_one({"_id": i, "total": i * 10})
    db.orders.update_one({"_id": 0}, {"$set": {"total": 99}})
    out = run_handoff(**args, max_events=4, wait_seconds=1)
    assert out == {"status": "HANDED_OFF", "events_handed_off": 4, "last_event_id": out["last_event_id"],
                   "consumer_id": "orders-to-outbox"}
    out = run_handoff(**args, max_events=50, wait_seconds=1)
    assert out["status"] == "HANDED_OFF" and out["events_handed_off"] == 2
    outbox = list(db.kestra_change_outbox.find({}))
    assert len(outbox) == 6
    for record in outbox:
        event_id = hashlib.sha256(json_util.dumps(record["event"]["_id"], sort_keys=True).encode()).hexdigest()
        assert record["_id"] == f"orders-to-outbox/{event_id}"
        assert record["source"] == f"{db_name}.orders"
    updates = [r["event"] for r in outbox if r["event"]["operationType"] == "update"]
    assert updates and updates[0]["fullDocument"] == {"_id": 0, "total": 99}

    # A run with nothing new stays idle and hands off nothing twice.
    out = run_handoff(**args, max_events=50, wait_seconds=1)
    assert out["status"] == "IDLE" and out["events_handed_off"] == 0
    assert db.kestra_change_outbox.count_documents({}) == 6

    # Dropping the source invalidates; the next run starts after the invalidate.
    db.orders.drop()
    out = run_handoff(**args, max_events=50, wait_seconds=1)
    assert out["status"] == "INVALIDATED"
    assert out["events_handed_off"] == 1, "the drop event is handed off, the invalidate is not"
    checkpoint = db.kestra_change_checkpoints.find_one({"_id": "orders-to-outbox"})
    assert checkpoint["mode"] == "startAfter"
    db.orders.insert_one({"_id": "after-recreate"})
    out = run_handoff(**args, max_events=50, wait_seconds=1)
    assert out["status"] == "HANDED_OFF" and out["events_handed_off"] == 1
    assert db.kestra_change_outbox.count_documents({}) == 8


def test_baseline_handoff_reports_history_loss(start_server):
    s = start_server("--history-limit", "5")
    args = dict(uri=s.uri, db_name="change_demo", source_name="orders", consumer="c1",
                checkpoint_name="checkpoints", outbox_name="outbox")
    assert run_handoff(**args, max_events=50, wait_seconds=1)["status"] == "IDLE"
    with s.client() as c:
        for i in range(20):
            c.change_demo.orders.insert_one({"_id": i})
    with pytest.raises(RuntimeError) as err:
        run_handoff(**args, max_events=50, wait_seconds=1)
    assert "code 286" in str(err.value)
    with s.client() as c:
        assert c.change_demo.outbox.count_documents({}) == 0
