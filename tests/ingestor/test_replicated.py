"""The ingestor into a replicated table: each block, its log entry, its part node, its dedup
node and its offset node commit in one multi on the coordinator, exactly once, also while the
ingestors and the storage node are SIGKILLed."""

import json
import random
import re
import time

import pytest
from kazoo.client import KazooClient

from ingest_services import (
    Ingestor, StorageNode, free_port, kill_and_restart_while_producing, table_state, wait_for_rows, wait_until,
)
from services import leader_of, start_cluster
from test_kafka import PARTITIONS, messages, write_pipeline

ENGINE = "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')"
# The tests count every block's log entry: the leader's cleanup of old entries waits an hour.
KEEP_LOG = "SETTINGS cleanup_delay_period = 3600"


@pytest.fixture
def replica(tmp_path, keeper):
    node = StorageNode(tmp_path, keeper.hosts, name="r1", extra_args=["--replica", "r1", "--macro", "shard=07"]).start()
    yield node
    node.kill()


@pytest.fixture
def kazoo(keeper):
    client = KazooClient(hosts=keeper.hosts)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def offsets(kazoo, pipeline, table, topic):
    base = f"/mergestream/pipelines/{pipeline}/offsets/{table}/{topic}"
    return {int(p): json.loads(kazoo.get(f"{base}/{p}")[0])["next"] for p in kazoo.get_children(base)}


def committed_parts(kazoo, table):
    """(GET_PART log entries, dedup nodes, parts listed under r1)."""
    root = f"/clickhouse/tables/07/default/{table}"
    log = kazoo.get_children(f"{root}/log")
    inserts = sum(1 for e in log if b"\nget\n" in kazoo.get(f"{root}/log/{e}")[0])
    blocks = kazoo.get_children(f"{root}/blocks")
    parts = sorted(kazoo.get_children(f"{root}/replicas/r1/parts"))
    return inserts, len(blocks), parts


def active(replica, table):
    return sorted(replica.query(f"SELECT name FROM system.parts WHERE table = '{table}' AND active").split())


def test_blocks_and_offsets_commit_together(tmp_path, broker, keeper, replica, kazoo, topic):
    broker.create_topic(topic, PARTITIONS)
    broker.produce(topic, messages(range(2000)))
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "rep", engine=ENGINE, settings=KEEP_LOG)
    ingestor = Ingestor(tmp_path, pipeline, replica, keeper.hosts).start()
    wait_for_rows(replica, "rep", 2000)
    assert table_state(replica, "rep") == (2000, 2000, sum(i * 3 for i in range(2000)))
    assert ingestor.terminate() == 0, ingestor.output()
    assert offsets(kazoo, "rep", "rep", topic) == {p: 500 for p in range(PARTITIONS)}
    inserts, blocks, parts = committed_parts(kazoo, "rep")
    # One GET_PART entry and one dedup node per block the ingestor sent; the parts listed
    # under the replica are its active ones (merged through the log meanwhile, maybe).
    assert inserts == blocks and inserts >= PARTITIONS
    assert parts == active(replica, "rep")


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_exactly_once_into_a_replicated_table_under_sigkill(tmp_path, broker, keeper, replica, kazoo, topic, seed):
    n = 10_000
    broker.create_topic(topic, PARTITIONS)
    table = f"repeo{seed}"
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, table, engine=ENGINE, settings=KEEP_LOG)
    a = Ingestor(tmp_path, pipeline, replica, keeper.hosts, name="a").start()
    b = Ingestor(tmp_path, pipeline, replica, keeper.hosts, name="b").start()

    def produce():
        for chunk in range(10):
            broker.produce(topic, messages(range(chunk * 1000, (chunk + 1) * 1000)))
            time.sleep(0.3)

    kill_and_restart_while_producing(produce, {"a": a, "b": b, "storage": replica}, seed=seed)
    wait_for_rows(replica, table, n, timeout=180)
    time.sleep(2)  # late duplicates, if there were any, would land now
    assert table_state(replica, table) == (n, n, sum(i * 3 for i in range(n)))
    for ingestor in (a, b):
        assert ingestor.terminate() == 0, ingestor.output()
    assert sum(offsets(kazoo, table, table, topic).values()) == n
    inserts, blocks, parts = committed_parts(kazoo, table)
    assert inserts == blocks, "every committed block has its log entry and its dedup node"
    wait_until(lambda: committed_parts(kazoo, table)[2] == active(replica, table), 30, "parts listed as active")


@pytest.mark.parametrize("engine", [ENGINE, "MergeTree"])
def test_a_block_committed_just_before_a_crash_is_activated_once_at_restart(
        tmp_path, broker, keeper, replica, kazoo, topic, engine):
    """The storage node dies right after the coordinator took a block's commit (its offset
    moved), before the parts are active: the next start finds the prepared insert, sees the
    commit, and activates the block — under the part name it committed, for a replicated
    table — without committing it again. The restart is slow to resolve it (slow-recovery):
    replication waits for it, so the listed part is never taken for a lost one."""
    table = "crashrep" if engine == ENGINE else "crashlocal"
    broker.create_topic(topic, 1)
    broker.produce(topic, [(0, b"k", json.dumps({"id": i, "payload": {"v": i}}).encode(), None) for i in range(300)])
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, table, engine=engine,
                              batch="{ max_rows: 300, max_ms: 60000 }")
    replica.kill()
    replica.env = {"MERGESTREAM_FAILPOINTS": "after-commit-before-activation"}
    replica.start()
    ingestor = Ingestor(tmp_path, pipeline, replica, keeper.hosts).start()
    deadline = time.monotonic() + 60
    while replica.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not replica.alive(), "the storage node died at the failpoint"
    assert offsets(kazoo, table, table, topic) == {0: 300}, "the commit went through before the crash"
    replica.env = {"MERGESTREAM_LOG": "info", "MERGESTREAM_FAILPOINTS": "slow-recovery"}
    replica.start()
    assert "committed=true" in open(replica.log_path).read(), "the start resolved the prepared insert as committed"
    wait_for_rows(replica, table, 300)
    time.sleep(2)
    log = open(replica.log_path).read()
    assert "lost forever" not in log and "is not here" not in log, "replication started before the recovery"
    assert table_state(replica, table) == (300, 300, sum(range(300)))
    assert ingestor.terminate() == 0, ingestor.output()
    if engine == ENGINE:
        inserts, blocks, parts = committed_parts(kazoo, table)
        assert (inserts, blocks) == (1, 1), "the block was not committed a second time"
        assert parts == active(replica, table) and len(parts) == 1


def quorum_replica(tmp_path, keeper, name, port=None):
    args = ["--replica", name, "--macro", "shard=07", "--interserver-addr", f"127.0.0.1:{port or free_port()}"]
    return StorageNode(tmp_path, keeper.hosts, name=name, extra_args=args)


def test_a_quorum_pipeline_waits_for_its_replicas_and_loses_nothing(tmp_path, broker, keeper, kazoo, topic):
    """`insert: { quorum: 2 }`: while the second replica fetches nothing, blocks commit on the
    first and the partition waits for the quorum; while it is down, blocks are refused before
    they are written (TOO_FEW_LIVE_REPLICAS) and retried. Every message ends up once on both."""
    r1 = quorum_replica(tmp_path, keeper, "r1").start()
    r2_port = free_port()
    r2 = quorum_replica(tmp_path, keeper, "r2", r2_port).start()
    table = "repq"
    root = f"/clickhouse/tables/07/default/{table}"
    try:
        r2.query(f"CREATE TABLE {table} (id UInt64, v UInt64, who String, p UInt32, o UInt64) "
                 f"ENGINE = {ENGINE} ORDER BY id {KEEP_LOG}")
        r2.query(f"SYSTEM STOP FETCHES {table}")
        broker.create_topic(topic, PARTITIONS)
        broker.produce(topic, messages(range(1000)))
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, table, engine=ENGINE, settings=KEEP_LOG,
                                  extra="insert: { quorum: 2, quorum_timeout_ms: 300 }")
        ingestor = Ingestor(tmp_path, pipeline, r1, keeper.hosts).start()
        wait_for_rows(r1, table, 1000)
        # Committed with their offsets on r1, the quorum waited for, nothing on r2 yet.
        wait_until(lambda: "insert quorum not yet reached" in ingestor.output(), 60, "a quorum wait")
        assert table_state(r2, table)[0] == 0
        assert kazoo.get_children(f"{root}/quorum/parallel")
        r2.query(f"SYSTEM START FETCHES {table}")
        wait_for_rows(r2, table, 1000)
        wait_until(lambda: kazoo.get_children(f"{root}/quorum/parallel") == [], 60, "every quorum reached")

        r2.kill()
        wait_until(lambda: not kazoo.exists(f"{root}/replicas/r2/is_active"), 30, "r2 inactive")
        broker.produce(topic, messages(range(1000, 2000)))
        wait_until(lambda: "TOO_FEW_LIVE_REPLICAS" in ingestor.output(), 60, "a refused block")
        # Refused before anything was written: r1 holds none of the new messages.
        assert table_state(r1, table)[0] == 1000
        r2 = quorum_replica(tmp_path, keeper, "r2", r2_port)
        r2.start()
        for replica in (r1, r2):
            wait_for_rows(replica, table, 2000)
        assert ingestor.terminate() == 0, ingestor.output()
        for replica in (r1, r2):
            assert table_state(replica, table) == (2000, 2000, sum(i * 3 for i in range(2000)))
        assert offsets(kazoo, table, table, topic) == {p: 500 for p in range(PARTITIONS)}
    finally:
        r1.kill()
        r2.kill()


@pytest.mark.parametrize("seed", [21, 22])
def test_replicas_killed_under_load_lose_and_duplicate_nothing(tmp_path, broker, keeper, kazoo, topic, seed):
    """Two ingestors write through two replicas (`--storage-node r1,r2` and `r2,r1`); replicas
    are SIGKILLed and started again while messages stream in. Blocks whose node is gone go to
    the other replica with the same token and offset version: every message is on both
    replicas once."""
    n = 10_000
    ports = {name: free_port() for name in ("r1", "r2")}
    r1, r2 = (quorum_replica(tmp_path, keeper, name, ports[name]).start() for name in ("r1", "r2"))
    table = f"repfo{seed}"
    try:
        broker.create_topic(topic, PARTITIONS)
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, table, engine=ENGINE, settings=KEEP_LOG)
        a = Ingestor(tmp_path, pipeline, [r1, r2], keeper.hosts, name="a").start()
        wait_for_rows(r1, table, 0)

        def produce():
            for chunk in range(1, 10):
                broker.produce(topic, messages(range(chunk * 1000, (chunk + 1) * 1000)))
                time.sleep(0.3)

        # r1 first, while the first messages flow, so that `a` must fail over; then either.
        broker.produce(topic, messages(range(1000)))
        r1.kill()
        wait_for_rows(r2, table, 1000)
        r1.start()
        # `a` holds every partition so far: only a failover let its blocks in.
        b = Ingestor(tmp_path, pipeline, [r2, r1], keeper.hosts, name="b").start()
        kill_and_restart_while_producing(produce, {"r1": r1, "r2": r2}, seed=seed, rounds=4)
        for replica in (r1, r2):
            replica.query(f"SYSTEM SYNC REPLICA {table}")
            wait_for_rows(replica, table, n, timeout=180)
        time.sleep(2)  # late duplicates, if there were any, would land now
        for replica in (r1, r2):
            replica.query(f"SYSTEM SYNC REPLICA {table}")
            assert table_state(replica, table) == (n, n, sum(i * 3 for i in range(n)))
        for ingestor in (a, b):
            assert ingestor.terminate() == 0, ingestor.output()
        assert "blocks go to the next replica" in a.output()
        assert sum(offsets(kazoo, table, table, topic).values()) == n
    finally:
        r1.kill()
        r2.kill()


def test_a_retried_quorum_block_found_committed_waits_for_the_quorum_of_its_part(
        tmp_path, broker, keeper, kazoo, topic):
    """r1 commits a quorum block (its offset moves, its quorum opens) and dies before
    answering. The ingestor sends the block again to r2, which finds it committed: its reply
    names the part the first attempt made, so the ingestor waits for that part's quorum as
    the lost reply would have had it wait — not going on as if the block were safe on two
    replicas while only r1's disk holds it."""
    table = "repqdup"
    root = f"/clickhouse/tables/07/default/{table}"
    r1 = quorum_replica(tmp_path, keeper, "r1")
    r1.env = {"MERGESTREAM_FAILPOINTS": "after-commit-before-activation"}
    r1.start()
    r2, r3 = (quorum_replica(tmp_path, keeper, name).start() for name in ("r2", "r3"))
    try:
        ddl = (f"CREATE TABLE {table} (id UInt64, v UInt64, who String, p UInt32, o UInt64) "
               f"ENGINE = {ENGINE} ORDER BY id {KEEP_LOG}")
        for replica in (r1, r2, r3):
            replica.query(ddl)
        for replica in (r2, r3):
            replica.query(f"SYSTEM STOP FETCHES {table}")
        broker.create_topic(topic, 1)
        broker.produce(topic, [(0, b"k", json.dumps({"id": i, "payload": {"v": i}}).encode(), None)
                               for i in range(300)])
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, table, engine=ENGINE, settings=KEEP_LOG,
                                  batch="{ max_rows: 300, max_ms: 60000 }",
                                  extra="insert: { quorum: 2, quorum_timeout_ms: 300 }")
        ingestor = Ingestor(tmp_path, pipeline, [r1, r2], keeper.hosts).start()
        wait_until(lambda: not r1.alive(), 60, "r1 died at the failpoint, after the commit")
        assert offsets(kazoo, table, table, topic) == {0: 300}
        wait_until(lambda: "insert quorum not yet reached" in ingestor.output(), 60, "the ingestor waits")
        assert "all_0_0_0" in ingestor.output(), "for the quorum of the part the first attempt made"
        assert kazoo.get_children(f"{root}/quorum/parallel") == ["all_0_0_0"]

        r1.env = None
        r1.start()  # activates its committed block; r2 and r3 fetch it, and the quorum is reached
        for replica in (r2, r3):
            replica.query(f"SYSTEM START FETCHES {table}")
        wait_until(lambda: kazoo.get_children(f"{root}/quorum/parallel") == [], 60, "the quorum reached")
        for replica in (r1, r2, r3):
            wait_for_rows(replica, table, 300)
            assert table_state(replica, table) == (300, 300, sum(range(300)))
        assert ingestor.terminate() == 0, ingestor.output()
    finally:
        for replica in (r1, r2, r3):
            replica.kill()


def test_a_block_committed_before_a_crash_survives_its_offset_moving_on_through_another_replica(
        tmp_path, broker, keeper, kazoo, topic):
    """r1 commits a block (part node, dedup node and offset in one multi) and dies before its
    part is active. The ingestor goes on through r2: the retried block is a duplicate, the
    next block moves the offset node to r2's attempt. When r1 starts again its prepared
    insert is no longer the one the offset names, but the coordinator lists the part as r1's:
    it is activated, and r2 fetches it. (Dropping it lost the only copy: r2 found no replica
    with the part and declared it lost forever.)"""
    table = "repmoved"
    r1 = quorum_replica(tmp_path, keeper, "r1")
    r1.env = {"MERGESTREAM_FAILPOINTS": "after-commit-before-activation"}
    r1.start()
    r2 = quorum_replica(tmp_path, keeper, "r2").start()
    try:
        ddl = (f"CREATE TABLE {table} (id UInt64, v UInt64, who String, p UInt32, o UInt64) "
               f"ENGINE = {ENGINE} ORDER BY id {KEEP_LOG}")
        for replica in (r1, r2):
            replica.query(ddl)
        broker.create_topic(topic, 1)

        def batch(ids):
            return [(0, b"k", json.dumps({"id": i, "payload": {"v": i}}).encode(), None) for i in ids]

        broker.produce(topic, batch(range(300)))
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, table, engine=ENGINE, settings=KEEP_LOG,
                                  batch="{ max_rows: 300, max_ms: 60000 }")
        ingestor = Ingestor(tmp_path, pipeline, [r1, r2], keeper.hosts).start()
        wait_until(lambda: not r1.alive(), 60, "r1 died at the failpoint, after the commit")
        first = json.loads(kazoo.get(f"/mergestream/pipelines/{table}/offsets/{table}/{topic}/0")[0])
        assert first["next"] == 300
        broker.produce(topic, batch(range(300, 600)))
        wait_until(lambda: offsets(kazoo, table, table, topic) == {0: 600}, 60, "the next block, through r2")
        moved = json.loads(kazoo.get(f"/mergestream/pipelines/{table}/offsets/{table}/{topic}/0")[0])
        assert moved["attempt"] != first["attempt"], "the offset node names r2's attempt now"

        r1.env = {"MERGESTREAM_LOG": "info"}
        r1.start()
        assert "committed=true" in open(r1.log_path).read(), "r1 resolved its prepared insert as committed"
        for replica in (r1, r2):
            replica.query(f"SYSTEM SYNC REPLICA {table}")
            wait_for_rows(replica, table, 600)
            assert table_state(replica, table) == (600, 600, sum(range(600)))
        for replica in (r1, r2):
            assert "lost forever" not in open(replica.log_path).read()
        assert ingestor.terminate() == 0, ingestor.output()
    finally:
        r1.kill()
        r2.kill()


def serving_node(process, nodes):
    """The coordinator node a process's session is on now, from its last connect log line."""
    ports = re.findall(r"succeeds to establish session to tcp://127\.0\.0\.1:(\d+)", process.output())
    return next(n for n in nodes if ports and n.client_port == int(ports[-1]))


@pytest.mark.parametrize("seed", [31, 32])
def test_exactly_once_while_the_coordinator_leader_is_killed(tmp_path, broker, topic, seed):
    """Two ingestors stream into two replicas over a three-node coordinator whose leader is
    SIGKILLed twice (and started again) while messages flow: the sessions of the storage
    nodes and ingestors move to the other nodes, a block whose commit answer was lost is
    retried with the same token and offset version, and every message is on both replicas
    once, its offset committed once."""
    n = 10_000
    (tmp_path / "coordinator").mkdir()
    nodes = start_cluster(tmp_path / "coordinator", size=3, tick_ms=500)
    hosts = ",".join(node.hosts for node in nodes)
    replicas = []
    client = KazooClient(hosts=hosts)
    try:
        for name in ("r1", "r2"):
            args = ["--replica", name, "--macro", "shard=07", "--interserver-addr", f"127.0.0.1:{free_port()}"]
            replicas.append(StorageNode(tmp_path, hosts, name=name, extra_args=args).start())
        r1, r2 = replicas
        table = f"repleader{seed}"
        broker.create_topic(topic, PARTITIONS)
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, table, engine=ENGINE, settings=KEEP_LOG)
        a = Ingestor(tmp_path, pipeline, [r1, r2], hosts, name="a").start()
        b = Ingestor(tmp_path, pipeline, [r2, r1], hosts, name="b").start()
        wait_for_rows(r1, table, 0)
        wait_for_rows(r2, table, 0)
        # At random moments: the leader first, then the node ingestor a's session is on (so
        # that it must move), each started again one or two chunks later.
        rng = random.Random(seed)
        kills = {rng.randint(1, 3): "leader", rng.randint(5, 7): "serving"}
        restarts = {at + rng.randint(1, 2) for at in kills}
        killed = None
        for chunk in range(10):
            if chunk in restarts and killed is not None:
                killed.start()
                killed = None
            if chunk in kills:
                time.sleep(rng.uniform(0.0, 0.5))
                killed = leader_of(nodes) if kills[chunk] == "leader" else serving_node(a, nodes)
                killed.kill()
            broker.produce(topic, messages(range(chunk * 1000, (chunk + 1) * 1000)))
            time.sleep(0.5)
        if killed is not None:
            killed.start()
        for replica in replicas:
            wait_for_rows(replica, table, n, timeout=180)
        time.sleep(2)  # late duplicates, if there were any, would land now
        for replica in replicas:
            replica.query(f"SYSTEM SYNC REPLICA {table}")
            assert table_state(replica, table) == (n, n, sum(i * 3 for i in range(n)))
        for ingestor in (a, b):
            assert ingestor.terminate() == 0, ingestor.output()
        client.start(timeout=30)
        assert sum(offsets(client, table, table, topic).values()) == n
        inserts, blocks, _ = committed_parts(client, table)
        assert inserts == blocks, "every committed block has its log entry and its dedup node"
        assert a.output().count("succeeds to establish session") > 1, "a's session moved to another node"
    finally:
        client.stop()
        client.close()
        for replica in replicas:
            replica.kill()
        for node in nodes:
            node.stop()
