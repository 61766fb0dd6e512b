"""The baseline handoff task, as the PyMongo suites and the live benchmark run it.

Its body mirrors the production script; only the environment lookup, the Kestra output call and
the idle loop's clock are adapted. Run as a program, it is one task run: its arguments are
`uri db source consumer checkpoints outbox max_events wait_seconds`, and it prints its outputs as
one JSON line.
"""

import hashlib
import json
import sys
import time

from bson import json_util
from pymongo import MongoClient
from pymongo.errors import PyMongoError


def run_handoff(uri, db_name, source_name, consumer, checkpoint_name, outbox_name, max_events, wait_seconds):
    client = MongoClient(uri, serverSelectionTimeoutMS=3000, retryWrites=True)
    try:
        hello = client.admin.command("hello")
        if not hello.get("setName"):
            raise RuntimeError("This blueprint requires a MongoDB replica set, not a standalone server or mongos")
        config = client.admin.command("replSetGetConfig")["config"]
        replica_set_id = str(config.get("settings", {}).get("replicaSetId", ""))
        if not replica_set_id:
            raise RuntimeError("The replica set did not return replicaSetId")
        db = client[db_name]
        source = db[source_name]
        checkpoints = db[checkpoint_name]
        outbox = db[outbox_name]
        checkpoints.update_one(
            {"_id": consumer},
            {"$setOnInsert": {"source": f"{db_name}.{source_name}", "replicaSetId": replica_set_id,
                              "token": None, "mode": "resumeAfter"}},
            upsert=True,
        )
        checkpoint = checkpoints.find_one({"_id": consumer})
        expected_source = f"{db_name}.{source_name}"
        if checkpoint.get("source") != expected_source:
            raise RuntimeError("Consumer checkpoint belongs to another source")
        if checkpoint.get("replicaSetId") != replica_set_id:
            raise RuntimeError("Consumer checkpoint belongs to another replica set")
        token = checkpoint.get("token")
        mode = checkpoint.get("mode", "resumeAfter")
        if mode not in ("resumeAfter", "startAfter") or (token is not None and not isinstance(token, dict)):
            raise RuntimeError("Checkpoint is malformed")
        options = {"full_document": "updateLookup", "max_await_time_ms": 1000}
        if token is not None:
            options["start_after" if mode == "startAfter" else "resume_after"] = token
        count = 0
        handed_off = 0
        last_id = ""
        status = "IDLE"
        deadline = time.monotonic() + wait_seconds
        try:
            with source.watch([], **options) as stream:
                while count < max_events and time.monotonic() < deadline:
                    event = stream.try_next()
                    if event is None:
                        continue
                    next_token = event["_id"]
                    event_id = hashlib.sha256(json_util.dumps(next_token, sort_keys=True).encode()).hexdigest()
                    next_mode = "startAfter" if event["operationType"] == "invalidate" else "resumeAfter"

                    def commit_handoff(session):
                        changed = checkpoints.update_one(
                            {"_id": consumer, "token": token, "source": expected_source},
                            {"$set": {"token": next_token, "mode": next_mode}},
                            session=session,
                        )
                        if changed.matched_count != 1:
                            raise RuntimeError("Checkpoint changed during this run")
                        if next_mode == "resumeAfter":
                            outbox.insert_one(
                                {"_id": f"{consumer}/{event_id}", "consumer": consumer,
                                 "source": expected_source, "event": event},
                                session=session,
                            )

                    with client.start_session() as session:
                        session.with_transaction(commit_handoff)
                    token = next_token
                    count += 1
                    if next_mode == "resumeAfter":
                        handed_off += 1
                        last_id = event_id
                    status = "INVALIDATED" if next_mode == "startAfter" else "HANDED_OFF"
                    deadline = time.monotonic() + wait_seconds
                    if next_mode == "startAfter":
                        break
                if count < max_events and status != "INVALIDATED":
                    watermark = stream.resume_token
                    if watermark is None and token is None:
                        raise RuntimeError("MongoDB did not provide an idle resume token")
                    if watermark is not None and watermark != token:
                        advanced = checkpoints.update_one(
                            {"_id": consumer, "token": token, "source": expected_source},
                            {"$set": {"token": watermark, "mode": "resumeAfter"}},
                        )
                        if advanced.matched_count != 1:
                            raise RuntimeError("Checkpoint changed while saving the idle watermark")
                        token = watermark
        except PyMongoError as exc:
            detail = getattr(exc, "details", None)
            message = detail.get("errmsg", "") if isinstance(detail, dict) else ""
            cause = f"{exc.__class__.__name__} (code {getattr(exc, 'code', 'n/a')}): {message[:180]}"
            if token is not None:
                raise RuntimeError(
                    "Change-stream read or atomic handoff failed. Check MongoDB and the oplog window; "
                    f"MongoDB error: {cause}"
                ) from exc
            raise
    finally:
        client.close()
    return {"status": status, "events_handed_off": handed_off, "last_event_id": last_id, "consumer_id": consumer}


if __name__ == "__main__":
    uri, db_name, source_name, consumer, checkpoint_name, outbox_name, max_events, wait_seconds = sys.argv[1:9]
    outputs = run_handoff(uri, db_name, source_name, consumer, checkpoint_name, outbox_name,
                          int(max_events), float(wait_seconds))
    print(json.dumps(outputs))
