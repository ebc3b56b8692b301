"""Clients other than kazoo: ZooKeeper's own Java shell (zkCli.sh) against both servers, and a
Prometheus scrape of the coordinator's metrics."""

import re
import subprocess
import urllib.request

from kazoo.client import KazooClient

from services import CoordinatorNode, free_port, wait_until

ZKCLI = "/usr/share/zookeeper/bin/zkCli.sh"


def zkcli(hosts, commands):
    """Runs commands through zkCli.sh; returns its answers with zxids and times masked."""
    out = subprocess.run([ZKCLI, "-server", hosts], input="\n".join(commands + ["quit"]) + "\n",
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120).stdout
    lines = []
    for line in out.splitlines():
        if line.startswith(("SLF4J", "Connecting to", "Welcome", "JLine")) or not line.strip():
            continue
        line = re.sub(r"^(cZxid|mZxid|pZxid|ctime|mtime) = .*", r"\1 = *", line)
        line = re.sub(r"^ephemeralOwner = 0x[0-9a-f]+$", lambda m: "ephemeralOwner = " + (
            "0x0" if m.group(0).endswith("0x0") else "<session>"), line)
        lines.append(line)
    return lines


def test_zkcli_sees_the_same_answers(zookeeper, coordinator, prefix):
    script = [
        f"create {prefix} hello",
        f"create -s {prefix}/s- one",
        f"create -s {prefix}/s- two",
        f"create -e {prefix}/e eph",
        f"create {prefix}/e/child x",
        f"create {prefix}/missing/child x",
        f"ls {prefix}",
        f"get {prefix}",
        f"set {prefix} changed",
        f"get -s {prefix}",
        f"stat {prefix}/e",
        f"set -v 7 {prefix} stale",
        f"delete {prefix}",
        f"delete {prefix}/s-0000000000",
        f"deleteall {prefix}",
        f"stat {prefix}",
        "create bad-path x",
    ]
    theirs = zkcli(zookeeper.hosts, script)
    ours = zkcli(coordinator.hosts, script)
    assert ours == theirs
    assert any("Node not empty" in line for line in theirs)


def test_prometheus_metrics_cover_requests_tree_sessions_and_raft(tmp_path):
    node = CoordinatorNode(1, tmp_path / "node1", metrics_port=free_port()).start()
    try:
        zk = KazooClient(hosts=node.hosts)
        zk.start(15)
        zk.create("/m", b"x")
        zk.get("/m", watch=lambda e: None)
        zk.create("/m/e", ephemeral=True)

        def scrape():
            with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as r:
                return r.read().decode()

        def values():
            out = {}
            for line in scrape().splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    out[name] = float(value)
            return out

        # Gauges are published every second.
        wait_until(lambda: values().get("mergestream_coordinator_znodes", 0) >= 6, 10, "gauges")
        v = values()
        assert v['mergestream_coordinator_requests_total{op="create"}'] >= 2
        assert v['mergestream_coordinator_requests_total{op="getData"}'] >= 1
        assert any(k.startswith("mergestream_coordinator_request_duration_seconds") for k in v)
        assert v["mergestream_coordinator_sessions"] == 1
        assert v["mergestream_coordinator_ephemerals"] == 1
        assert v["mergestream_coordinator_watches"] >= 1
        assert v["mergestream_coordinator_raft_term"] >= 1
        assert v["mergestream_coordinator_raft_is_leader"] == 1
        assert v["mergestream_coordinator_raft_applied_index"] >= 3
        assert v["mergestream_coordinator_raft_committed_index"] >= v["mergestream_coordinator_raft_applied_index"] - 1
        zk.stop()
        zk.close()
    finally:
        node.stop()
