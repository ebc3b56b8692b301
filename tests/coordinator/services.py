"""Real services for the coordinator tests: Apache ZooKeeper 3.8 (Debian's package) as the
reference, and coordinator nodes started from the binary the test script built."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COORDINATOR_BIN = Path(os.environ.get("MERGESTREAM_COORDINATOR_BIN", ROOT / "target" / "debug" / "coordinator"))
ZOOKEEPER_CLASSPATH = "/usr/share/java/*:/etc/zookeeper/conf"
# The secret the test clusters' nodes authenticate each other with.
CLUSTER_SECRET = "test-cluster-secret-0123456789\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_letter(port, word, timeout=2.0):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)


def wait_until(predicate, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout}s")


class ZooKeeper:
    """Apache ZooKeeper on loopback ports with every four-letter word enabled: one standalone
    server, or with `size` > 1 an ensemble (`hosts` then lists all its client ports)."""

    def __init__(self, workdir: Path, size=1, jvm_flags=()):
        workdir.mkdir(parents=True, exist_ok=True)
        self.ports = [free_port() for _ in range(size)]
        quorum = [(free_port(), free_port()) for _ in range(size)] if size > 1 else []
        self.procs, self.logs = [], []
        for i, port in enumerate(self.ports, start=1):
            data = workdir / f"server{i}"
            data.mkdir(exist_ok=True)
            cfg = (f"tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={data}\nclientPort={port}\n"
                   "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=*\n")
            for j, (peer, election) in enumerate(quorum, start=1):
                cfg += f"server.{j}=127.0.0.1:{peer}:{election}\n"
            if quorum:
                (data / "myid").write_text(f"{i}\n")
            (workdir / f"zoo{i}.cfg").write_text(cfg)
            log = open(workdir / f"zookeeper{i}.log", "wb")
            self.logs.append(log)
            self.procs.append(subprocess.Popen(
                ["java", "-Xmx512m", *jvm_flags, "-cp", ZOOKEEPER_CLASSPATH,
                 "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(workdir / f"zoo{i}.cfg")],
                stdout=log, stderr=subprocess.STDOUT,
            ))
        for port in self.ports:
            # `srvr` names the mode only once the server serves clients (an ensemble member
            # after it joined a quorum).
            wait_until(lambda: "Mode:" in four_letter(port, "srvr"), 90, "ZooKeeper")

    @property
    def port(self):
        return self.ports[0]

    @property
    def hosts(self):
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def stop(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for log in self.logs:
            log.close()


class CoordinatorNode:
    """One `coordinator serve` process; it can be SIGKILLed and started again on its data."""

    def __init__(self, node_id, data_dir: Path, client_port=None, raft_port=None, tick_ms=2000, snapshot_every=None,
                 metrics_port=None, extra_args=()):
        self.extra_args = list(extra_args)
        self.node_id = node_id
        self.data_dir = data_dir
        self.client_port = client_port or free_port()
        self.raft_port = raft_port or free_port()
        self.tick_ms = tick_ms
        self.snapshot_every = snapshot_every
        self.metrics_port = metrics_port
        self.peers = {}
        self.proc = None

    @property
    def hosts(self):
        return f"127.0.0.1:{self.client_port}"

    @property
    def raft_addr(self):
        return f"127.0.0.1:{self.raft_port}"

    def start(self, wait=True):
        args = [str(COORDINATOR_BIN), "serve", "--node-id", str(self.node_id),
                "--client-addr", self.hosts, "--raft-addr", self.raft_addr,
                "--data-dir", str(self.data_dir), "--tick-ms", str(self.tick_ms)]
        if self.snapshot_every:
            args += ["--snapshot-every", str(self.snapshot_every)]
        args += self.extra_args
        if self.metrics_port:
            args += ["--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        for peer_id, addr in sorted(self.peers.items()):
            args += ["--peer", f"{peer_id}={addr}"]
        if self.peers:
            # Beside the data directories: every node of a cluster shares it.
            secret = self.data_dir.parent / "cluster-secret"
            if not secret.exists():
                secret.write_text(CLUSTER_SECRET)
            args += ["--cluster-secret-file", str(secret)]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(self.data_dir.parent / f"node{self.node_id}.log", "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=30):
        wait_until(lambda: four_letter(self.client_port, "ruok") == "imok", timeout, f"coordinator {self.node_id}")

    def mntr(self):
        out = four_letter(self.client_port, "mntr")
        return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


def start_cluster(base: Path, size=3, **kwargs):
    nodes = [CoordinatorNode(i + 1, base / f"node{i + 1}", **kwargs) for i in range(size)]
    for n in nodes:
        n.peers = {m.node_id: m.raft_addr for m in nodes if m is not n}
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_ready()
    return nodes


def leader_of(nodes, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in nodes:
            if n.proc is None:
                continue
            try:
                if n.mntr().get("zk_server_state") in ("leader", "standalone"):
                    return n
            except OSError:
                pass
        time.sleep(0.1)
    raise TimeoutError("no leader elected")
