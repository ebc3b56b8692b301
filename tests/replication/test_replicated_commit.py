"""Replicated tables committing through the coordinator: ClickHouse's Keeper layout, block
numbers from block_numbers/<partition>, one multi per insert (log entry, part node, dedup
node), deduplication across replicas, and the errors of replicas that disagree. Each test runs
against our coordinator and against Apache ZooKeeper 3.8."""

import concurrent.futures
import itertools
import subprocess

import pytest

from replicas import STORAGE_BIN, wait_until, zk_path

_tables = itertools.count()


@pytest.fixture
def table():
    return f"events_{next(_tables)}"


def create(replica, table, engine="ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')",
           order_by="k", columns="k UInt64, v String"):
    return replica.run(f"CREATE TABLE {table} ({columns}) ENGINE = {engine} ORDER BY {order_by}")


def test_the_table_and_each_replica_are_laid_out_as_clickhouse_does(replicas, kazoo, table):
    r1, r2 = replicas
    for replica in replicas:
        code, _, stderr = create(replica, table)
        assert code == 0, stderr
    root = zk_path(table)
    assert {"metadata", "columns", "log", "blocks", "block_numbers", "quorum", "mutations", "replicas"} <= set(
        kazoo.get_children(root))
    assert sorted(kazoo.get_children(f"{root}/replicas")) == ["r1", "r2"]
    replica_nodes = {"host", "log_pointer", "queue", "parts", "is_lost", "metadata_version", "metadata", "columns"}
    assert replica_nodes <= set(kazoo.get_children(f"{root}/replicas/r1"))
    wait_until(lambda: kazoo.exists(f"{root}/replicas/r2/is_active"), 10, "r2 marked active")
    metadata = kazoo.get(f"{root}/metadata")[0].decode()
    assert "primary key: k\n" in metadata and "mode: 0\n" in metadata, metadata
    assert kazoo.get(f"{root}/columns")[0].decode() == "columns format version: 1\n2 columns:\n`k` UInt64\n`v` String\n"
    host = kazoo.get(f"{root}/replicas/r1/host")[0].decode()
    assert f"port: {r1.interserver_port}\n" in host, host


def test_an_insert_is_one_log_entry_one_part_node_and_one_block_node(replicas, kazoo, table):
    r1, _ = replicas
    assert create(r1, table)[0] == 0
    r1.query(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    r1.query(f"INSERT INTO {table} VALUES (3, 'c')")
    root = zk_path(table)
    entries = sorted(kazoo.get_children(f"{root}/log"))
    assert entries == ["log-0000000000", "log-0000000001"]
    first = kazoo.get(f"{root}/log/{entries[0]}")[0].decode()
    assert first.startswith("format version: 4\n") and "source replica: r1\n" in first
    assert first.endswith("get\nall_0_0_0\n"), first
    # Block numbers come from block_numbers/all, starting at 0 as in ClickHouse; the lock of
    # each is gone with its commit.
    assert sorted(kazoo.get_children(f"{root}/replicas/r1/parts")) == ["all_0_0_0", "all_1_1_0"]
    assert kazoo.get_children(f"{root}/block_numbers/all") == []
    blocks = kazoo.get_children(f"{root}/blocks")
    assert len(blocks) == 2 and all(b.startswith("all_") for b in blocks)
    assert sorted(kazoo.get(f"{root}/blocks/{b}")[0].decode() for b in blocks) == ["all_0_0_0", "all_1_1_0"]
    assert r1.query(f"SELECT k, v FROM {table} ORDER BY k") == "1\ta\n2\tb\n3\tc\n"
    assert r1.query(f"SELECT name FROM system.parts WHERE table = '{table}' AND active ORDER BY name") == \
        "all_0_0_0\nall_1_1_0\n"


def test_the_same_block_through_either_replica_is_stored_once(replicas, kazoo, table):
    r1, r2 = replicas
    for replica in replicas:
        assert create(replica, table)[0] == 0
    r1.query(f"INSERT INTO {table} VALUES (1, 'a')")
    r2.query(f"INSERT INTO {table} VALUES (1, 'a')")
    r2.query(f"INSERT INTO {table} SETTINGS insert_deduplication_token = 't1' VALUES (5, 'e')")
    r1.query(f"INSERT INTO {table} SETTINGS insert_deduplication_token = 't1' VALUES (6, 'f')")
    root = zk_path(table)
    assert len(kazoo.get_children(f"{root}/log")) == 2, "one entry per distinct block"
    # Each replica fetched the other's block, and stored each once.
    for replica, name in ((r1, "r1"), (r2, "r2")):
        wait_until(lambda: len(kazoo.get_children(f"{root}/replicas/{name}/parts")) == 2, 30, f"{name} converged")
        wait_until(lambda: replica.query(f"SELECT count() FROM {table}") == "2\n", 30, f"{name} rows")
        assert replica.query(f"SELECT k, v FROM {table} ORDER BY k") == "1\ta\n5\te\n"
    # With deduplication off, the same rows are a new block.
    r1.query(f"INSERT INTO {table} SETTINGS insert_deduplicate = 0 VALUES (1, 'a')")
    assert len(kazoo.get_children(f"{root}/log")) == 3


def test_a_replica_with_another_definition_is_refused(replicas, table):
    r1, r2 = replicas
    assert create(r1, table)[0] == 0
    code, _, stderr = create(r2, table, order_by="v")
    assert code != 0
    assert "METADATA_MISMATCH" in stderr and "differs in primary key. Stored in ZooKeeper: k, local: v" in stderr, \
        stderr
    code, _, stderr = create(r2, table, columns="k UInt64, v String, w UInt8")
    assert code != 0 and "INCOMPATIBLE_COLUMNS" in stderr, stderr
    engine = "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')"
    code, _, stderr = create(r2, table, engine=engine)
    assert code != 0 and "differs in mode" in stderr, stderr
    # Nothing of the refused table stays behind on r2: a matching CREATE works.
    code, _, stderr = create(r2, table)
    assert code == 0, stderr


def test_a_replica_name_in_use_is_refused(replicas, table):
    r1, r2 = replicas
    engine = "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', 'same')"
    assert create(r1, table, engine=engine)[0] == 0
    code, _, stderr = create(r2, table, engine=engine)
    assert code != 0 and "REPLICA_ALREADY_EXISTS" in stderr and f"{zk_path(table)}/replicas/same" in stderr, stderr


def test_concurrent_create_if_not_exists_on_one_replica_all_succeed(replicas, kazoo, table):
    """Clients racing to create the same table on one node (ingestors starting together do)
    take turns, as ClickHouse's DDLGuard makes them: one registers the replica, the others
    find the table — none fails with REPLICA_ALREADY_EXISTS."""
    r1, _ = replicas
    engine = "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')"
    sql = f"CREATE TABLE IF NOT EXISTS {table} (k UInt64, v String) ENGINE = {engine} ORDER BY k"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: r1.run(sql), range(8)))
    assert [code for code, _, _ in results] == [0] * 8, [stderr for _, _, stderr in results]
    assert kazoo.get_children(f"{zk_path(table)}/replicas") == ["r1"]


def test_drop_removes_the_replica_then_the_table(replicas, kazoo, table):
    r1, r2 = replicas
    for replica in replicas:
        assert create(replica, table)[0] == 0
    r1.query(f"INSERT INTO {table} VALUES (1, 'a')")
    root = zk_path(table)
    r1.query(f"DROP TABLE {table}")
    assert kazoo.get_children(f"{root}/replicas") == ["r2"]
    r2.query(f"DROP TABLE {table}")
    assert not kazoo.exists(root)


@pytest.mark.parametrize("engine,ddl_args", [
    ("ReplicatedSummingMergeTree", "(v)"),
    ("ReplicatedAggregatingMergeTree", ""),
    ("ReplicatedCollapsingMergeTree", "(s)"),
    ("ReplicatedVersionedCollapsingMergeTree", "(s, v)"),
    ("ReplicatedReplacingMergeTree", "(v)"),
    ("ReplicatedCoalescingMergeTree", ""),
])
def test_every_engine_merges_as_its_local_one(replicas, table, engine, ddl_args):
    """The engine's own arguments follow the two path arguments; inserts merge as locally."""
    r1, _ = replicas
    args = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
    if ddl_args:
        args += ", " + ddl_args.strip("()")
    code, _, stderr = create(r1, table, engine=f"{engine}({args})", columns="k UInt64, v UInt64, s Int8")
    assert code == 0, stderr
    r1.query(f"INSERT INTO {table} VALUES (1, 1, 1), (1, 2, 1)")
    level = r1.query(f"SELECT level FROM system.parts WHERE table = '{table}' AND active")
    assert level == "1\n", "engines that merge rows write insert parts at level 1"


def test_engine_argument_errors_are_clickhouses(replicas, table):
    r1, _ = replicas
    code, _, stderr = create(r1, table, engine="ReplicatedMergeTree('/a')")
    assert code != 0 and "Expected two string literal arguments: zookeeper_path and replica_name" in stderr, stderr
    code, _, stderr = create(r1, table, engine="ReplicatedMergeTree")
    assert code != 0 and "Macro 'uuid' in engine arguments is only supported" in stderr, stderr
    code, _, stderr = create(r1, table, engine="ReplicatedMergeTree('/t/{nope}', '{replica}')")
    assert code != 0 and "No macro 'nope'" in stderr, stderr
    code, _, stderr = r1.run(f"CREATE TABLE {table} UUID '6a5d8c3e-1b2f-4c7a-9e0d-123456789abc' (k UInt64) "
                             "ENGINE = ReplicatedMergeTree ORDER BY k")
    assert code == 0, stderr


def test_a_node_without_a_coordinator_refuses_replicated_tables(tmp_path):
    out = subprocess.run([str(STORAGE_BIN), "local", "--path", str(tmp_path / "data"), "--query",
                          "CREATE TABLE t (k UInt64) ENGINE = ReplicatedMergeTree('/t', 'r') ORDER BY k"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "needs a coordinator" in out.stderr, out.stderr
    assert not (tmp_path / "data" / "data" / "default" / "t").exists()


def test_a_second_server_with_the_same_replica_stays_read_only_until_the_first_is_gone(
        tmp_path, replicas, keeper_hosts, kazoo, table):
    """A copy of r1's data directory started as another server (its own identity) under the
    same replica name finds r1's is_active: it refuses inserts as read-only with ClickHouse's
    REPLICA_IS_ALREADY_ACTIVE instead of taking the replica from r1, which goes on. Once r1 is
    gone and its session expired, the copy takes the replica over. r1 itself, SIGKILLed and
    started again at once, takes its replica back without waiting for its old session."""
    import shutil

    from replicas import Replica

    r1, _ = replicas
    assert create(r1, table)[0] == 0
    r1.query(f"INSERT INTO {table} VALUES (1, 'a')")
    is_active = f"{zk_path(table)}/replicas/r1/is_active"
    identity = (r1.path / "uuid").read_text()
    assert kazoo.get(is_active)[0].decode() == identity

    r1.kill()
    r1.start()  # the old session's is_active is still there: it is r1's own, and replaced
    r1.query(f"INSERT INTO {table} VALUES (2, 'b')")
    r1.kill()
    copy = Replica(tmp_path / "copy", keeper_hosts, "r1")
    (tmp_path / "copy").mkdir()
    shutil.copytree(r1.path, copy.path)
    (copy.path / "uuid").unlink()  # another machine: another identity
    r1.start()
    r1.query(f"INSERT INTO {table} VALUES (3, 'c')")
    copy.start()
    try:
        code, _, stderr = copy.run(f"INSERT INTO {table} VALUES (4, 'd')")
        assert code != 0 and "TABLE_IS_READ_ONLY" in stderr and "REPLICA_IS_ALREADY_ACTIVE" in stderr, stderr
        assert copy.query(f"SELECT is_readonly FROM system.replicas WHERE table = '{table}'") == "1\n"
        assert copy.query(f"SELECT count() FROM {table}") == "2\n", "reads go on from the local parts"
        assert kazoo.get(is_active)[0].decode() == identity, "r1 keeps its replica"
        r1.query(f"INSERT INTO {table} VALUES (5, 'e')")

        r1.kill()
        wait_until(lambda: copy.run(f"INSERT INTO {table} VALUES (6, 'f')")[0] == 0, 60,
                   "the copy takes the replica once r1's session expired")
        assert kazoo.get(is_active)[0].decode() == (copy.path / "uuid").read_text()
        assert copy.query(f"SELECT is_readonly FROM system.replicas WHERE table = '{table}'") == "0\n"
    finally:
        copy.stop()
