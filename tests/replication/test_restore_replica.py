"""SYSTEM RESTORE REPLICA: replicas whose coordinator metadata is gone stay read-only (reads
go on from their parts) until they are restored from the parts on disk, as ClickHouse does:
the parts are attached again as new inserts, a part another replica attached already is
fetched from it instead of committed twice, and the table ends as it was, on every replica.
Against our coordinator and Apache ZooKeeper 3.8."""

import itertools

import pytest

from replicas import Replica, wait_until, zk_path

_tables = itertools.count()
PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


@pytest.fixture
def table():
    return f"restore_{next(_tables)}"


@pytest.fixture
def replicas(tmp_path, keeper_hosts, table):
    started = [Replica(tmp_path, keeper_hosts, name).start() for name in ("r1", "r2")]
    for replica in started:
        replica.query(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = ReplicatedMergeTree({PATH}) "
                      f"PARTITION BY k % 2 ORDER BY k")
    yield started
    for replica in started:
        replica.stop()


def state(replica, table):
    return replica.query(f"SELECT count(), sum(k), arraySort(groupArray(v)) FROM {table}")


def parts(replica, table):
    return replica.query(f"SELECT name FROM system.parts WHERE table = '{table}' AND active ORDER BY name").split()


def restart(replica):
    replica.stop()
    replica.start()


def read_only(replica, table):
    return replica.query(f"SELECT is_readonly FROM system.replicas WHERE table = '{table}'").strip() == "1"


def test_replicas_whose_metadata_is_gone_are_restored_from_their_parts(replicas, kazoo, table):
    r1, r2 = replicas
    for i in range(3):
        r1.query(f"INSERT INTO {table} VALUES ({2 * i}, 'a{i}'), ({2 * i + 1}, 'b{i}')")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    before = state(r1, table)
    assert state(r2, table) == before and before.startswith("6\t")
    root = zk_path(table)
    kazoo.delete(root, recursive=True)
    for replica in replicas:
        restart(replica)
        wait_until(lambda: read_only(replica, table), 30, "the replica read-only")
        status, _, stderr = replica.run(f"INSERT INTO {table} VALUES (100, 'x')")
        assert status != 0 and "TABLE_IS_READ_ONLY" in stderr, stderr
        assert state(replica, table) == before, "reads go on from the local parts"

    r1.query(f"SYSTEM RESTORE REPLICA {table}")
    assert sorted(kazoo.get_children(f"{root}/replicas")) == ["r1"]
    assert len(kazoo.get_children(f"{root}/replicas/r1/parts")) == 6
    r2.query(f"SYSTEM RESTORE REPLICA {table}")
    # r2's parts are byte-equal to r1's (it fetched them): it adopts them, none is committed twice.
    assert len(kazoo.get_children(f"{root}/log")) == 6
    assert "attached=0 adopted=6 duplicates=0" in r2.log_path.read_text()
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    for replica in replicas:
        assert state(replica, table) == before
        assert kazoo.get_children(f"{root}/replicas/{replica.name}/queue") == []
    assert parts(r1, table) == parts(r2, table)

    status, _, stderr = r1.run(f"SYSTEM RESTORE REPLICA {table}")
    assert status != 0 and "BAD_ARGUMENTS" in stderr and "Replica has metadata in ZooKeeper" in stderr, stderr
    # Both replicas take inserts again and replicate them.
    r2.query(f"INSERT INTO {table} VALUES (100, 'x')")
    r1.query(f"SYSTEM SYNC REPLICA {table}")
    assert r1.query(f"SELECT v FROM {table} WHERE k = 100") == "x\n"


def test_a_replica_whose_own_nodes_are_gone_is_restored_beside_the_others(replicas, kazoo, table):
    r1, r2 = replicas
    r1.query(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    r2.query(f"SYSTEM STOP FETCHES {table}")
    r1.query(f"INSERT INTO {table} VALUES (3, 'c')")
    root = zk_path(table)
    kazoo.delete(f"{root}/replicas/r2", recursive=True)
    restart(r2)
    wait_until(lambda: read_only(r2, table), 30, "r2 read-only")
    r2.query(f"SYSTEM RESTORE REPLICA {table}")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    # Its own two parts were r1's already; the one it had not fetched comes from r1.
    assert state(r2, table) == state(r1, table) == "3\t6\t['a','b','c']\n"
    assert parts(r2, table) == parts(r1, table)
    assert sorted(kazoo.get_children(f"{root}/replicas")) == ["r1", "r2"]


def test_restore_of_a_local_table_is_refused(replicas):
    r1, _ = replicas
    r1.query("CREATE TABLE plain (k UInt64) ENGINE = MergeTree ORDER BY k")
    status, _, stderr = r1.run("SYSTEM RESTORE REPLICA plain")
    assert status != 0 and "is not replicated" in stderr, stderr


def test_a_restore_cut_short_by_a_crash_goes_on_when_run_again(tmp_path, keeper_hosts, kazoo, table):
    """The replica dies right after attaching its first part back (failpoint): the others are
    still in detached/restore_*; after the restart, RESTORE REPLICA attaches them (the replica's
    nodes are there, so it goes on instead of refusing) and every row is there once."""
    r1 = Replica(tmp_path, keeper_hosts, "r1").start()
    try:
        r1.query(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = ReplicatedMergeTree({PATH}) "
                 f"PARTITION BY k % 2 ORDER BY k")
        for i in range(3):
            r1.query(f"INSERT INTO {table} VALUES ({2 * i}, 'a{i}'), ({2 * i + 1}, 'b{i}')")
        before = state(r1, table)
        kazoo.delete(zk_path(table), recursive=True)
        r1.stop()
        r1.env = {"MERGESTREAM_LOG": "info", "MERGESTREAM_FAILPOINTS": "restore-after-first-attach"}
        r1.start()
        wait_until(lambda: read_only(r1, table), 30, "the replica read-only")
        status, _, _ = r1.run(f"SYSTEM RESTORE REPLICA {table}")
        assert status != 0, "the statement failed with its server"
        # The client sees the connection drop while the aborting process is still being torn down.
        wait_until(lambda: not r1.alive(), 30, "the replica died at the failpoint")
        detached = r1.path / "data" / "default" / table / "detached"
        assert len([d for d in detached.iterdir() if d.name.startswith("restore_")]) == 5
        r1.env = {"MERGESTREAM_LOG": "info"}
        r1.start()
        r1.query(f"SYSTEM RESTORE REPLICA {table}")
        assert state(r1, table) == before
        assert len(kazoo.get_children(f"{zk_path(table)}/replicas/r1/parts")) == 6
        assert not [d for d in detached.iterdir() if d.name.startswith("restore_")]
        status, _, stderr = r1.run(f"SYSTEM RESTORE REPLICA {table}")
        assert status != 0 and "Replica has metadata in ZooKeeper" in stderr, stderr
    finally:
        r1.stop()
