"""Side-by-side benchmark: the same SQL on mergestream (`storage-node local`, release build)
and on ClickHouse 26.9 (chDB), on this machine, in one run. Prints one JSON object per line
(one per step) and a summary table with the ratios; only the ratios mean anything on a noisy
machine. Every step runs in a fresh process of its own, so that its peak RSS is its own.

The steps that change nothing (the FINAL read and the GROUP BY) run `--repeat` times on each
side, each time in a fresh process, and report the median: a 25 ms query timed once is
mostly noise on a shared machine. The engines alternate run by run, so that a slow spell
hits both.

    python bench/run.py [--rows 1000000] [--inserts 10] [--repeat 5]
"""

import statistics

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("MERGESTREAM_BIN", ROOT / "target" / "release" / "storage-node"))

CHDB_STEP = r"""
import resource, sys, time
from chdb import session
s = session.Session(sys.argv[1])
timings = []
for statement in sys.stdin.read().split(";\n"):
    if statement.strip():
        began = time.perf_counter()
        s.query(statement, "TSV")
        timings.append(time.perf_counter() - began)
print(" ".join(f"{t:.6f}" for t in timings))
"""


def is_float(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def peak_rss(cmd, script):
    """Runs the command under /usr/bin/time-like accounting: wait4 gives the child's max RSS."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(script)
    proc.stdin.close()
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"{cmd[0]} failed ({status}): {err[-3000:]}")
    return out, err, usage.ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--inserts", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each read-only step; the median counts")
    args = parser.parse_args()
    rows, inserts = args.rows, args.inserts

    create = "CREATE TABLE t (k UInt64, v Float64, s String, ver UInt64) ENGINE = ReplacingMergeTree(ver) ORDER BY k"
    insert = lambda i: (
        f"INSERT INTO t SELECT (number * 7919 + {i}) % {rows}, toFloat64(number) / 3, toString(number), {i} "
        f"FROM numbers({rows})"
    )
    # (name, statements, rows, the statements timed, runs)
    steps = [
        ("insert", [create, "SYSTEM STOP MERGES t"] + [insert(i) for i in range(inserts)], rows * inserts, slice(2, None), 1),
        ("select_final", ["SELECT count(), sum(v) FROM t FINAL"], rows * inserts, slice(0, 1), args.repeat),
        ("optimize_final", ["SYSTEM START MERGES t", "OPTIMIZE TABLE t FINAL"], rows * inserts, slice(1, 2), 1),
        ("group_by", ["SELECT k % 100 AS b, count(), sum(v), max(s) FROM t GROUP BY b ORDER BY b"], rows, slice(0, 1), args.repeat),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        ours_dir, chdb_dir = Path(tmp) / "ours", Path(tmp) / "chdb"
        results = []
        for name, statements, step_rows, timed, runs in steps:
            script = ";\n".join(statements) + ";\n"
            ours_runs, chdb_runs, ours_rss, chdb_rss = [], [], 0, 0
            for _ in range(runs):
                _, err, rss = peak_rss([str(BIN), "local", "--path", str(ours_dir), "--time"], script)
                ours_times = [float(l) for l in err.split("\n") if is_float(l.strip())]
                ours_runs.append(sum(ours_times[timed]))
                ours_rss = max(ours_rss, rss)
                out, _, rss = peak_rss([sys.executable, "-c", CHDB_STEP, str(chdb_dir)], script)
                chdb_runs.append(sum(float(t) for t in out.split()[timed]))
                chdb_rss = max(chdb_rss, rss)
            ours_s, chdb_s = statistics.median(ours_runs), statistics.median(chdb_runs)
            result = {
                "step": name,
                "rows": step_rows,
                "runs": runs,
                "mergestream_s": round(ours_s, 3),
                "clickhouse_s": round(chdb_s, 3),
                "mergestream_rows_per_s": round(step_rows / ours_s),
                "clickhouse_rows_per_s": round(step_rows / chdb_s),
                "speed_ratio": round(chdb_s / ours_s, 3),
                "mergestream_peak_rss_mib": round(ours_rss),
                "clickhouse_peak_rss_mib": round(chdb_rss),
            }
            results.append(result)
            print(json.dumps(result), flush=True)
        print()
        print(f"{'step':<16}{'mergestream s':>15}{'clickhouse s':>14}{'ratio (>1: faster)':>20}{'RSS ms MiB':>12}{'RSS ch MiB':>12}")
        for r in results:
            print(f"{r['step']:<16}{r['mergestream_s']:>15}{r['clickhouse_s']:>14}{r['speed_ratio']:>20}"
                  f"{r['mergestream_peak_rss_mib']:>12}{r['clickhouse_peak_rss_mib']:>12}")


if __name__ == "__main__":
    main()
