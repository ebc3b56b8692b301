"""A storage node under input an attacker or a careless client sends: each case was found
losing data or taking the node down, and here the node must answer it (with the status and
message the case calls for), keep serving, and keep every row it had acknowledged, once."""

import random
import struct
import subprocess
import time

import grpc
import pyarrow as pa
from kazoo.client import KazooClient

from harness import BIN, run_ours
from ingest_rpc import Client, ipc_stream
from ingest_services import StorageNode

TABLE = "CREATE TABLE t (id UInt64, name String, v Int64) ENGINE = MergeTree ORDER BY id"


def client_query(storage, sql):
    return subprocess.run([str(BIN), "client", "--addr", storage.addr], input=sql,
                          capture_output=True, text=True, timeout=120)


def rows_of(storage, table="t"):
    out = client_query(storage, f"SELECT count(), sum(id) FROM {table}")
    assert out.returncode == 0, out.stderr
    return tuple(int(x) for x in out.stdout.split())


def block(ids, names=None, v_type=pa.int64()):
    ids = list(ids)
    return pa.record_batch({
        "id": pa.array(ids, pa.uint64()),
        "name": pa.array(names or [f"n{i}" for i in ids], pa.string()),
        "v": pa.array([i * 2 for i in ids], v_type),
    })


def claim_body_length(stream: bytes, claimed: int) -> bytes:
    """The stream with its record batch message claiming a body of `claimed` bytes."""
    reader = pa.BufferReader(stream)
    pa.ipc.read_message(reader)
    at = reader.tell()
    body = pa.ipc.read_message(reader).body.size
    meta_len = struct.unpack_from("<i", stream, at + 4)[0]
    meta = stream[at + 8: at + 8 + meta_len]
    field = meta.find(struct.pack("<q", body))
    assert field >= 0, "bodyLength not found in the message"
    forged = bytearray(stream)
    struct.pack_into("<q", forged, at + 8 + field, claimed)
    return bytes(forged)


def serving(storage):
    return storage.alive() and client_query(storage, "SELECT 1").stdout == "1\n"


# --- table names -------------------------------------------------------------------------

def test_table_names_never_reach_outside_the_data_directory(tmp_path, storage):
    assert client_query(storage, TABLE).returncode == 0
    assert client_query(storage, "INSERT INTO t VALUES (1, 'a', 1), (2, 'b', 2)").returncode == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")

    empty = client_query(storage, "CREATE TABLE `` (x UInt8) ENGINE = MergeTree ORDER BY x")
    assert empty.returncode != 0 and "table name is empty" in empty.stderr, empty.stderr
    for name in ["../../../victim", str(victim), "..", "."]:
        out = client_query(storage, f"CREATE TABLE `{name}` (x UInt8) ENGINE = MergeTree ORDER BY x")
        assert out.returncode == 0, out.stderr
        assert client_query(storage, f"INSERT INTO `{name}` VALUES (7)").returncode == 0
    assert (victim / "keep.txt").read_text() == "precious"
    assert rows_of(storage) == (2, 3)
    # Every table is one escaped directory of the database's own.
    database = storage.path / "data" / "default"
    assert sorted(p.name for p in database.iterdir()) == sorted(
        ["t", "%2E%2E%2F%2E%2E%2F%2E%2E%2Fvictim", "%2E%2E", "%2E",
         "".join(c if c.isalnum() or c == "_" else f"%{ord(c):02X}" for c in str(victim))])
    too_long = client_query(storage, f"CREATE TABLE `{'x' * 207}` (x UInt8) ENGINE = MergeTree ORDER BY x")
    assert "max length of a table name is 206" in too_long.stderr


def test_creating_a_table_never_deletes_what_is_in_its_way(storage):
    stray = storage.path / "data" / "default" / "t2"
    stray.mkdir(parents=True)
    (stray / "someone_elses.bin").write_bytes(b"data")
    out = client_query(storage, "CREATE TABLE t2 (x UInt8) ENGINE = MergeTree ORDER BY x")
    assert out.returncode != 0 and "already exists and is not a table of this node" in out.stderr, out.stderr
    assert str(stray) in out.stderr
    assert (stray / "someone_elses.bin").read_bytes() == b"data"


def test_a_failed_query_is_answered_with_the_code_of_its_kind(storage):
    """Ingest.Query answers as Flight SQL does: a client tells a statement to fix from a table
    that is not there, and each message says which statement of the script and where."""
    rpc = Client(storage.addr)
    try:
        assert rpc.query(TABLE)[0] == grpc.StatusCode.OK
        cases = [
            ("SELECT * FROM missing", grpc.StatusCode.NOT_FOUND, "does not exist"),
            ("SELECT 1;\nSELEC 2", grpc.StatusCode.INVALID_ARGUMENT, "2:1"),
            (TABLE, grpc.StatusCode.ALREADY_EXISTS, "already exists"),
            ("SELECT nope FROM t", grpc.StatusCode.INVALID_ARGUMENT, "nope"),
        ]
        for sql, code, text in cases:
            answered, details = rpc.query(sql)
            assert (answered, text in details) == (code, True), (sql, answered, details)
    finally:
        rpc.close()


# --- inserts -----------------------------------------------------------------------------

def test_a_huge_claimed_ipc_body_is_refused_without_allocating_it(storage):
    assert client_query(storage, TABLE).returncode == 0
    rpc = Client(storage.addr)
    assert rpc.insert("t", ipc_stream(block(range(100))))[0] == grpc.StatusCode.OK
    forged = claim_body_length(ipc_stream(block(range(100, 110))), 1 << 46)
    code, details, _ = rpc.insert("t", bytes(forged))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert serving(storage)
    assert rows_of(storage) == (100, sum(range(100)))


def test_mutated_ipc_payloads_are_answered_and_nothing_acknowledged_is_lost(storage):
    assert client_query(storage, TABLE).returncode == 0
    rpc = Client(storage.addr)
    good = ipc_stream(block(range(50)))
    assert rpc.insert("t", good)[0] == grpc.StatusCode.OK
    rng = random.Random(15)
    for i in range(300):
        payload = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(payload))
            payload[at] = rng.randrange(256) if rng.random() < 0.7 else 0xFF
        if rng.random() < 0.1:
            payload = payload[: rng.randrange(len(payload))]
        code, details, _ = rpc.insert("t", bytes(payload))
        # A panic caught in the handler would be INTERNAL; the node must survive it either way.
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), (i, details)
    assert serving(storage)
    out = client_query(storage, "SELECT count() FROM t WHERE id < 50 AND name = concat('n', toString(id))")
    assert int(out.stdout) >= 50, out


# --- offsets -----------------------------------------------------------------------------

def test_a_bad_offset_path_is_refused_before_anything_is_prepared(tmp_path, keeper, storage):
    assert client_query(storage, TABLE).returncode == 0
    rpc = Client(storage.addr)
    for path in ["a", "/a//b", "", "/a/", "/a/../b"]:
        code, details, _ = rpc.insert("t", ipc_stream(block(range(3))), token=f"tok-{path}", offset=(path, 0, 3))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "offset path" in details, (path, code, details)
    assert not list((storage.path / "data" / "default" / "t").glob("prepared_*"))
    storage.kill()
    storage.start()
    assert serving(storage) and rows_of(storage) == (0, 0)


def offset_reason(metadata):
    return metadata.get("mergestream-refusal")


def test_each_refusal_of_an_offset_commit_says_why(keeper, storage):
    assert client_query(storage, TABLE).returncode == 0
    rpc = Client(storage.addr)
    zk = KazooClient(hosts=keeper.hosts)
    zk.start()
    try:
        code, details, meta = rpc.insert("t", ipc_stream(block(range(3))), token="m-1", offset=("/offsets/missing", 0, 3))
        assert (code, offset_reason(meta)) == (grpc.StatusCode.FAILED_PRECONDITION, "offset-node-missing"), details
        zk.create("/offsets/p0", b'{"next": 0}', makepath=True)
        code, _, _ = rpc.insert("t", ipc_stream(block(range(3))), token="p0-1", offset=("/offsets/p0", 0, 3))
        assert code == grpc.StatusCode.OK
        code, details, meta = rpc.insert("t", ipc_stream(block(range(3, 6))), token="p0-2", offset=("/offsets/p0", 0, 6))
        assert (code, offset_reason(meta)) == (grpc.StatusCode.ABORTED, "stale-version"), details
        zk.set("/offsets/p0", b"\x00garbage")
        code, details, meta = rpc.insert("t", ipc_stream(block(range(3, 6))), token="p0-3", offset=("/offsets/p0", 1, 6))
        assert (code, offset_reason(meta)) == (grpc.StatusCode.DATA_LOSS, "corrupt-offset-record"), details
        assert "/offsets/p0" in details
    finally:
        zk.stop()
    assert rows_of(storage) == (3, 3)
    assert not list((storage.path / "data" / "default" / "t").glob("prepared_*"))


def test_without_a_coordinator_an_offset_commit_is_a_configuration_error(tmp_path):
    storage = StorageNode(tmp_path, None).start()
    try:
        assert client_query(storage, TABLE).returncode == 0
        code, details, meta = Client(storage.addr).insert("t", ipc_stream(block(range(3))), token="x",
                                                          offset=("/offsets/x", 0, 3))
        assert (code, offset_reason(meta)) == (grpc.StatusCode.FAILED_PRECONDITION, "no-coordinator"), details
        assert "--coordinator" in details
    finally:
        storage.kill()


# --- SQL ---------------------------------------------------------------------------------

def test_deep_sql_is_answered_as_clickhouse_answers_it(storage):
    assert client_query(storage, TABLE).returncode == 0
    assert client_query(storage, "INSERT INTO t SELECT number, toString(number), 0 FROM numbers(100)").returncode == 0
    conditions = " AND ".join(f"id != {i}" for i in range(1000))
    out = client_query(storage, f"SELECT count() FROM t WHERE {conditions}")
    assert out.returncode == 0 and out.stdout == "0\n", out.stderr
    disjunction = " OR ".join(f"id = {i}" for i in range(5000))
    assert client_query(storage, f"SELECT count() FROM t WHERE {disjunction}").stdout == "100\n"
    for terms in (1000, 10000):
        out = client_query(storage, "SELECT " + "+".join(["1"] * terms))
        assert out.returncode != 0 and "TOO_DEEP_AST" in out.stderr, out.stderr
    out = client_query(storage, "SELECT " + "(" * 100000 + "1" + ")" * 100000)
    assert "TOO_DEEP_RECURSION" in out.stderr
    assert serving(storage)


def test_deep_sql_in_local_is_refused_at_once(tmp_path):
    for terms in (3000, 10000, 100000):
        started = time.monotonic()
        result = run_ours("SELECT " + "+".join(["1"] * terms) + ";", path=tmp_path, timeout=60)
        assert result.code == 1 and "TOO_DEEP_AST" in result.stderr, result
        assert "1:" in result.stderr  # line:column of the statement and of the limit
        assert time.monotonic() - started < 60
    result = run_ours("SELECT " + "+".join(["1"] * 498) + ";", path=tmp_path)
    assert result.code == 0 and result.stdout == "498\n", result


# --- deduplication -----------------------------------------------------------------------

def test_a_dedup_token_with_a_newline_survives_a_restart_as_one_token(tmp_path):
    ddl = ("CREATE TABLE d (x UInt64) ENGINE = MergeTree ORDER BY x "
           "SETTINGS non_replicated_deduplication_window = 100;")
    assert run_ours(ddl, path=tmp_path).code == 0
    first = "INSERT INTO d SETTINGS insert_deduplication_token = 'a\\nb' VALUES (1);"
    assert run_ours(first, path=tmp_path).code == 0
    # A new process reads the dedup log back.
    later = ("INSERT INTO d SETTINGS insert_deduplication_token = 'a' VALUES (2);"
             "INSERT INTO d SETTINGS insert_deduplication_token = 'b' VALUES (3);"
             "INSERT INTO d SETTINGS insert_deduplication_token = 'a\\nb' VALUES (4);"
             "SELECT x FROM d ORDER BY x;")
    result = run_ours(later, path=tmp_path)
    assert result.code == 0 and result.stdout == "1\n2\n3\n", result


# --- the data directory ------------------------------------------------------------------

def test_a_corrupt_table_definition_skips_that_table_only(tmp_path):
    script = ("CREATE TABLE a (x UInt64) ENGINE = MergeTree ORDER BY x; INSERT INTO a VALUES (1), (2);"
              "CREATE TABLE b (x UInt64) ENGINE = MergeTree ORDER BY x; INSERT INTO b VALUES (3);")
    assert run_ours(script, path=tmp_path).code == 0
    database = tmp_path / "data" / "default"
    (database / "b" / "table.json").write_text("{ not json")
    result = run_ours("SELECT sum(x) FROM a;", path=tmp_path)
    assert result.code == 0 and result.stdout == "3\n", result
    assert "cannot open this table" in result.stderr and str(database / "b") in result.stderr
    assert (database / "b" / "table.json").read_text() == "{ not json"
    # Its name stays taken: nothing replaces the files of a table that did not open.
    result = run_ours("CREATE TABLE b (x UInt64) ENGINE = MergeTree ORDER BY x;", path=tmp_path)
    assert result.code == 1 and "not a table of this node" in result.stderr


def test_a_part_directory_replaced_by_a_file_is_detached_and_logged(tmp_path):
    script = ("CREATE TABLE a (x UInt64) ENGINE = MergeTree ORDER BY x;"
              "SYSTEM STOP MERGES a; INSERT INTO a VALUES (1); INSERT INTO a VALUES (2);")
    assert run_ours(script, path=tmp_path).code == 0
    table = tmp_path / "data" / "default" / "a"
    parts = sorted(p for p in table.iterdir() if p.name.startswith("all_"))
    victim = parts[-1]
    subprocess.run(["rm", "-rf", str(victim)], check=True)
    victim.write_text("not a part")
    result = run_ours("SELECT sum(x) FROM a;", path=tmp_path)
    assert result.code == 0 and result.stdout == "1\n", result
    assert "not a directory" in result.stderr
    assert (table / "detached" / f"broken_{victim.name}").read_text() == "not a part"
