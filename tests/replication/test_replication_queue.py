"""The replication queue: each replica copies the shared log into its own queue and fetches
the parts it lacks from a replica that has them, over the interserver service; parts arrive
byte for byte, a damaged one is refused and fetched again once whole, and a replica that was
down catches up. Against our coordinator and Apache ZooKeeper 3.8."""

import itertools
import random
import shutil

import pytest

from replicas import PATH, Replica, active_parts, wait_until, zk_path

_tables = itertools.count()


@pytest.fixture
def table():
    return f"rq_{next(_tables)}"


def converged(replicas, table, parts):
    return all(active_parts(r, table) == parts for r in replicas)


def part_files(replica, table, part):
    directory = replica.path / "data" / "default" / table / part
    return {f.name: f.read_bytes() for f in directory.iterdir() if f.is_file()}


def test_a_replicated_replacing_table_converges_and_final_equals_clickhouse(replicas, kazoo, table, oracle):
    r1, r2 = replicas
    ddl = (f"CREATE TABLE {table} (k UInt64, v UInt64, s String) "
           f"ENGINE = ReplicatedReplacingMergeTree({PATH}, v) ORDER BY k")
    for replica in replicas:
        replica.query(ddl)
    rng = random.Random(5)
    inserts = []
    for i in range(12):
        rows = ", ".join(f"({rng.randrange(50)}, {rng.randrange(1000)}, 's{rng.randrange(9)}')" for _ in range(40))
        inserts.append(f"INSERT INTO {table} VALUES {rows}")
    for i, insert in enumerate(inserts):
        (r1 if i % 2 == 0 else r2).query(insert)
    root = zk_path(table)

    def merged_and_converged():
        parts = active_parts(r1, table)
        return (len(parts) < len(inserts) and active_parts(r2, table) == parts
                and all(kazoo.get_children(f"{root}/replicas/{n}/queue") == [] for n in ("r1", "r2")))

    # The leader assigns merges through the log; both replicas run them and end up alike.
    wait_until(merged_and_converged, 60, "both replicas merged to the same parts")
    parts = active_parts(r1, table)
    assert any(p.split("_")[3] != "0" for p in parts), parts
    for part in parts:
        # Data and index files are byte-identical; only meta.json's timestamp may differ.
        ours, theirs = part_files(r1, table, part), part_files(r2, table, part)
        for f in ("data.parquet", "primary.idx"):
            assert ours[f] == theirs[f], f"{part}/{f} differs between replicas"
    for name in ("r1", "r2"):
        assert sorted(kazoo.get_children(f"{root}/replicas/{name}/parts")) == parts
        log_end = max(int(e.split("-")[1]) for e in kazoo.get_children(f"{root}/log")) + 1
        assert kazoo.get(f"{root}/replicas/{name}/log_pointer")[0] == str(log_end).encode()
    merged_here = [r.log_path.read_text().count("merged as the log says") for r in replicas]
    assert all(n > 0 for n in merged_here), f"each replica ran merges itself: {merged_here}"
    local = (f"CREATE TABLE {table} (k UInt64, v UInt64, s String) ENGINE = ReplacingMergeTree(v) ORDER BY k;\n"
             + ";\n".join(inserts) + f";\nSELECT k, v, s FROM {table} FINAL ORDER BY k")
    expected = oracle.run(local)
    for replica in replicas:
        assert replica.query(f"SELECT k, v, s FROM {table} FINAL ORDER BY k") == expected


def test_a_replica_that_was_down_catches_up_from_the_log(replicas, table):
    r1, r2 = replicas
    for replica in replicas:
        replica.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
    r2.stop()
    for i in range(5):
        r1.query(f"INSERT INTO {table} SELECT number + {i * 100} FROM numbers(100)")
    r2.start()
    wait_until(lambda: r2.query(f"SELECT count(), sum(k) FROM {table}") == r1.query(
        f"SELECT count(), sum(k) FROM {table}"), 30, "r2 caught up")
    assert r2.query(f"SELECT count() FROM {table}") == "500\n"


def test_a_damaged_fetch_is_refused_and_retried(replicas, kazoo, table):
    r1, r2 = replicas
    for replica in replicas:
        replica.query(f"CREATE TABLE {table} (k UInt64, s String) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
    r2.stop()
    r1.query(f"INSERT INTO {table} SELECT number, toString(number) FROM numbers(1000)")
    [part] = active_parts(r1, table)
    data = r1.path / "data" / "default" / table / part / "data.parquet"
    whole = data.read_bytes()
    damaged = bytearray(whole)
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))
    r2.start()
    root = zk_path(table)
    wait_until(lambda: "checksum mismatch" in r2.log_path.read_text(), 30, "r2 refused the damaged part")
    assert r2.query(f"SELECT count() FROM {table}") == "0\n", "a damaged part never becomes active"
    assert len(kazoo.get_children(f"{root}/replicas/r2/queue")) == 1, "the entry stays queued"
    assert not list((r2.path / "data" / "default" / table).glob("tmp_fetch_*")), "nothing of it is left behind"
    data.write_bytes(whole)
    wait_until(lambda: r2.query(f"SELECT count() FROM {table}") == "1000\n", 30, "the retry fetched it whole")
    assert kazoo.get_children(f"{root}/replicas/r2/queue") == []


def test_a_replica_back_from_downtime_fetches_parts_merged_meanwhile(replicas, kazoo, table):
    """Its GET_PART entries name parts merged away on the other replica: it fetches the
    merged part that covers them instead."""
    r1, r2 = replicas
    for replica in replicas:
        replica.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
    r2.stop()
    for i in range(12):
        r1.query(f"INSERT INTO {table} SELECT number + {i * 10} FROM numbers(10)")
    wait_until(lambda: len(active_parts(r1, table)) < 12, 60, "r1 merged while r2 was away")
    r2.start()
    expected = r1.query(f"SELECT count(), sum(k) FROM {table}")
    assert expected == "120\t7140\n"
    wait_until(lambda: r2.query(f"SELECT count(), sum(k) FROM {table}") == expected, 60, "r2 caught up")
    wait_until(lambda: active_parts(r2, table) == active_parts(r1, table), 60, "the same parts")


CLEAN_FAST = ("SETTINGS cleanup_delay_period = 1, cleanup_delay_period_random_add = 0, "
              "min_replicated_logs_to_keep = 3, replicated_deduplication_window = 4")


def test_the_leader_cleans_old_log_entries_and_blocks(replicas, kazoo, table):
    r1, r2 = replicas
    for replica in replicas:
        replica.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k {CLEAN_FAST}")
    for i in range(10):
        r1.query(f"INSERT INTO {table} VALUES ({i})")
    root = zk_path(table)
    # Both replicas are past every entry, so all but the newest three go; four blocks stay.
    wait_until(lambda: len(kazoo.get_children(f"{root}/log")) == 3 and len(kazoo.get_children(f"{root}/blocks")) == 4,
               30, "the log and blocks cleaned")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    assert sorted(r2.query(f"SELECT k FROM {table}").split(), key=int) == [str(i) for i in range(10)]
    # The newest blocks still deduplicate; the oldest left the window and insert again.
    r1.query(f"INSERT INTO {table} VALUES (9)")
    r1.query(f"INSERT INTO {table} VALUES (0)")
    assert r1.query(f"SELECT count() FROM {table}").strip() == "11"
    assert r1.query(f"SELECT count() FROM {table} WHERE k = 0").strip() == "2"


def test_a_new_replica_clones_a_table_whose_log_was_cleaned(tmp_path, keeper_hosts, kazoo, table):
    r1 = Replica(tmp_path, keeper_hosts, "r1").start()
    r2 = Replica(tmp_path, keeper_hosts, "r2")
    try:
        r1.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k {CLEAN_FAST}")
        for i in range(12):
            r1.query(f"INSERT INTO {table} VALUES ({i})")
        root = zk_path(table)
        wait_until(lambda: len(kazoo.get_children(f"{root}/log")) <= 3, 30, "the log cleaned")
        assert int(kazoo.get(f"{root}/replicas/r1/log_pointer")[0]) >= 12
        r2.start()
        r2.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k {CLEAN_FAST}")
        r2.query(f"SYSTEM SYNC REPLICA {table}")
        assert sorted(r2.query(f"SELECT k FROM {table}").split(), key=int) == [str(i) for i in range(12)]
        assert "cloned a replica" in r2.log_path.read_text()
        wait_until(lambda: active_parts(r2, table) == active_parts(r1, table), 30, "the same parts on both")
        # Its pointer starts where r1's was, not at the cleaned-away beginning.
        assert int(kazoo.get(f"{root}/replicas/r2/log_pointer")[0]) >= 12
    finally:
        r2.stop()
        r1.stop()


def test_a_clone_of_more_parts_than_one_multi_takes_queues_them_all(tmp_path, keeper_hosts, kazoo, table):
    """230 parts (one per partition, so none merge) need more than one multi of 100 ops
    (ClickHouse's batch): the new replica's queue is written in several, its pointer with the
    last, and it ends with every part. SYSTEM SYNC REPLICA right after CREATE pulls while the
    queue's own clone is still writing: a second clone beside the first used to clear the
    entries the first had written, and r2 ended with some of the parts only."""
    parts = 230
    r1 = Replica(tmp_path, keeper_hosts, "r1").start()
    r2 = Replica(tmp_path, keeper_hosts, "r2")
    ddl = f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) PARTITION BY k ORDER BY k {CLEAN_FAST}"
    try:
        r1.query(ddl)
        r1.query(";\n".join(f"INSERT INTO {table} VALUES ({i})" for i in range(parts)))
        root = zk_path(table)
        wait_until(lambda: len(kazoo.get_children(f"{root}/log")) <= 3, 60, "the log cleaned")
        r2.start()
        r2.query(ddl)
        r2.query(f"SYSTEM SYNC REPLICA {table}")
        assert f"parts={parts}" in r2.log_path.read_text(), "cloned with every part of r1"
        wait_until(lambda: active_parts(r2, table) == active_parts(r1, table), 60, "the same parts on both")
        assert r2.query(f"SELECT count(), sum(k) FROM {table}") == f"{parts}\t{sum(range(parts))}\n"
        assert kazoo.get_children(f"{root}/replicas/r2/queue") == []
    finally:
        r2.stop()
        r1.stop()


def test_a_replica_down_past_the_kept_log_is_marked_lost_and_clones_on_return(tmp_path, keeper_hosts, kazoo, table):
    settings = f"{CLEAN_FAST}, max_replicated_logs_to_keep = 4"
    r1, r2 = Replica(tmp_path, keeper_hosts, "r1").start(), Replica(tmp_path, keeper_hosts, "r2").start()
    root = zk_path(table)
    try:
        for replica in (r1, r2):
            replica.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k {settings}")
        r1.query(f"INSERT INTO {table} VALUES (100)")
        r2.query(f"SYSTEM SYNC REPLICA {table}")
        r2.stop()
        wait_until(lambda: not kazoo.exists(f"{root}/replicas/r2/is_active"), 30, "r2 inactive")
        behind = int(kazoo.get(f"{root}/replicas/r2/log_pointer")[0])
        for i in range(12):
            r1.query(f"INSERT INTO {table} VALUES ({i})")
        # Without the mark, r2's pointer would hold every entry after it in the log.
        wait_until(lambda: kazoo.get(f"{root}/replicas/r2/is_lost")[0] == b"1", 30, "r2 marked lost")
        wait_until(lambda: len(kazoo.get_children(f"{root}/log")) <= 4, 30, "the log cleaned past r2")
        oldest = min(int(e.split("-")[1]) for e in kazoo.get_children(f"{root}/log"))
        assert oldest > behind

        r2.start()
        r2.query(f"SYSTEM SYNC REPLICA {table}")
        wait_until(lambda: kazoo.get(f"{root}/replicas/r2/is_lost")[0] == b"0", 30, "r2 no longer lost")
        assert "lost replica" in r2.log_path.read_text()
        r2.query(f"SYSTEM SYNC REPLICA {table}")
        expected = sorted([str(i) for i in range(12)] + ["100"], key=int)
        assert sorted(r2.query(f"SELECT k FROM {table}").split(), key=int) == expected
        wait_until(lambda: active_parts(r2, table) == active_parts(r1, table), 30, "the same parts on both")
        assert int(kazoo.get(f"{root}/replicas/r2/log_pointer")[0]) > oldest
    finally:
        r2.stop()
        r1.stop()


def test_at_start_unexpected_local_parts_are_detached_and_missing_ones_fetched(tmp_path, keeper_hosts, table):
    r1, r2 = Replica(tmp_path, keeper_hosts, "r1").start(), Replica(tmp_path, keeper_hosts, "r2").start()
    try:
        for replica in (r1, r2):
            replica.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
        for i in range(3):
            r1.query(f"INSERT INTO {table} VALUES ({i})")
        r2.query(f"SYSTEM SYNC REPLICA {table}")
        wait_until(lambda: active_parts(r2, table) == active_parts(r1, table), 30, "the same parts on both")
        parts = active_parts(r1, table)
        r1.stop()
        table_dir = r1.path / "data" / "default" / table
        # One part gone from the disk, and one the coordinator never heard of.
        shutil.rmtree(table_dir / parts[0])
        shutil.copytree(table_dir / parts[-1], table_dir / "all_90_90_0")

        r1.start()
        r1.query(f"SYSTEM SYNC REPLICA {table}")
        wait_until(lambda: active_parts(r1, table) == parts, 30, "the missing part fetched back")
        assert (table_dir / "detached" / "unexpected_all_90_90_0").is_dir()
        assert not (table_dir / "all_90_90_0").exists()
        assert sorted(r1.query(f"SELECT k FROM {table}").split()) == ["0", "1", "2"]
        assert "local parts checked against the coordinator" in r1.log_path.read_text()
    finally:
        r2.stop()
        r1.stop()


def test_a_part_no_replica_has_is_replaced_by_an_empty_part_and_the_queue_goes_on(tmp_path, keeper_hosts, table):
    """r1 alone had all_1_1_0 (r2's fetches were stopped) and lost it from its disk: no
    replica can send it, so instead of retrying forever, blocking its range's merges, r1
    puts an empty part in its place as ClickHouse does ("lost forever"); r2 fetches that,
    both queues empty, and OPTIMIZE FINAL merges over the range on both."""
    r1, r2 = Replica(tmp_path, keeper_hosts, "r1").start(), Replica(tmp_path, keeper_hosts, "r2").start()
    try:
        for replica in (r1, r2):
            replica.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
            replica.query(f"SYSTEM STOP MERGES {table}")
        r2.query(f"SYSTEM STOP FETCHES {table}")
        for i in range(3):
            r1.query(f"INSERT INTO {table} VALUES ({i})")
        assert active_parts(r1, table) == ["all_0_0_0", "all_1_1_0", "all_2_2_0"]
        r1.stop()
        shutil.rmtree(r1.path / "data" / "default" / table / "all_1_1_0")

        r1.start()
        wait_until(lambda: active_parts(r1, table) == ["all_0_0_0", "all_1_1_0", "all_2_2_0"], 30,
                   "an empty part in place of the lost one")
        assert "Part is lost forever" in r1.log_path.read_text()
        assert r1.query(f"SELECT name, rows FROM system.parts WHERE table = '{table}' AND name = 'all_1_1_0'") \
            == "all_1_1_0\t0\n"
        r2.query(f"SYSTEM START FETCHES {table}")
        r2.query(f"SYSTEM SYNC REPLICA {table}")
        for replica in (r1, r2):
            assert replica.query(f"SELECT count() FROM system.replication_queue WHERE table = '{table}'") == "0\n"
            assert sorted(replica.query(f"SELECT k FROM {table}").split()) == ["0", "2"]
            replica.query(f"SYSTEM START MERGES {table}")
        r1.query(f"SET alter_sync = 2; OPTIMIZE TABLE {table} FINAL")
        assert active_parts(r1, table) == active_parts(r2, table) == ["all_0_2_1"]
    finally:
        r2.stop()
        r1.stop()
