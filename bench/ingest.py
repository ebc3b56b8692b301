"""End-to-end ingestion benchmark: Kafka → ReplacingMergeTree through `ingestor run`, against
the raw rdkafka consume rate of the same messages from the same broker, in one run.

It starts Tansu (the Kafka-compatible broker the tests use), a coordinator and a storage node
(release builds), produces `--messages` JSON messages to a topic of `--partitions`
partitions, then:

- raw: `kafka-consume-bench` reads them all with a plain rdkafka poll loop (best of
  `--raw-runs`), decoding nothing;
- end to end: `ingestor run` consumes them into a ReplacingMergeTree table; the time runs from
  the ingestor's start until `SELECT count()` shows every message committed (startup and
  partition ownership included).

Prints one JSON line per measurement and a summary with the ratio (end-to-end rows/s over raw
messages/s; the goal is 0.8 or more) and the peak RSS of the ingestor and the storage node.

    python bench/ingest.py [--messages 2000000] [--partitions 4]
"""

import argparse
import json
import os
import re
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
from ingest_services import CoordinatorNode, Ingestor, StorageNode, Tansu, free_port, wait_until  # noqa: E402

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
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return None


def cpu_seconds(pid):
    """User + system CPU seconds of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def raw_consume(broker, topic, partitions, n, *extra):
    out = subprocess.run([str(RELEASE / "kafka-consume-bench"), "--brokers", broker.brokers, "--topic", topic,
                          "--partitions", str(partitions), "--count", str(n), *extra],
                         capture_output=True, text=True, timeout=900, check=True)
    return json.loads(out.stdout)


PIPELINE = """name: bench
source:
  kafka:
    brokers: {brokers}
    topics: [{topic}]
format: json
tables:
  - ddl: |
      CREATE TABLE orders (id UInt64, customer String, amount Float64, status LowCardinality(String),
                           version UInt64)
      ENGINE = ReplacingMergeTree(version) ORDER BY id
    columns:
      id: id
      customer: customer
      amount: amount
      status: status
      version: version
errors:
  mode: skip
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--raw-runs", type=int, default=2)
    args = parser.parse_args()
    n, partitions = args.messages, args.partitions
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        broker = Tansu(tmp)
        keeper = CoordinatorNode(1, tmp / "keeper" / "node1").start()
        storage = StorageNode(tmp, keeper.hosts).start()
        try:
            topic = "orders-bench"
            broker.create_topic(topic, partitions)
            began = time.perf_counter()
            payload_bytes = produce(broker, topic, partitions, n)
            print(json.dumps({"step": "produce", "messages": n, "bytes": payload_bytes,
                              "seconds": round(time.perf_counter() - began, 3)}), flush=True)

            raw = min((raw_consume(broker, topic, partitions, n) for _ in range(args.raw_runs)),
                      key=lambda r: r["seconds"])
            raw_rate = n / raw["seconds"]
            print(json.dumps({"step": "raw_consume", "messages": n, "seconds": raw["seconds"],
                              "messages_per_s": round(raw_rate)}), flush=True)

            # The same read through the ingestor's Kafka source (StreamConsumer, owned messages),
            # decoding nothing: what the source costs before decoding and inserting.
            source = raw_consume(broker, topic, partitions, n, "--through-source")
            print(json.dumps({"step": "source_consume", "messages": n, "seconds": source["seconds"],
                              "messages_per_s": round(n / source["seconds"])}), flush=True)

            pipeline = tmp / "bench.yaml"
            pipeline.write_text(PIPELINE.format(brokers=broker.brokers, topic=topic))
            began = time.perf_counter()
            metrics_port = free_port()
            ingestor = Ingestor(tmp, pipeline, storage, keeper.hosts, metrics_port=metrics_port).start()

            def all_in():
                try:
                    return int(storage.query("SELECT count() FROM orders").strip()) >= n
                except AssertionError:  # the table is not created yet
                    return False
            wait_until(all_in, 900, f"{n} rows")
            e2e_s = time.perf_counter() - began
            ingestor_rss, storage_rss = peak_rss_mib(ingestor.proc.pid), peak_rss_mib(storage.proc.pid)
            ingestor_cpu, storage_cpu = cpu_seconds(ingestor.proc.pid), cpu_seconds(storage.proc.pid)
            e2e_rate = n / e2e_s
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
            insert = {m.group(1): float(m.group(2)) for m in
                      re.finditer(r"^mergestream_ingestor_insert_seconds_(sum|count) (\S+)$", metrics, re.M)}
            assert int(storage.query("SELECT count() FROM orders FINAL").strip()) == n
            print(json.dumps({"step": "end_to_end", "rows": n, "seconds": round(e2e_s, 3),
                              "rows_per_s": round(e2e_rate), "ingestor_peak_rss_mib": ingestor_rss,
                              "storage_node_peak_rss_mib": storage_rss, "ingestor_cpu_s": ingestor_cpu,
                              "blocks": int(insert.get("count", 0)),
                              "mean_insert_s": round(insert.get("sum", 0) / max(insert.get("count", 1), 1), 3),
                              "storage_node_cpu_s": storage_cpu, "broker_cpu_s": cpu_seconds(broker.proc.pid)}),
                  flush=True)
            assert ingestor.terminate() == 0
            if os.environ.get("BENCH_KEEP_LOGS"):
                for log in tmp.glob("*.log"):
                    (Path(os.environ["BENCH_KEEP_LOGS"]) / log.name).write_bytes(log.read_bytes())
            print()
            print(f"{'raw rdkafka msg/s':>18}{'end-to-end rows/s':>19}{'ratio (goal >= 0.8)':>21}"
                  f"{'ingestor RSS MiB':>18}{'storage RSS MiB':>17}")
            print(f"{round(raw_rate):>18}{round(e2e_rate):>19}{e2e_rate / raw_rate:>21.3f}"
                  f"{ingestor_rss:>18}{storage_rss:>17}")
        finally:
            storage.kill()
            keeper.stop()
            broker.kill()


if __name__ == "__main__":
    main()
