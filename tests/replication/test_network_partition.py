"""A replica cut off by the network: r2 runs in a network namespace joined to the host by a veth
pair, and iptables rules inside the namespace drop everything but the test's own queries to it.
While it is cut off, inserts go on through r1; r2 serves reads and, once its coordinator session
has expired, refuses inserts with TABLE_IS_READ_ONLY. After the partition heals it takes inserts
again and both replicas hold every block once."""

import os
import subprocess

import pytest

from replicas import STORAGE_BIN, Process, free_port, port_open, wait_until
from services import COORDINATOR_BIN

PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


def sh(*args):
    subprocess.run(args, check=True, capture_output=True, text=True)


class Namespace:
    """A network namespace with a veth pair: the host is HOST_IP, the namespace NS_IP."""

    def __init__(self):
        tag = os.getpid() % 10000
        self.name, self.host_if, self.ns_if = f"msp{tag}", f"msph{tag}", f"mspn{tag}"
        third = tag % 250
        self.host_ip, self.ns_ip = f"10.213.{third}.1", f"10.213.{third}.2"
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        sh("ip", "link", "set", self.ns_if, "netns", self.name)
        sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        self.run("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        self.run("ip", "link", "set", self.ns_if, "up")
        self.run("ip", "link", "set", "lo", "up")

    def run(self, *args):
        sh("ip", "netns", "exec", self.name, *args)

    def cut_off(self, except_port, and_to=None):
        """Drops every packet in or out of the namespace but the test's queries to `except_port`
        (and, with `and_to`, the namespace's connections to that port of the host)."""
        rules = [["INPUT", "-i", "lo"], ["OUTPUT", "-o", "lo"],
                 ["INPUT", "-p", "tcp", "--dport", str(except_port)],
                 ["OUTPUT", "-p", "tcp", "--sport", str(except_port)]]
        if and_to:
            rules += [["OUTPUT", "-p", "tcp", "--dport", str(and_to)], ["INPUT", "-p", "tcp", "--sport", str(and_to)]]
        for rule in rules:
            self.run("iptables", "-A", *rule, "-j", "ACCEPT")
        self.run("iptables", "-A", "INPUT", "-j", "DROP")
        self.run("iptables", "-A", "OUTPUT", "-j", "DROP")

    def heal(self):
        self.run("iptables", "-F")

    def remove(self):
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)


class Node(Process):
    """A storage node serving a replica on given addresses, in a namespace or not."""

    def __init__(self, workdir, name, ip, coordinator, netns=None):
        self.ip, self.grpc_port = ip, free_port()
        args = [str(STORAGE_BIN), "serve", "--path", str(workdir / f"{name}-data"),
                "--grpc-addr", f"{ip}:{self.grpc_port}", "--coordinator", coordinator,
                "--session-timeout-ms", "4000", "--replica", name,
                "--interserver-addr", f"{ip}:{free_port()}", "--macro", "shard=01"]
        if netns:
            args = ["ip", "netns", "exec", netns, *args]
        super().__init__(name, args, workdir)
        self.env = {"MERGESTREAM_LOG": "info"}

    def start(self):
        super().start()
        wait_until(lambda: port_open(self.grpc_port, self.ip), 60, "storage node")
        return self

    def run(self, sql):
        out = subprocess.run([str(STORAGE_BIN), "client", "--addr", f"{self.ip}:{self.grpc_port}", "--query", sql],
                             capture_output=True, text=True, timeout=60)
        return out.returncode, out.stdout, out.stderr

    def query(self, sql):
        code, stdout, stderr = self.run(sql)
        assert code == 0, stderr
        return stdout


@pytest.fixture
def namespace():
    if os.geteuid() != 0:
        pytest.fail("the network-partition test needs root (network namespaces and iptables)")
    ns = Namespace()
    yield ns
    ns.remove()


def count(node, table):
    return int(node.query(f"SELECT count() FROM {table}"))


def start_coordinator(tmp_path):
    """Our coordinator, listening on every address: r1 reaches it on the host's side of the
    veth pair, r2 from inside the namespace."""
    port = free_port()
    coordinator = Process("coordinator", [str(COORDINATOR_BIN), "serve", "--node-id", "1",
                                          "--client-addr", f"0.0.0.0:{port}", "--raft-addr", f"127.0.0.1:{free_port()}",
                                          "--data-dir", str(tmp_path / "coordinator")], tmp_path).start()
    wait_until(lambda: port_open(port), 30, "coordinator")
    return coordinator, port


@pytest.fixture
def pair(tmp_path, namespace):
    """The coordinator's port, r1 on the host and r2 in the namespace, both started."""
    coordinator, coordinator_port = start_coordinator(tmp_path)
    r1 = Node(tmp_path, "r1", namespace.host_ip, f"{namespace.host_ip}:{coordinator_port}")
    r2 = Node(tmp_path, "r2", namespace.ns_ip, f"{namespace.host_ip}:{coordinator_port}", netns=namespace.name)
    try:
        r1.start()
        r2.start()
        yield coordinator_port, r1, r2
    finally:
        r1.kill()
        r2.kill()
        coordinator.kill()


def create(table, *nodes):
    for node in nodes:
        node.query(f"CREATE TABLE {table} (k UInt64) ENGINE = ReplicatedMergeTree({PATH}) ORDER BY k")


def test_a_replica_cut_off_goes_read_only_and_both_sides_hold_every_block_once(pair, namespace):
    coordinator_port, r1, r2 = pair
    table = "cut"
    create(table, r1, r2)
    for i in range(5):
        (r1, r2)[i % 2].query(f"INSERT INTO {table} VALUES ({i})")
    # Both: a part only r2 has when the cut comes stays out of r1's reach until the heal.
    for node in (r1, r2):
        node.query(f"SYSTEM SYNC REPLICA {table}")
        assert count(node, table) == 5

    namespace.cut_off(except_port=r2.grpc_port)
    for i in range(5, 15):
        r1.query(f"INSERT INTO {table} VALUES ({i})")
    # Once its session has expired, r2 knows it is alone: read-only, reads still served.
    wait_until(lambda: "TABLE_IS_READ_ONLY" in r2.run(f"INSERT INTO {table} VALUES (100)")[2], 60,
               "r2 read-only")
    assert count(r2, table) == 5
    assert count(r1, table) == 15

    namespace.heal()
    wait_until(lambda: r2.run(f"INSERT INTO {table} VALUES (100)")[0] == 0, 60, "r2 takes inserts again")
    for i in range(101, 104):
        r2.query(f"INSERT INTO {table} VALUES ({i})")
    for node in (r1, r2):
        wait_until(lambda: node.run(f"SYSTEM SYNC REPLICA {table}")[0] == 0, 60, "synced")
    expected = sorted([*range(15), 100, 101, 102, 103])
    for node in (r1, r2):
        assert sorted(int(k) for k in node.query(f"SELECT k FROM {table}").split()) == expected


def test_replicas_cut_from_each_other_take_inserts_on_both_sides_and_converge(pair, namespace):
    """Only the replicas are cut from each other: both keep the coordinator, both take inserts,
    neither can fetch the other's parts until the partition heals."""
    coordinator_port, r1, r2 = pair
    table = "split"
    create(table, r1, r2)
    namespace.cut_off(except_port=r2.grpc_port, and_to=coordinator_port)
    for i in range(10):
        (r1, r2)[i % 2].query(f"INSERT INTO {table} VALUES ({i})")
    # Committed on the cluster, but each replica holds only its own parts.
    assert sorted(int(k) for k in r1.query(f"SELECT k FROM {table}").split()) == [0, 2, 4, 6, 8]
    assert sorted(int(k) for k in r2.query(f"SELECT k FROM {table}").split()) == [1, 3, 5, 7, 9]
    namespace.heal()
    for node in (r1, r2):
        wait_until(lambda: node.run(f"SYSTEM SYNC REPLICA {table}")[0] == 0, 60, "synced")
        assert sorted(int(k) for k in node.query(f"SELECT k FROM {table}").split()) == list(range(10))
