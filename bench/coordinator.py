"""The coordinator against Apache ZooKeeper 3.8 on this machine, in one run.

Starts, one after the other: a standalone ZooKeeper, a one-node coordinator, a three-server
ZooKeeper ensemble and a three-node coordinator cluster, all on loopback with their data on
local disk (both fsync their logs before acknowledging). Against each it runs the same load
generator (`coordinator-bench`, the zookeeper-client crate): create, setData, then getData of
N znodes of 100 bytes from several sessions with many requests in flight. Prints one JSON line
per phase and system, then a table of ratios, the coordinator's figure over ZooKeeper's: above 1 for throughput,
or below 1 for the p99 latency, means the coordinator is ahead."""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "coordinator"))

from services import ZooKeeper, leader_of, start_cluster  # noqa: E402

BENCH_BIN = ROOT / "target" / "release" / "coordinator-bench"


def run_load(hosts, label, args):
    out = subprocess.run(
        [str(BENCH_BIN), "--hosts", hosts, "--label", label, "--ops", str(args.ops),
         "--sessions", str(args.sessions), "--in-flight", str(args.in_flight)],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    for row in rows:
        print(json.dumps(row), flush=True)
    return {row["op"]: row for row in rows}


def measure_zookeeper(base, size, args):
    zk = ZooKeeper(base / f"zookeeper{size}", size=size)
    try:
        return run_load(zk.hosts, f"zookeeper-{size}", args)
    finally:
        zk.stop()


def measure_coordinator(base, size, args):
    nodes = start_cluster(base / f"coordinator{size}", size)
    try:
        leader_of(nodes)
        return run_load(",".join(n.hosts for n in nodes), f"coordinator-{size}", args)
    finally:
        for n in nodes:
            n.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=20000, help="znodes per phase")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=16, help="requests in flight per session")
    parser.add_argument("--sizes", default="1,3", help="cluster sizes to measure")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="coordinator-bench-", dir=ROOT / "target") as tmp:
        base = Path(tmp)
        for size in (int(s) for s in args.sizes.split(",")):
            results[size] = (measure_zookeeper(base, size, args), measure_coordinator(base, size, args))

    print()
    print(f"{'servers':>7} {'op':<8} {'zookeeper ops/s':>16} {'coordinator ops/s':>18} {'speed ratio':>12}"
          f" {'zk p99 ms':>10} {'ours p99 ms':>12} {'p99 ratio':>10}")
    for size, (zk, ours) in results.items():
        for op in ("create", "setData", "getData"):
            z, o = zk[op], ours[op]
            print(f"{size:>7} {op:<8} {z['ops_per_sec']:>16.0f} {o['ops_per_sec']:>18.0f}"
                  f" {o['ops_per_sec'] / z['ops_per_sec']:>12.2f} {z['p99_ms']:>10.2f} {o['p99_ms']:>12.2f}"
                  f" {o['p99_ms'] / z['p99_ms']:>10.2f}")


if __name__ == "__main__":
    main()
