"""Flight SQL transport benchmark: the same queries over the same data, in one run, through
three paths, so that what the wire costs is visible.

  local   `storage-node local --time … FORMAT Null` (release): the plan run in-process, its
          batches dropped as they come (the statement's own time, no process start)
  flight  `storage-node serve --flight-addr` (release) and ADBC's Flight SQL driver in this
          process: GetFlightInfo, then DoGet read batch by batch to the last row
  chdb    ClickHouse 26.9 in this process (chDB), the result returned as an Arrow table

Queries: a full scan of every row (k, v, s), a FINAL aggregate and a GROUP BY, over a
ReplacingMergeTree of `--inserts` blocks of `--rows` rows each (keys repeating across
blocks, never merged, as bench/run.py builds it). Each query runs `--repeat` times per
path, alternating paths, and the median counts. Printed: one JSON object per measurement,
then a table with flight/local (the transport overhead; the goal is at most 1.10) and
chdb/flight (above 1 is faster than ClickHouse), and the DoGet stream rate of the scan in
rows/s and MB/s of Arrow data.

    python bench/flight.py [--rows 1000000] [--inserts 10] [--repeat 3]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
from chdb import session as chdb_session

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("MERGESTREAM_BIN", ROOT / "target" / "release" / "storage-node"))

# SYSTEM STOP MERGES lasts only for its process: with no merge threads, every process sees
# the same parts as chDB's session does with its merges stopped.
NO_MERGES = ["--merge-threads", "0"]

QUERIES = [
    ("scan", "SELECT k, v, s FROM t"),
    ("final_aggregate", "SELECT count(), sum(v) FROM t FINAL"),
    ("group_by", "SELECT k % 1000 AS g, count(), sum(v) FROM t GROUP BY g"),
]


def setup_statements(rows, inserts):
    create = "CREATE TABLE t (k UInt64, v Float64, s String, ver UInt64) ENGINE = ReplacingMergeTree(ver) ORDER BY k"
    return [create, "SYSTEM STOP MERGES t"] + [
        f"INSERT INTO t SELECT (number * 7919 + {i}) % {rows}, toFloat64(number) / 3, toString(number), {i} "
        f"FROM numbers({rows})"
        for i in range(inserts)
    ]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_seconds(path, sql):
    out = subprocess.run([str(BIN), "local", *NO_MERGES, "--path", str(path), "--time", "--query", f"{sql} FORMAT Null"],
                         capture_output=True, text=True, check=True)
    return float(out.stderr.strip().splitlines()[-1])


def flight_run(conn, sql):
    """Seconds to the last row, rows and Arrow bytes received."""
    began = time.perf_counter()
    rows = nbytes = 0
    with conn.cursor() as cur:
        cur.execute(sql)
        for batch in cur.fetch_record_batch():
            rows += batch.num_rows
            nbytes += batch.nbytes
    return time.perf_counter() - began, rows, nbytes


def chdb_run(sess, sql):
    began = time.perf_counter()
    table = sess.query(sql, "ArrowTable")
    return time.perf_counter() - began, table.num_rows


def wait_for_port(port, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("storage-node serve exited")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("the Flight SQL port did not open")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--inserts", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-flight-"))
    data = work / "mergestream"
    statements = setup_statements(args.rows, args.inserts)
    subprocess.run([str(BIN), "local", *NO_MERGES, "--path", str(data), "--query", ";\n".join(statements)], check=True)
    sess = chdb_session.Session(str(work / "chdb"))
    for statement in statements:
        sess.query(statement)

    port = free_port()
    log = open(work / "serve.log", "wb")
    server = subprocess.Popen([str(BIN), "serve", *NO_MERGES, "--path", str(data), "--grpc-addr", f"127.0.0.1:{free_port()}",
                               "--flight-addr", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    results = {}
    try:
        wait_for_port(port, server)
        with flightsql.connect(f"grpc://127.0.0.1:{port}", autocommit=True) as conn:
            for name, sql in QUERIES:
                times = {"local": [], "flight": [], "chdb": []}
                for _ in range(args.repeat):
                    times["local"].append(local_seconds(data, sql))
                    seconds, rows, nbytes = flight_run(conn, sql)
                    times["flight"].append(seconds)
                    chdb_seconds, chdb_rows = chdb_run(sess, sql)
                    times["chdb"].append(chdb_seconds)
                    if rows != chdb_rows:
                        raise RuntimeError(f"{name}: {rows} rows over Flight SQL, {chdb_rows} from chDB")
                medians = {path: statistics.median(t) for path, t in times.items()}
                results[name] = (medians, rows, nbytes)
                print(json.dumps({"query": name, "rows": rows, "arrow_bytes": nbytes,
                                  **{f"{p}_s": round(s, 4) for p, s in medians.items()},
                                  **{f"{p}_runs": [round(x, 4) for x in t] for p, t in times.items()}}), flush=True)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.inserts} x {args.rows} rows; median of {args.repeat} runs per path")
    print(f"{'query':<16} {'local s':>9} {'flight s':>9} {'chdb s':>9} {'flight/local':>13} {'chdb/flight':>12}")
    for name, (m, _, _) in results.items():
        print(f"{name:<16} {m['local']:>9.3f} {m['flight']:>9.3f} {m['chdb']:>9.3f} "
              f"{m['flight'] / m['local']:>13.2f} {m['chdb'] / m['flight']:>12.2f}")
    m, rows, nbytes = results["scan"]
    print(f"\nDoGet stream (scan): {rows / m['flight'] / 1e6:.2f} M rows/s, "
          f"{nbytes / m['flight'] / 1e6:.0f} MB/s of Arrow data")


if __name__ == "__main__":
    main()
