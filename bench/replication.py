"""Replication benchmark: a replicated table on two storage nodes against the same node's
non-replicated table, in one run (release builds, our coordinator on loopback).

- insert: `--blocks` INSERTs of `--rows` rows each (`INSERT … SELECT … FROM numbers()`, one part
  each, one `storage-node client` call each), into a MergeTree table, into a
  ReplicatedMergeTree with quorum off, and with `insert_quorum = 2`: rows/s of each and their
  ratio to the local table (goal: 0.8 or more with quorum off);
- delay: a steady `--steady-rows` rows/s into r1 (a block every 100 ms) for `--steady-seconds`,
  while a poller reads r2's `max(k)`: from each insert's acknowledgement on r1 to the first
  poll on r2 that sees it, p50 and p99 (goal: p99 under 1 s). A poll is one client process,
  so the figures include its few milliseconds;
- fetch: one part of `--fetch-rows` rows inserted on r1 while r2's fetches are stopped, then
  fetched: the MB/s of the fetch as r2 logs it (its bytes and milliseconds), against
  `shutil.copytree` of the same part directory on the same disk.

Prints one JSON line per measurement and a summary. Timings on a shared 2-core machine move by
±25% from run to run.

    python bench/replication.py [--rows 100000] [--blocks 20] [--steady-rows 100000]
        [--steady-seconds 10] [--fetch-rows 1000000]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
os.environ.setdefault("MERGESTREAM_BIN", str(RELEASE / "storage-node"))
os.environ.setdefault("MERGESTREAM_COORDINATOR_BIN", str(RELEASE / "coordinator"))
sys.path.insert(0, str(ROOT / "tests" / "replication"))
sys.path.insert(0, str(ROOT / "tests" / "coordinator"))

from replicas import Replica, wait_until  # noqa: E402
from services import CoordinatorNode  # noqa: E402

PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


def emit(**row):
    print(json.dumps(row), flush=True)
    return row


def insert_rate(replica, table, rows, blocks, settings=""):
    began = time.perf_counter()
    for b in range(blocks):
        replica.query(f"{settings}INSERT INTO {table} SELECT number + {b * rows}, number * 3 FROM numbers({rows})")
    elapsed = time.perf_counter() - began
    return rows * blocks / elapsed


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def replication_delay(r1, r2, table, rows_per_second, seconds):
    block = rows_per_second // 10
    acks = []  # (acknowledged at, max k of the block)
    polls = []  # (read at, max k seen)
    done = threading.Event()

    def poll():
        while not done.is_set():
            out = r2.query(f"SELECT max(k) FROM {table}").strip()
            polls.append((time.perf_counter(), int(out or 0)))

    poller = threading.Thread(target=poll)
    poller.start()
    base = 10**9
    start = time.perf_counter()
    for i in range(seconds * 10):
        due = start + i * 0.1
        time.sleep(max(0.0, due - time.perf_counter()))
        first = base + i * block
        r1.query(f"INSERT INTO {table} SELECT number + {first}, number FROM numbers({block})")
        acks.append((time.perf_counter(), first + block - 1))
    wait_until(lambda: polls and polls[-1][1] >= acks[-1][1], 60, "r2 caught up")
    done.set()
    poller.join()
    delays = []
    for acked_at, last in acks:
        seen = next(t for t, k in polls if k >= last)
        delays.append(max(0.0, seen - acked_at))
    poll_gaps = [b[0] - a[0] for a, b in zip(polls, polls[1:])]
    return delays, statistics.median(poll_gaps) if poll_gaps else 0.0


def fetch_rate(r1, r2, table, rows):
    r2.query(f"SYSTEM STOP FETCHES {table}")
    r1.query(f"INSERT INTO {table} SELECT number + 2000000000, number FROM numbers({rows})")
    part = r1.query(f"SELECT name FROM system.parts WHERE table = '{table}' AND active "
                    "ORDER BY max_block_number DESC LIMIT 1").strip()
    source_dir = r1.path / "data" / "default" / table / part
    before = r2.log_path.read_text().count("fetched a part")
    r2.query(f"SYSTEM START FETCHES {table}")
    r2.query(f"SYSTEM SYNC REPLICA {table}")
    wait_until(lambda: r2.log_path.read_text().count("fetched a part") > before, 30, "the fetch logged")
    line = [ln for ln in r2.log_path.read_text().splitlines() if "fetched a part" in ln and part in ln][-1]
    fetched_bytes = int(re.search(r"bytes=(\d+)", line).group(1))
    fetched_ms = max(1, int(re.search(r"ms=(\d+)", line).group(1)))
    copies = []
    for attempt in range(3):
        target = r1.path / f"copy_{attempt}"
        began = time.perf_counter()
        shutil.copytree(source_dir, target)
        os.sync()
        copies.append(time.perf_counter() - began)
        shutil.rmtree(target)
    copy_seconds = min(copies)
    mb = fetched_bytes / 1e6
    return mb / (fetched_ms / 1000), mb / copy_seconds, fetched_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per insert")
    parser.add_argument("--blocks", type=int, default=20, help="inserts per table")
    parser.add_argument("--steady-rows", type=int, default=100_000, help="rows/s of the steady load")
    parser.add_argument("--steady-seconds", type=int, default=10)
    parser.add_argument("--fetch-rows", type=int, default=1_000_000, help="at most 1048449: one part")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-replication-") as tmp:
        tmp = Path(tmp)
        coordinator = CoordinatorNode(1, tmp / "coordinator" / "node1").start()
        r1 = Replica(tmp, coordinator.hosts, "r1").start()
        r2 = Replica(tmp, coordinator.hosts, "r2").start()
        try:
            r1.query("CREATE TABLE local (k UInt64, v UInt64) ENGINE = MergeTree ORDER BY k")
            for table in ("rep", "rep_quorum", "steady", "fetch"):
                for replica in (r1, r2):
                    replica.query(f"CREATE TABLE {table} (k UInt64, v UInt64) "
                                  f"ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")
            rates = {}
            # In turns, best of two, so that a slow spell of the machine hits all three alike.
            for _ in range(2):
                for label, table, settings in (("local", "local", ""), ("replicated", "rep", ""),
                                               ("replicated_quorum_2", "rep_quorum", "SET insert_quorum = 2; ")):
                    rate = insert_rate(r1, table, args.rows, args.blocks // 2, settings)
                    rates[label] = max(rates.get(label, 0.0), rate)
                    emit(phase="insert", table=label, rows_per_second=round(rate))
            delays, poll_gap = replication_delay(r1, r2, "steady", args.steady_rows, args.steady_seconds)
            p50, p99 = percentile(delays, 50), percentile(delays, 99)
            emit(phase="delay", rows_per_second=args.steady_rows, p50_ms=round(p50 * 1000, 1),
                 p99_ms=round(p99 * 1000, 1), median_poll_ms=round(poll_gap * 1000, 1))
            fetch_mbs, copy_mbs, fetched = fetch_rate(r1, r2, "fetch", args.fetch_rows)
            emit(phase="fetch", bytes=fetched, fetch_mb_per_s=round(fetch_mbs, 1), copy_mb_per_s=round(copy_mbs, 1))
        finally:
            r1.stop()
            r2.stop()
            coordinator.stop()

    print()
    print(f"insert rows/s: local {rates['local']:.0f}, replicated {rates['replicated']:.0f} "
          f"({rates['replicated'] / rates['local']:.2f}x, goal >= 0.8), quorum 2 "
          f"{rates['replicated_quorum_2']:.0f} ({rates['replicated_quorum_2'] / rates['local']:.2f}x)")
    print(f"replication delay at {args.steady_rows} rows/s: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
          f"(goal: p99 < 1000 ms; polls every {poll_gap * 1000:.0f} ms)")
    print(f"part fetch: {fetch_mbs:.0f} MB/s against a file copy's {copy_mbs:.0f} MB/s "
          f"({fetch_mbs / copy_mbs:.2f}x)")


if __name__ == "__main__":
    main()
