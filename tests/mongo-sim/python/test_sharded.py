"""A two-shard cluster (`--shards 2`) as PyMongo sees it: a mongos in front of two shards whose
change streams merge in cluster-time order."""

from pymongo import MongoClient
from pymongo.errors import OperationFailure
import pytest


def next_change(stream, tries=100):
    for _ in range(tries):
        change = stream.try_next()
        if change is not None:
            return change
    raise AssertionError("no change event")


def test_sharded_cluster_smoke(start_server):
    s = start_server("--shards", "2", "--noop-interval-ms", "50")
    with MongoClient(f"mongodb://{s.address}/", serverSelectionTimeoutMS=5000) as c:
        hello = c.admin.command("hello")
        assert hello["msg"] == "isdbgrid"
        assert "setName" not in hello
        assert c.topology_description.topology_type_name == "Sharded"
        assert [sh["_id"] for sh in c.admin.command("listShards")["shards"]] == ["shard0", "shard1"]
        with pytest.raises(OperationFailure) as err:
            c.admin.command("replSetGetStatus")
        assert err.value.code == 59

        c.admin.command("shardCollection", "smoke.orders", key={"_id": "hashed"})
        coll = c.smoke.orders
        with coll.watch([], max_await_time_ms=100) as stream:
            with c.start_session() as session:
                session.with_transaction(
                    lambda s: coll.insert_many([{"_id": i} for i in range(6)], session=s)
                )
            changes = [next_change(stream) for _ in range(6)]
        assert [ch["documentKey"] for ch in changes] == [{"_id": i} for i in range(6)]
        assert len({ch["clusterTime"] for ch in changes}) == 1
        chunks = list(c.config.chunks.find({"ns": "smoke.orders"}))
        assert sorted(ch["shard"] for ch in chunks) == ["shard0", "shard1"]
