"""OPTIMIZE of a replicated table: any replica assigns the merges through the shared log,
every replica runs them, and the statement waits as `alter_sync` says; a replica fetches the
merged part instead of merging when `prefer_fetch_merged_part_*_threshold` or
`always_fetch_merged_part` say so. Results against chDB running the same statements on a
non-replicated table. Against our coordinator and Apache ZooKeeper 3.8."""

import itertools
import random
import threading

import pytest

from replicas import PATH, active_parts, wait_until, zk_path

_tables = itertools.count()


@pytest.fixture
def table():
    return f"ro_{next(_tables)}"


def part_bytes(replica, table, part):
    return (replica.path / "data" / "default" / table / part / "data.parquet").read_bytes()


def random_inserts(table, count, seed):
    rng = random.Random(seed)
    inserts = []
    for _ in range(count):
        rows = ", ".join(f"({rng.randrange(40)}, {rng.randrange(1000)}, 's{rng.randrange(9)}')" for _ in range(30))
        inserts.append(f"INSERT INTO {table} VALUES {rows}")
    return inserts


def create(replicas, table, engine="ReplicatedReplacingMergeTree", args="v", extra=""):
    for replica in replicas:
        replica.query(f"CREATE TABLE {table} (k UInt64, v UInt64, s String) "
                      f"ENGINE = {engine}({PATH}{', ' + args if args else ''}) ORDER BY k {extra}")


def test_optimize_final_on_any_replica_merges_on_every_replica_as_clickhouse_does(replicas, table, oracle):
    r1, r2 = replicas
    # Partitioned, so that FINAL assigns one merge per partition.
    for replica in replicas:
        replica.query(f"CREATE TABLE {table} (k UInt64, v UInt64, s String) "
                      f"ENGINE = ReplicatedReplacingMergeTree({PATH}, v) PARTITION BY k % 3 ORDER BY k")
    inserts = random_inserts(table, 8, seed=11)
    for i, insert in enumerate(inserts):
        (r1 if i % 2 == 0 else r2).query(insert)
    # Through r2, whichever replica leads: it waits (alter_sync 1) until its own merges ran.
    r2.query(f"OPTIMIZE TABLE {table} FINAL")
    parts = active_parts(r2, table)
    assert len(parts) == 3 and all(p.split("_")[3] != "0" for p in parts), parts
    r1.query(f"SYSTEM SYNC REPLICA {table}")
    assert active_parts(r1, table) == parts
    for part in parts:
        assert part_bytes(r1, table, part) == part_bytes(r2, table, part), f"{part} differs between replicas"
    local = (f"CREATE TABLE {table} (k UInt64, v UInt64, s String) ENGINE = ReplacingMergeTree(v) "
             f"PARTITION BY k % 3 ORDER BY k;\n" + ";\n".join(inserts)
             + f";\nOPTIMIZE TABLE {table} FINAL;\nSELECT k, v, s FROM {table} ORDER BY k")
    expected = oracle.run(local)
    # Merged: the rows as they are, no FINAL needed.
    for replica in replicas:
        assert replica.query(f"SELECT k, v, s FROM {table} ORDER BY k") == expected


def test_alter_sync_two_waits_for_every_replica_and_zero_for_none(replicas, kazoo, table):
    r1, r2 = replicas
    create(replicas, table, engine="ReplicatedMergeTree", args="")
    for i in range(4):
        r1.query(f"INSERT INTO {table} VALUES ({i}, {i}, 'x')")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    r1.query(f"SET alter_sync = 2; OPTIMIZE TABLE {table} FINAL")
    # Returned: both replicas have the merged part already, no SYNC REPLICA needed.
    assert active_parts(r1, table) == active_parts(r2, table) == ["all_0_3_1"]
    r2.query(f"INSERT INTO {table} VALUES (9, 9, 'y')")
    r1.query(f"SYSTEM SYNC REPLICA {table}")
    r1.query(f"SYSTEM STOP REPLICATION QUEUES {table}")
    # alter_sync 0 (as the statement's own setting): the merge is in the log, and r1 does not
    # run it while its queue is stopped.
    code, _, stderr = r1.run(f"OPTIMIZE TABLE {table} FINAL SETTINGS alter_sinc = 0")
    assert code != 0 and "Unknown setting 'alter_sinc'" in stderr, stderr
    r1.query(f"OPTIMIZE TABLE {table} FINAL SETTINGS alter_sync = 0")
    assert active_parts(r1, table) == ["all_0_3_1", "all_4_4_0"]
    queue = r1.query(f"SELECT type, new_part_name FROM system.replication_queue WHERE table = '{table}'")
    assert queue == "MERGE_PARTS\tall_0_4_2\n"
    r1.query(f"SYSTEM START REPLICATION QUEUES {table}")
    wait_until(lambda: active_parts(r1, table) == active_parts(r2, table) == ["all_0_4_2"], 30, "merged on both")


def test_alter_sync_two_gives_up_on_an_inactive_replica(replicas, table):
    r1, r2 = replicas
    create(replicas, table, engine="ReplicatedMergeTree", args="")
    for i in range(2):
        r1.query(f"INSERT INTO {table} VALUES ({i}, {i}, 'x')")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    r2.stop()
    wait_until(lambda: r1.query(f"SELECT active_replicas FROM system.replicas WHERE table = '{table}'") == "1\n",
               30, "r2 inactive")
    code, _, stderr = r1.run(f"OPTIMIZE TABLE {table} FINAL "
                             f"SETTINGS alter_sync = 2, replication_wait_for_inactive_replica_timeout = 1")
    assert code != 0 and "UNFINISHED" in stderr and "r2" in stderr, stderr
    # The merge itself went through: r1 has it, and r2 runs it when it comes back.
    assert active_parts(r1, table) == ["all_0_1_1"]
    r2.start()
    wait_until(lambda: active_parts(r2, table) == ["all_0_1_1"], 30, "r2 ran the merge after coming back")


def test_optimize_final_cleanup_drops_deleted_rows_on_every_replica(replicas, table, oracle):
    r1, r2 = replicas
    settings = "SETTINGS allow_experimental_replacing_merge_with_cleanup = 1"
    for replica in replicas:
        replica.query(f"CREATE TABLE {table} (k UInt64, v UInt64, d UInt8) "
                      f"ENGINE = ReplicatedReplacingMergeTree({PATH}, v, d) ORDER BY k {settings}")
    inserts = [f"INSERT INTO {table} VALUES (1, 1, 0), (2, 1, 0), (3, 1, 0)",
               f"INSERT INTO {table} VALUES (2, 2, 1), (3, 2, 0)",
               f"INSERT INTO {table} VALUES (1, 3, 1), (4, 1, 0)"]
    for i, insert in enumerate(inserts):
        (r1 if i % 2 == 0 else r2).query(insert)
    r1.query(f"SET alter_sync = 2; OPTIMIZE TABLE {table} FINAL CLEANUP")
    expected = oracle.run(
        f"CREATE TABLE {table} (k UInt64, v UInt64, d UInt8) ENGINE = ReplacingMergeTree(v, d) ORDER BY k {settings};\n"
        + ";\n".join(inserts) + f";\nOPTIMIZE TABLE {table} FINAL CLEANUP;\nSELECT k, v, d FROM {table} ORDER BY k")
    assert expected == "3\t2\t0\n4\t1\t0\n"
    for replica in replicas:
        assert replica.query(f"SELECT k, v, d FROM {table} ORDER BY k") == expected
    # Without the setting, the error is ClickHouse's, before anything is written to the log.
    other = f"{table}_plain"
    create(replicas, other)
    code, _, stderr = r1.run(f"OPTIMIZE TABLE {other} FINAL CLEANUP")
    assert code != 0 and "Experimental merges with CLEANUP are not allowed" in stderr, stderr


def test_optimize_on_both_replicas_at_once_under_inserts_converges(replicas, kazoo, table, oracle):
    r1, r2 = replicas
    create(replicas, table)
    inserts = random_inserts(table, 24, seed=7)
    errors = []

    def run(replica, statements):
        for sql in statements:
            code, _, stderr = replica.run(sql)
            if code != 0:
                errors.append(stderr)

    # Each replica inserts half and runs OPTIMIZE FINAL between its inserts: merges are
    # assigned from both sides while parts keep arriving, and never overlap.
    plans = [[], []]
    for i, insert in enumerate(inserts):
        plans[i % 2].append(insert)
        if i % 4 in (1, 2):
            plans[i % 2].append(f"OPTIMIZE TABLE {table} FINAL")
    threads = [threading.Thread(target=run, args=(r, plan)) for r, plan in zip(replicas, plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    r1.query(f"SET alter_sync = 2; OPTIMIZE TABLE {table} FINAL")
    root = zk_path(table)
    wait_until(lambda: all(kazoo.get_children(f"{root}/replicas/{n}/queue") == [] for n in ("r1", "r2")),
               30, "both queues empty")
    assert active_parts(r1, table) == active_parts(r2, table) and len(active_parts(r1, table)) == 1
    expected = oracle.run(f"CREATE TABLE {table} (k UInt64, v UInt64, s String) ENGINE = ReplacingMergeTree(v) "
                          f"ORDER BY k;\n" + ";\n".join(inserts) + f";\nSELECT k, v, s FROM {table} FINAL ORDER BY k")
    for replica in replicas:
        assert replica.query(f"SELECT k, v, s FROM {table} FINAL ORDER BY k") == expected


def merged_or_fetched(replica, part):
    log = replica.log_path.read_text()
    merged = any("merged as the log says" in line and f"part={part}" in line for line in log.splitlines())
    fetched = any("fetched a part" in line and f"part={part}" in line for line in log.splitlines())
    return merged, fetched


@pytest.mark.parametrize("threshold, fetches", [(None, False), (0, True)])
def test_prefer_fetch_merged_part_time_threshold(replicas, table, threshold, fetches):
    r1, r2 = replicas
    # The size threshold 0 leaves the age alone deciding.
    extra = ("" if threshold is None else
             f"SETTINGS prefer_fetch_merged_part_time_threshold = {threshold}, "
             "prefer_fetch_merged_part_size_threshold = 0")
    create(replicas, table, engine="ReplicatedMergeTree", args="", extra=extra)
    for i in range(3):
        r1.query(f"INSERT INTO {table} VALUES ({i}, {i}, 'x')")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    # r2 has every source, and runs the merge only once r1 has made the merged part.
    r2.query(f"SYSTEM STOP REPLICATION QUEUES {table}")
    r1.query(f"OPTIMIZE TABLE {table} FINAL")
    assert merged_or_fetched(r1, "all_0_2_1") == (True, False)
    r2.query(f"SYSTEM START REPLICATION QUEUES {table}")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    assert active_parts(r2, table) == ["all_0_2_1"]
    assert merged_or_fetched(r2, "all_0_2_1") == (not fetches, fetches)
    assert part_bytes(r1, table, "all_0_2_1") == part_bytes(r2, table, "all_0_2_1")


def test_always_fetch_merged_part_replica_never_merges(replicas, table):
    r1, r2 = replicas
    base = f"CREATE TABLE {table} (k UInt64, v UInt64, s String) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k"
    r1.query(base)
    r2.query(base + " SETTINGS always_fetch_merged_part = 1")
    for i in range(3):
        r2.query(f"INSERT INTO {table} VALUES ({i}, {i}, 'x')")
    # Assigned by r2 itself, which waits for the part r1 merges and r2 fetches.
    r2.query(f"OPTIMIZE TABLE {table} FINAL")
    assert active_parts(r2, table) == ["all_0_2_1"]
    assert merged_or_fetched(r2, "all_0_2_1") == (False, True)
    assert merged_or_fetched(r1, "all_0_2_1") == (True, False)
