"""Replicas over a three-node coordinator whose leader is SIGKILLed while inserts go on: the
replicas' sessions move to the other nodes, an insert whose answer was lost is retried with
its deduplication token, and every block is on both replicas once."""

import time

from replicas import Replica, wait_until
from services import leader_of, start_cluster

PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


def insert_until_done(replica, sql, attempts=60):
    """A client's retry of one insert (the same token each time) until it is acknowledged."""
    for _ in range(attempts):
        code, _, stderr = replica.run(sql)
        if code == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{sql} never succeeded: {stderr}")


def test_the_coordinator_leader_killed_during_inserts_loses_and_duplicates_nothing(tmp_path):
    (tmp_path / "coordinator").mkdir()
    nodes = start_cluster(tmp_path / "coordinator", size=3)
    hosts = ",".join(n.hosts for n in nodes)
    r1, r2 = Replica(tmp_path, hosts, "r1").start(), Replica(tmp_path, hosts, "r2").start()
    table = "faults"
    try:
        for replica in (r1, r2):
            replica.query(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = ReplicatedMergeTree({PATH}) "
                          "ORDER BY k")
        killed = None
        for i in range(30):
            if i in (8, 18):
                killed = leader_of(nodes)
                killed.kill()
            if i in (13, 23) and killed is not None:
                killed.start()
                killed = None
            replica = (r1, r2)[i % 2]
            insert_until_done(replica, f"SET insert_deduplication_token = 'b{i}'; "
                                       f"INSERT INTO {table} VALUES ({i}, 'v{i}')")
        for replica in (r1, r2):
            wait_until(lambda: replica.run(f"SYSTEM SYNC REPLICA {table}")[0] == 0, 60, "the replica synced")
            assert replica.query(f"SELECT count(), uniqExact(k), sum(k) FROM {table}").split() == \
                ["30", "30", str(sum(range(30)))]
    finally:
        r1.stop()
        r2.stop()
        for node in nodes:
            node.stop()
