"""Quorum inserts (`insert_quorum`, `insert_quorum_timeout`, `insert_quorum_parallel`) and
`select_sequential_consistency`, with ClickHouse's errors: TOO_FEW_LIVE_REPLICAS before anything
is written, UNKNOWN_STATUS_OF_INSERT when the quorum is not reached in time (the part stays, and a
retry of the same block adds nothing), UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE for a second
non-parallel quorum insert. Against our coordinator and Apache ZooKeeper 3.8."""

import itertools
import shutil

import pytest

from replicas import Replica, wait_until

_tables = itertools.count()
PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


@pytest.fixture
def table():
    return f"q_{next(_tables)}"


def start_replicas(tmp_path, keeper_hosts, table, names):
    started = [Replica(tmp_path, keeper_hosts, name).start() for name in names]
    for replica in started:
        replica.query(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = ReplicatedMergeTree({PATH}) "
                      "PARTITION BY k % 2 ORDER BY k")
    return started


@pytest.fixture
def replicas(tmp_path, keeper_hosts, table):
    started = start_replicas(tmp_path, keeper_hosts, table, ("r1", "r2"))
    yield started
    for replica in started:
        replica.stop()


def zk_path(table):
    return f"/clickhouse/tables/01/default/{table}"


def count(replica, table, settings=""):
    return int(replica.query(f"{settings}SELECT count() FROM {table}"))


def fails_with(replica, sql, code):
    status, _, stderr = replica.run(sql)
    assert status != 0, f"{sql} succeeded"
    assert code in stderr, stderr
    return stderr


def open_quorums(kazoo, table):
    root = zk_path(table)
    parallel = kazoo.get_children(f"{root}/quorum/parallel")
    status = kazoo.exists(f"{root}/quorum/status")
    return parallel, status is not None


def test_a_quorum_insert_is_acknowledged_once_every_replica_it_needs_has_the_part(replicas, kazoo, table):
    r1, r2 = replicas
    # Two partitions: two parts, each with its own quorum.
    r1.query(f"SET insert_quorum = 2; INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    # No SYNC REPLICA: the acknowledgement itself says r2 has both parts.
    assert count(r2, table) == 2
    assert open_quorums(kazoo, table) == ([], False)
    entries = [kazoo.get(f"{zk_path(table)}/log/{e}")[0].decode() for e in kazoo.get_children(f"{zk_path(table)}/log")]
    assert sorted(e.splitlines()[-1] for e in entries) == ["quorum: 2", "quorum: 2"]

    # Not parallel: the parts go one by one, and each is recorded as its partition's last part.
    r2.query(f"SET insert_quorum = 2, insert_quorum_parallel = 0; INSERT INTO {table} VALUES (3, 'c'), (4, 'd')")
    assert count(r1, table) == 4
    last = kazoo.get(f"{zk_path(table)}/quorum/last_part")[0].decode().splitlines()
    assert last[:2] == ["version: 2", "parts count: 2"]
    assert sorted(line.split("\t")[0] for line in last[2:]) == ["0", "1"]
    assert open_quorums(kazoo, table) == ([], False)


def test_too_few_live_replicas_refuse_the_insert_before_anything_is_written(replicas, kazoo, table):
    r1, r2 = replicas
    stderr = fails_with(r1, f"SET insert_quorum = 3; INSERT INTO {table} VALUES (1, 'a')", "TOO_FEW_LIVE_REPLICAS")
    assert "Number of alive replicas (2) is less than requested quorum (3/2)." in stderr
    r2.stop()
    wait_until(lambda: not kazoo.exists(f"{zk_path(table)}/replicas/r2/is_active"), 30, "r2 inactive")
    for quorum in ("2", "'auto'"):
        stderr = fails_with(r1, f"SET insert_quorum = {quorum}; INSERT INTO {table} VALUES (1, 'a')",
                            "TOO_FEW_LIVE_REPLICAS")
        assert "Number of alive replicas (1) is less than requested quorum (2/2)." in stderr
    assert count(r1, table) == 0
    assert kazoo.get_children(f"{zk_path(table)}/log") == []
    # A quorum of 1 is no quorum.
    r1.query(f"SET insert_quorum = 1; INSERT INTO {table} VALUES (1, 'a')")
    assert count(r1, table) == 1


def test_a_majority_quorum_goes_on_with_one_replica_of_three_down(tmp_path, keeper_hosts, kazoo, table):
    r1, r2, r3 = start_replicas(tmp_path, keeper_hosts, table, ("r1", "r2", "r3"))
    try:
        r3.stop()
        wait_until(lambda: not kazoo.exists(f"{zk_path(table)}/replicas/r3/is_active"), 30, "r3 inactive")
        r1.query(f"SET insert_quorum = 'auto'; INSERT INTO {table} VALUES (1, 'a')")
        assert count(r2, table) == 1
        fails_with(r1, f"SET insert_quorum = 3; INSERT INTO {table} VALUES (2, 'b')", "TOO_FEW_LIVE_REPLICAS")
    finally:
        for replica in (r1, r2, r3):
            replica.stop()


def test_a_quorum_not_reached_in_time_is_an_unknown_status_and_a_retry_adds_nothing(replicas, kazoo, table):
    r1, r2 = replicas
    r2.query(f"SYSTEM STOP FETCHES {table}")
    insert = f"INSERT INTO {table} VALUES (1, 'a')"
    stderr = fails_with(r1, f"SET insert_quorum = 2, insert_quorum_timeout = 300; {insert}",
                        "UNKNOWN_STATUS_OF_INSERT")
    assert "Timeout while waiting for quorum" in stderr
    # The insert may still land: it is committed on r1, its quorum still open.
    assert count(r1, table) == 1 and count(r2, table) == 0
    parallel, _ = open_quorums(kazoo, table)
    assert len(parallel) == 1
    # A retry is the same block: deduplicated, and it waits for the same quorum.
    fails_with(r1, f"SET insert_quorum = 2, insert_quorum_timeout = 300; {insert}", "UNKNOWN_STATUS_OF_INSERT")
    r2.query(f"SYSTEM START FETCHES {table}")
    r1.query(f"SET insert_quorum = 2, insert_quorum_timeout = 30000; {insert}")
    assert count(r1, table) == 1 and count(r2, table) == 1
    assert open_quorums(kazoo, table) == ([], False)
    assert len(kazoo.get_children(f"{zk_path(table)}/log")) == 1


def test_without_parallel_a_second_quorum_insert_waits_for_the_first_quorum(replicas, kazoo, table):
    r1, r2 = replicas
    r2.query(f"SYSTEM STOP FETCHES {table}")
    serial = "SET insert_quorum = 2, insert_quorum_parallel = 0, insert_quorum_timeout = 200; "
    fails_with(r1, f"{serial}INSERT INTO {table} VALUES (1, 'a')", "UNKNOWN_STATUS_OF_INSERT")
    assert open_quorums(kazoo, table) == ([], True)
    stderr = fails_with(r1, f"{serial}INSERT INTO {table} VALUES (2, 'b')", "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE")
    assert "Quorum for previous write has not been satisfied yet. Status: version: 1" in stderr
    # Through the other replica too: the status node is the table's, not the replica's.
    fails_with(r2, f"{serial}INSERT INTO {table} VALUES (2, 'b')", "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE")
    # Inserts without a quorum, and parallel quorum inserts, do not wait for it.
    r1.query(f"INSERT INTO {table} VALUES (3, 'c')")
    assert count(r1, table) == 2

    r2.query(f"SYSTEM START FETCHES {table}")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    wait_until(lambda: open_quorums(kazoo, table) == ([], False), 30, "the first quorum reached")
    r1.query(f"{serial.replace('200', '30000')}INSERT INTO {table} VALUES (2, 'b')")
    assert count(r2, table) == 3


def test_the_quorum_of_a_part_lost_before_any_replica_fetched_it_fails(replicas, kazoo, table):
    """r1 took a quorum insert that r2 (fetches stopped) never got, then lost the part from its
    disk. Nobody can send it any more: its quorum fails (quorum/failed_parts) instead of
    blocking every later non-parallel quorum insert, and its block's dedup node goes with it,
    so that the client's retry of the same block is written again rather than taken for a
    duplicate of rows nobody has."""
    r1, r2 = replicas
    root = zk_path(table)
    r2.query(f"SYSTEM STOP FETCHES {table}")
    serial = ("SET insert_quorum = 2, insert_quorum_parallel = 0, insert_quorum_timeout = 300, "
              "insert_deduplication_token = 'lost'; ")
    insert = f"INSERT INTO {table} VALUES (1, 'a')"
    fails_with(r1, serial + insert, "UNKNOWN_STATUS_OF_INSERT")
    assert open_quorums(kazoo, table) == ([], True)
    [part] = r1.query(f"SELECT name FROM system.parts WHERE table = '{table}' AND active").split()
    r1.stop()
    shutil.rmtree(r1.path / "data" / "default" / table / part)
    r1.start()
    wait_until(lambda: kazoo.exists(f"{root}/quorum/failed_parts/{part}"), 30, "the lost part's quorum failed")
    assert open_quorums(kazoo, table) == ([], False)
    assert kazoo.get_children(f"{root}/blocks") == []
    r2.query(f"SYSTEM START FETCHES {table}")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    r1.query(serial.replace("= 300", "= 30000") + insert)
    assert count(r1, table) == count(r2, table) == 1
    assert open_quorums(kazoo, table) == ([], False)


def test_sequential_consistency_reads_only_what_reached_its_quorum(replicas, kazoo, table, tmp_path, keeper_hosts):
    r1, r2 = replicas
    serial = "SET insert_quorum = 2, insert_quorum_parallel = 0, insert_quorum_timeout = 30000; "
    consistent = "SET select_sequential_consistency = 1; "
    r1.query(f"{serial}INSERT INTO {table} VALUES (1, 'a')")
    assert count(r1, table, consistent) == 1 and count(r2, table, consistent) == 1

    r2.query(f"SYSTEM STOP FETCHES {table}")
    fails_with(r1, f"{serial.replace('30000', '200')}INSERT INTO {table} VALUES (3, 'c')", "UNKNOWN_STATUS_OF_INSERT")
    # The open quorum's part (partition 1, as the first one) is hidden from consistent reads
    # on both replicas, and only from those.
    assert count(r1, table) == 2
    assert count(r1, table, consistent) == 1 and count(r2, table, consistent) == 1

    # r2 misses a part that reached its quorum without it: it refuses consistent reads.
    r3 = Replica(tmp_path, keeper_hosts, "r3").start()
    try:
        r3.query(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = ReplicatedMergeTree({PATH}) "
                 "PARTITION BY k % 2 ORDER BY k")
        r3.query(f"SYSTEM SYNC REPLICA {table}")
        wait_until(lambda: open_quorums(kazoo, table) == ([], False), 30, "the quorum reached through r3")
        stderr = fails_with(r2, f"{consistent}SELECT count() FROM {table}", "REPLICA_IS_NOT_IN_QUORUM")
        assert "Replica doesn't have part" in stderr
        assert count(r2, table) == 1
        assert count(r1, table, consistent) == 2
    finally:
        r3.stop()

