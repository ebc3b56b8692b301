"""Replication as SQL sees it: system.replicas, system.replication_queue, system.zookeeper,
SYSTEM SYNC REPLICA, STOP/START FETCHES and REPLICATION QUEUES, RESTART REPLICA, and a
replica without its coordinator going read-only and coming back without a restart.
Against our coordinator and Apache ZooKeeper 3.8 (the read-only test: our coordinator, which
the test kills and starts again)."""

import itertools

import pytest
from kazoo.client import KazooClient

from replicas import Replica, wait_until
from services import CoordinatorNode

_tables = itertools.count()
PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


@pytest.fixture
def table():
    return f"rs_{next(_tables)}"


@pytest.fixture
def replicas(tmp_path, keeper_hosts, table):
    started = [Replica(tmp_path, keeper_hosts, name).start() for name in ("r1", "r2")]
    for replica in started:
        replica.query(f"CREATE TABLE {table} (k UInt64, v String) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
    yield started
    for replica in started:
        replica.stop()


def zk_path(table):
    return f"/clickhouse/tables/01/default/{table}"


def rows_of(replica, sql):
    return [line.split("\t") for line in replica.query(sql).splitlines()]


def count(replica, table):
    return int(replica.query(f"SELECT count() FROM {table}"))


def fails_with(replica, sql, code):
    status, _, stderr = replica.run(sql)
    assert status != 0, f"{sql} succeeded"
    assert code in stderr, stderr
    return stderr


def test_system_replicas_describes_each_replica(replicas, kazoo, table):
    r1, r2 = replicas
    r1.query(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    r2.query(f"INSERT INTO {table} VALUES (3, 'c')")
    for replica in replicas:
        replica.query(f"SYSTEM SYNC REPLICA {table}")
    # SYNC REPLICA returned: the other replica's part is here now, no waiting.
    assert count(r1, table) == 3 and count(r2, table) == 3
    root = zk_path(table)
    log_max = max(int(e.split("-")[1]) for e in kazoo.get_children(f"{root}/log"))
    columns = ("engine, is_leader, is_readonly, is_session_expired, zookeeper_path, replica_name, replica_path, "
               "queue_size, inserts_in_queue, merges_in_queue, log_max_index, log_pointer, absolute_delay, "
               "total_replicas, active_replicas, replica_is_active, zookeeper_exception")
    leaders = 0
    for replica in replicas:
        [row] = rows_of(replica, f"SELECT {columns} FROM system.replicas WHERE table = '{table}'")
        (engine, is_leader, readonly, expired, path, name, replica_path, queue_size, inserts, merges, log_max_index,
         log_pointer, delay, total, active, is_active, zk_exception) = row
        assert engine == "ReplicatedMergeTree"
        assert (readonly, expired, zk_exception) == ("0", "0", "")
        assert (path, name, replica_path) == (root, replica.name, f"{root}/replicas/{replica.name}")
        assert (queue_size, inserts, merges, delay) == ("0", "0", "0", "0")
        # Every entry of the log is in this replica's queue or done: its pointer is past them.
        assert int(log_max_index) >= log_max and int(log_pointer) == int(log_max_index) + 1
        assert (total, active) == ("2", "2")
        assert is_active == "{'r1':1,'r2':1}"
        leaders += int(is_leader)
        assert kazoo.get(f"{root}/replicas/{replica.name}/log_pointer")[0] == log_pointer.encode()
    assert leaders == 1
    assert kazoo.get(f"{root}/leader_election/leader")[0] in (b"r1", b"r2")


def test_stopped_fetches_postpone_the_part_until_started(replicas, table):
    r1, r2 = replicas
    r2.query(f"SYSTEM STOP FETCHES {table}")
    r1.query(f"INSERT INTO {table} VALUES (1, 'a')")
    fails_with(r2, f"SET receive_timeout = 1; SYSTEM SYNC REPLICA {table}", "TIMEOUT_EXCEEDED")
    assert count(r2, table) == 0

    def queue():
        return rows_of(r2, "SELECT replica_name, type, source_replica, new_part_name, num_tries, num_postponed, "
                           f"postpone_reason, position FROM system.replication_queue WHERE table = '{table}'")

    wait_until(lambda: queue() and int(queue()[0][5]) > 0, 20, "the GET_PART entry postponed")
    [row] = queue()
    assert row[:5] == ["r2", "GET_PART", "r1", "all_0_0_0", "0"], row
    assert "fetches are cancelled" in row[6] and row[7] == "0", row
    [status] = rows_of(r2, "SELECT queue_size, inserts_in_queue, oldest_part_to_get, inserts_oldest_time "
                           f"FROM system.replicas WHERE table = '{table}'")
    assert status[:3] == ["1", "1", "all_0_0_0"] and not status[3].startswith("1970"), status
    r2.query(f"SYSTEM START FETCHES {table}")
    r2.query(f"SYSTEM SYNC REPLICA {table} STRICT")
    assert count(r2, table) == 1
    assert r2.query(f"SELECT count() FROM system.replication_queue WHERE table = '{table}'").strip() == "0"


def test_stopped_queues_pull_the_log_but_run_nothing(replicas, kazoo, table):
    r1, r2 = replicas
    r2.query("SYSTEM STOP REPLICATION QUEUES")
    r1.query(f"INSERT INTO {table} VALUES (1, 'a')")
    r1.query(f"INSERT INTO {table} VALUES (2, 'b')")
    # PULL waits only for the log to be in the queue.
    r2.query(f"SYSTEM SYNC REPLICA {table} PULL")
    queued = rows_of(r2, "SELECT new_part_name, num_tries, is_currently_executing FROM system.replication_queue "
                         f"WHERE table = '{table}' ORDER BY position")
    assert queued == [["all_0_0_0", "0", "0"], ["all_1_1_0", "0", "0"]]
    assert len(kazoo.get_children(f"{zk_path(table)}/replicas/r2/queue")) == 2
    fails_with(r2, f"SET receive_timeout = 0.5; SYSTEM SYNC REPLICA {table} LIGHTWEIGHT", "TIMEOUT_EXCEEDED")
    assert count(r2, table) == 0
    r2.query(f"SYSTEM START REPLICATION QUEUES {table}")
    r2.query(f"SYSTEM SYNC REPLICA {table} LIGHTWEIGHT")
    assert count(r2, table) == 2
    # RESTART REPLICA keeps the replica working.
    r2.query(f"SYSTEM RESTART REPLICA {table}")
    r1.query(f"INSERT INTO {table} VALUES (3, 'c')")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    assert count(r2, table) == 3


def test_system_zookeeper_lists_the_children_of_a_path(replicas, kazoo, table):
    r1, _ = replicas
    root = zk_path(table)
    assert r1.query(f"SELECT name FROM system.zookeeper WHERE path = '{root}/replicas' ORDER BY name").split() \
        == ["r1", "r2"]
    both = rows_of(r1, "SELECT path, name FROM system.zookeeper "
                       f"WHERE path IN ('{root}', '{root}/replicas') ORDER BY path, name")
    assert [root, "log"] in both and [root, "replicas"] in both and [f"{root}/replicas", "r2"] in both
    [row] = rows_of(r1, "SELECT value, ephemeralOwner, dataLength, numChildren, version, czxid FROM system.zookeeper "
                        f"WHERE path = '{root}/replicas/r1' AND name = 'host'")
    value, stat = kazoo.get(f"{root}/replicas/r1/host")
    assert row[0] == value.decode().replace("\n", "\\n")
    assert row[1:] == ["0", str(stat.data_length), str(stat.children_count), str(stat.version), str(stat.czxid)]
    [active] = rows_of(r1, "SELECT ephemeralOwner FROM system.zookeeper "
                           f"WHERE path = '{root}/replicas/r1' AND name = 'is_active'")
    owner = kazoo.get(f"{root}/replicas/r1/is_active")[1].ephemeralOwner
    assert owner != 0 and int(active[0]) == owner
    assert "must contain condition like path" in fails_with(r1, "SELECT * FROM system.zookeeper", "BAD_ARGUMENTS")
    fails_with(r1, "SELECT * FROM system.zookeeper WHERE path = '/no/such/node'", "KEEPER_EXCEPTION")


def test_sync_replica_on_a_local_table_is_refused(replicas):
    r1, _ = replicas
    r1.query("CREATE TABLE plain_local (k UInt64) ENGINE = MergeTree ORDER BY k")
    assert "is not replicated" in fails_with(r1, "SYSTEM SYNC REPLICA plain_local", "BAD_ARGUMENTS")
    fails_with(r1, "SYSTEM SYNC REPLICA no_such_table", "does not exist")


def test_a_replica_without_its_coordinator_is_read_only_until_it_is_back(tmp_path):
    coordinator = CoordinatorNode(1, tmp_path / "coordinator").start()
    replica = Replica(tmp_path, coordinator.hosts, "r1").start()
    kazoo = None
    try:
        replica.query(f"CREATE TABLE ro (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
        replica.query("INSERT INTO ro VALUES (1)")
        coordinator.kill()
        # Inserts are refused, reads go on from the local parts.
        wait_until(lambda: "TABLE_IS_READ_ONLY" in replica.run("INSERT INTO ro VALUES (2)")[2], 30,
                   "inserts refused as read-only")
        assert count(replica, "ro") == 1
        [status] = rows_of(replica, "SELECT is_readonly, is_session_expired, length(zookeeper_exception) "
                                    "FROM system.replicas WHERE table = 'ro'")
        assert status[:2] == ["1", "1"] and int(status[2]) > 0, status
        coordinator.start()
        wait_until(lambda: replica.run("INSERT INTO ro VALUES (3)")[0] == 0, 60, "inserts accepted again")
        assert sorted(replica.query("SELECT k FROM ro").split()) == ["1", "3"]
        # The replica is active again in its new session.
        kazoo = KazooClient(hosts=coordinator.hosts)
        kazoo.start(timeout=30)
        root = zk_path("ro")
        wait_until(lambda: kazoo.exists(f"{root}/replicas/r1/is_active"), 30, "is_active made again")
        wait_until(lambda: rows_of(replica, "SELECT is_readonly, active_replicas FROM system.replicas")
                   == [["0", "1"]], 30, "the replica no longer read-only")
    finally:
        if kazoo:
            kazoo.stop()
            kazoo.close()
        replica.stop()
        coordinator.stop()
