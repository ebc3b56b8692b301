"""SIGKILL the storage node during inserts and merges: every acknowledged insert survives, no
insert is half there or there twice, and no half-written part is ever visible."""

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness import BIN, run_ours

ROWS_PER_INSERT = 500


def start_local(path: Path, script: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(BIN), "local", "--path", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdin.write(script)
    proc.stdin.close()
    return proc


def inserts_script(first: int, count: int) -> str:
    lines = []
    for i in range(first, first + count):
        rows = ", ".join(f"({i * ROWS_PER_INSERT + j}, {i}, 'payload-{j}')" for j in range(ROWS_PER_INSERT))
        lines.append(f"INSERT INTO t VALUES {rows};")
        # The acknowledgement: printed only after the insert returned.
        lines.append(f"SELECT 'ack', {i};")
    return "\n".join(lines)


def kill_after_acks(proc: subprocess.Popen, acks_before_kill: int, extra_delay: float) -> list[int]:
    """Reads acknowledgements until `acks_before_kill`, waits `extra_delay`, sends SIGKILL."""
    acked = []
    lock = threading.Lock()

    def reader():
        for line in proc.stdout:
            parts = line.split("\t")
            if parts[0] == "ack":
                with lock:
                    acked.append(int(parts[1]))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        with lock:
            if len(acked) >= acks_before_kill:
                break
        if proc.poll() is not None:
            break
        time.sleep(0.005)
    time.sleep(extra_delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    thread.join(timeout=5)
    with lock:
        return list(acked)


def check_table(path: Path, acked: list[int]):
    result = run_ours(
        "SELECT v, count(), min(k), max(k) FROM t GROUP BY v ORDER BY v;"
        "SELECT count() FROM system.parts WHERE table = 't' AND active = 1",
        path=path,
    )
    assert result.code == 0, result
    lines = result.stdout.strip().split("\n")
    per_insert = {}
    for line in lines[:-1]:
        v, count, lo, hi = map(int, line.split("\t"))
        per_insert[v] = (count, lo, hi)
    for v, (count, lo, hi) in per_insert.items():
        # All or nothing, and never twice.
        assert count == ROWS_PER_INSERT, f"insert {v} has {count} rows"
        assert (lo, hi) == (v * ROWS_PER_INSERT, v * ROWS_PER_INSERT + ROWS_PER_INSERT - 1)
    for v in acked:
        assert v in per_insert, f"acknowledged insert {v} is lost"
    leftovers = [p.name for p in (path / "data" / "default" / "t").iterdir() if p.name.startswith("tmp_")]
    assert leftovers == [], "temporary parts survived a restart"
    return per_insert


@pytest.mark.parametrize("round_", range(6))
def test_sigkill_during_inserts_and_background_merges(tmp_path, round_):
    rng = random.Random(round_)
    path = tmp_path / "data"
    setup = run_ours(
        "CREATE TABLE t (k UInt64, v UInt32, s String) ENGINE = MergeTree ORDER BY k "
        "SETTINGS index_granularity = 64",
        path=path,
    )
    assert setup.code == 0, setup
    acked_total = []
    next_insert = 0
    for _ in range(3):
        proc = start_local(path, inserts_script(next_insert, 40))
        acked = kill_after_acks(proc, rng.randint(1, 30), rng.random() * 0.05)
        acked_total += acked
        present = check_table(path, acked_total)
        next_insert = max([next_insert - 1, *present.keys(), *acked]) + 1


@pytest.mark.parametrize("round_", range(4))
def test_sigkill_during_optimize_final(tmp_path, round_):
    rng = random.Random(100 + round_)
    path = tmp_path / "data"
    script = (
        "CREATE TABLE t (k UInt64, v UInt32, s String) ENGINE = ReplacingMergeTree ORDER BY k;\n"
        "SYSTEM STOP MERGES t;\n" + inserts_script(0, 30) + "\nSYSTEM START MERGES t;"
    )
    result = run_ours(script, path=path)
    assert result.code == 0, result
    acked = list(range(30))
    proc = start_local(path, "OPTIMIZE TABLE t FINAL; SELECT 'ack', 0;")
    time.sleep(rng.random() * 0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    check_table(path, acked)
    # The table is still usable: the merge can run again to the end.
    result = run_ours("OPTIMIZE TABLE t FINAL; SELECT count() FROM t; "
                      "SELECT count() FROM system.parts WHERE table = 't' AND active = 1", path=path)
    assert result.code == 0, result
    assert result.stdout == f"{30 * ROWS_PER_INSERT}\n1\n"


def test_corrupt_part_is_detached_and_the_rest_is_served(tmp_path):
    path = tmp_path / "data"
    result = run_ours(
        "CREATE TABLE t (k UInt64, v UInt32, s String) ENGINE = MergeTree ORDER BY k;"
        "SYSTEM STOP MERGES t;" + inserts_script(0, 2),
        path=path,
    )
    assert result.code == 0, result
    table_dir = path / "data" / "default" / "t"
    victim = table_dir / "all_1_1_0" / "data.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    result = run_ours("SELECT v, count() FROM t GROUP BY v ORDER BY v", path=path)
    assert result.code == 0, result
    assert result.stdout == f"1\t{ROWS_PER_INSERT}\n"
    assert "part is broken" in result.stderr and "all_1_1_0" in result.stderr
    assert (table_dir / "detached" / "broken_all_1_1_0").is_dir()
