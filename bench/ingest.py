"""End-to-end ingestion benchmark: Kafka → ReplacingMergeTree through `ingestor run`, against
the raw rdkafka consume rate of the same messages from the same broker, in one run.

It starts Tansu (the Kafka-compatible broker the tests use) and a coordinator (release
builds), produces `--messages` JSON messages to a topic of `--partitions` partitions, then:

- raw: `kafka-consume-bench` reads them all with a plain rdkafka poll loop (best of
  `--raw-runs`), decoding nothing;
- end to end (`--runs` times, alternating with the raw runs, each with a pipeline of its
  own and a fresh storage node):
  `ingestor run` consumes them into a ReplacingMergeTree table (default batch limits, and
  `idle_ms: 100` so that the last blocks go as soon as the backlog is drained rather than
  after `max_ms`); the time runs from the
  ingestor's start until the commit of the block that completes the count (startup and
  partition ownership included), the time the ingestor reports in its
  `mergestream_ingestor_last_commit_timestamp_seconds` metric once its rows counter shows
  every message; the table is then checked to hold each exactly once.

Prints one JSON line per measurement and a summary with the ratio (the best end-to-end
rows/s over the best raw messages/s; the goal is 0.8 or more), the ratio of each raw run to
the end-to-end run after it, and the peak RSS of the ingestor and the storage node. Timings
on a shared 2-core machine move by ±25% from run to run, in spells that last minutes, hence
the best of several on both sides, taken in turns.

    python bench/ingest.py [--messages 2000000] [--partitions 4] [--runs 3] [--raw-runs 3]
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
os.environ.setdefault("MERGESTREAM_BIN", str(RELEASE / "storage-node"))
os.environ.setdefault("MERGESTREAM_COORDINATOR_BIN", str(RELEASE / "coordinator"))
os.environ.setdefault("MERGESTREAM_INGESTOR_BIN", str(RELEASE / "ingestor"))
sys.path.insert(0, str(ROOT / "tests" / "ingestor"))

from confluent_kafka import Producer  # noqa: E402
from ingest_services import (  # noqa: E402
    CoordinatorNode, Ingestor, StorageNode, Tansu, free_port, peak_rss_kib, wait_until,
)

STATUSES = ["new", "paid", "shipped", "cancelled"]


def produce(broker, topic, partitions, n):
    producer = Producer({"bootstrap.servers": broker.brokers, "linger.ms": 50, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 1_000_000, "enable.idempotence": False})
    total_bytes = 0
    for i in range(n):
        value = (f'{{"id":{i},"customer":"customer-{i % 10007}","amount":{(i % 100000) / 100},'
                 f'"status":"{STATUSES[i % 4]}","version":{i % 7}}}').encode()
        total_bytes += len(value)
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    return total_bytes


def peak_rss_mib(pid):
    kib = peak_rss_kib(pid)
    return None if kib is None else round(kib / 1024)


def stat_cpu_seconds(stat_path):
    """User + system CPU seconds from a /proc stat file (of a process or one of its threads)."""
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a running process."""
    return round(stat_cpu_seconds(f"/proc/{pid}/stat"), 2)


def thread_cpu_seconds(pid):
    """CPU seconds per thread name of a running process (threads of one name summed)."""
    per_name = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            seconds = stat_cpu_seconds(task / "stat")
        except OSError:
            continue
        per_name[name] = round(per_name.get(name, 0) + seconds, 2)
    return {name: s for name, s in sorted(per_name.items(), key=lambda kv: -kv[1]) if s > 0}


def raw_consume(broker, topic, partitions, n, *extra):
    """One read of the topic by `kafka-consume-bench`, with the CPU seconds it and the broker
    used: the baseline is itself CPU-bound on a small machine."""
    children, broker_cpu = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_seconds(broker.proc.pid)
    out = subprocess.run([str(RELEASE / "kafka-consume-bench"), "--brokers", broker.brokers, "--topic", topic,
                          "--partitions", str(partitions), "--count", str(n), *extra],
                         capture_output=True, text=True, timeout=900, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out.stdout)
    result["consumer_cpu_s"] = round(after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime, 2)
    result["broker_cpu_s"] = round(cpu_seconds(broker.proc.pid) - broker_cpu, 2)
    return result


PIPELINE = """name: bench-{run}
source:
  kafka:
    brokers: {brokers}
    topics: [{topic}]
format: json
tables:
  - ddl: |
      CREATE TABLE {table} (id UInt64, customer String, amount Float64, status LowCardinality(String),
                           version UInt64)
      ENGINE = ReplacingMergeTree(version) ORDER BY id
    columns:
      id: id
      customer: customer
      amount: amount
      status: status
      version: version
batch:
  idle_ms: 100
errors:
  mode: skip
"""


def end_to_end(tmp, broker, keeper, topic, n, run):
    """One run of `ingestor run` into a fresh storage node: seconds until every message is in a
    committed block, with the peak RSS and CPU of the ingestor and the storage node."""
    table = f"orders_{run}"
    storage = StorageNode(tmp, keeper.hosts, name=f"storage-node-{run}").start()
    try:
        pipeline = tmp / f"bench-{run}.yaml"
        pipeline.write_text(PIPELINE.format(brokers=broker.brokers, topic=topic, run=run, table=table))
        broker_cpu = cpu_seconds(broker.proc.pid)
        metrics_port = free_port()
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        began = time.time()
        ingestor = Ingestor(tmp, pipeline, storage, keeper.hosts, name=f"ingestor-{run}",
                            metrics_port=metrics_port).start()

        def table_metric(text, name):
            found = re.search(rf'^{name}\{{table="{table}"\}} (\S+)$', text, re.M)
            return float(found.group(1)) if found else 0

        def metrics_text():
            try:
                return urllib.request.urlopen(metrics_url, timeout=5).read().decode()
            except OSError:
                return ""  # not listening yet
        # The ingestor's own count of rows in committed blocks, polled slowly: each poll
        # takes CPU from the run (a `storage-node client` per poll took much more). The end
        # is the time the last block was committed, which the ingestor records itself, so the
        # poll interval adds nothing to the figure.
        wait_until(lambda: table_metric(metrics_text(), "mergestream_ingestor_rows_total") >= n, 900, f"{n} rows",
                   interval=0.25)
        last_commit = table_metric(metrics_text(), "mergestream_ingestor_last_commit_timestamp_seconds")
        assert last_commit > began, f"no commit time after the start: {last_commit}"
        seconds = last_commit - began
        result = {"step": "end_to_end", "run": run, "rows": n, "seconds": round(seconds, 3),
                  "rows_per_s": round(n / seconds), "ingestor_peak_rss_mib": peak_rss_mib(ingestor.proc.pid),
                  "storage_node_peak_rss_mib": peak_rss_mib(storage.proc.pid),
                  "ingestor_cpu_s": cpu_seconds(ingestor.proc.pid),
                  "storage_node_cpu_s": cpu_seconds(storage.proc.pid),
                  "ingestor_threads_cpu_s": thread_cpu_seconds(ingestor.proc.pid),
                  "broker_cpu_s": round(cpu_seconds(broker.proc.pid) - broker_cpu, 2)}
        metrics = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
        insert = {m.group(1): float(m.group(2)) for m in
                  re.finditer(r"^mergestream_ingestor_insert_duration_seconds_(sum|count) (\S+)$", metrics, re.M)}
        result["blocks"] = int(insert.get("count", 0))
        result["mean_insert_s"] = round(insert.get("sum", 0) / max(insert.get("count", 1), 1), 3)
        # Committed means visible: the table shows every message, once.
        assert int(storage.query(f"SELECT count() FROM {table}").strip()) == n
        assert int(storage.query(f"SELECT count() FROM {table} FINAL").strip()) == n
        assert ingestor.terminate() == 0
        return result
    finally:
        storage.kill()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--raw-runs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="end-to-end runs; the best one is compared")
    args = parser.parse_args()
    n, partitions = args.messages, args.partitions
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        broker = Tansu(tmp)
        keeper = CoordinatorNode(1, tmp / "keeper" / "node1").start()
        try:
            topic = "orders-bench"
            broker.create_topic(topic, partitions)
            began = time.perf_counter()
            payload_bytes = produce(broker, topic, partitions, n)
            print(json.dumps({"step": "produce", "messages": n, "bytes": payload_bytes,
                              "seconds": round(time.perf_counter() - began, 3)}), flush=True)

            # The same read through the ingestor's Kafka source, decoding nothing: what the
            # source costs before decoding and inserting.
            source = raw_consume(broker, topic, partitions, n, "--through-source")
            print(json.dumps({"step": "source_consume", "messages": n, "seconds": source["seconds"],
                              "messages_per_s": round(n / source["seconds"]),
                              "consumer_cpu_s": source["consumer_cpu_s"], "broker_cpu_s": source["broker_cpu_s"]}),
                  flush=True)

            # Raw and end-to-end runs alternate, so that a slow spell of the machine (they
            # last minutes here) falls on both sides rather than on one.
            raws, runs = [], []
            for run in range(1, max(args.runs, args.raw_runs) + 1):
                if run <= args.raw_runs:
                    raws.append(raw_consume(broker, topic, partitions, n))
                    print(json.dumps({"step": "raw_consume", "run": run, "messages": n,
                                      "seconds": raws[-1]["seconds"], "messages_per_s": round(n / raws[-1]["seconds"]),
                                      "consumer_cpu_s": raws[-1]["consumer_cpu_s"],
                                      "broker_cpu_s": raws[-1]["broker_cpu_s"]}), flush=True)
                if run <= args.runs:
                    runs.append(end_to_end(tmp, broker, keeper, topic, n, run))
                    print(json.dumps(runs[-1]), flush=True)
            raw_rate = n / min(r["seconds"] for r in raws)
            best = min(runs, key=lambda r: r["seconds"])
            e2e_rate = n / best["seconds"]
            pairs = sorted(r["seconds"] / e["seconds"] for r, e in zip(raws, runs))
            if os.environ.get("BENCH_KEEP_LOGS"):
                for log in tmp.glob("*.log"):
                    (Path(os.environ["BENCH_KEEP_LOGS"]) / log.name).write_bytes(log.read_bytes())
            print()
            print(f"best of {args.raw_runs} raw runs and of {args.runs} end-to-end runs, alternated; each run's "
                  f"figures are above; the ratio of each raw run to the end-to-end run after it: "
                  f"{', '.join(f'{p:.2f}' for p in pairs)}")
            print(f"{'raw rdkafka msg/s':>18}{'end-to-end rows/s':>19}{'ratio (goal >= 0.8)':>21}"
                  f"{'ingestor RSS MiB':>18}{'storage RSS MiB':>17}")
            print(f"{round(raw_rate):>18}{round(e2e_rate):>19}{e2e_rate / raw_rate:>21.3f}"
                  f"{best['ingestor_peak_rss_mib']:>18}{best['storage_node_peak_rss_mib']:>17}")
        finally:
            keeper.stop()
            broker.kill()


if __name__ == "__main__":
    main()
