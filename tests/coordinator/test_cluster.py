"""Three coordinator nodes on loopback: failover under a write stream, restarts from disk,
log compaction, a minority that must not accept writes, and sessions that outlive their node."""

import os
import signal
import struct
import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NotReadOnlyCallError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KeeperState

from rawzk import RawClient, jstring
from services import CoordinatorNode, four_letter, leader_of, start_cluster, wait_until

# Short ticks keep session timeouts (two to twenty ticks) and the tests short.
TICK_MS = 500


@pytest.fixture
def cluster(tmp_path):
    nodes = start_cluster(tmp_path, 3, tick_ms=TICK_MS)
    yield nodes
    for n in nodes:
        if n.proc is not None:
            try:
                os.kill(n.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        n.stop()


def connect(hosts, timeout=3.0, **kwargs):
    zk = KazooClient(hosts=hosts, timeout=timeout, **kwargs)
    zk.start(timeout=30)
    return zk


def all_hosts(nodes):
    return ",".join(n.hosts for n in nodes)


def dump(zk, path="/"):
    """Every znode under `path` with its data and full stat, zxids included: replicas that
    applied the same log hold byte-identical trees."""
    out = {}
    zk.sync(path)
    stack = [path]
    while stack:
        p = stack.pop()
        data, stat = zk.get(p)
        out[p] = (data, stat)
        for child in zk.get_children(p):
            stack.append(("" if p == "/" else p) + "/" + child)
    return out


def dump_of(node):
    zk = connect(node.hosts)
    try:
        return dump(zk)
    finally:
        zk.stop()
        zk.close()


def assert_replicas_equal(nodes):
    dumps = [dump_of(n) for n in nodes]
    for n, d in zip(nodes[1:], dumps[1:]):
        assert d == dumps[0], f"node {n.node_id} differs from node {nodes[0].node_id}"
    return dumps[0]


class WriteStream:
    """Creates sequential znodes whose data is a unique counter, as fast as the cluster takes
    them, and remembers which counters were acknowledged. Nothing is retried: a write whose
    outcome is unknown stays unknown, and may appear at most once."""

    def __init__(self, hosts, parent):
        self.zk = connect(hosts, timeout=4.0)
        self.parent = parent
        self.zk.ensure_path(parent)
        self.acked = []
        self.unknown = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        i = 0
        while not self.stop.is_set():
            try:
                self.zk.create(f"{self.parent}/n-", str(i).encode(), sequence=True)
                self.acked.append(i)
            except (KazooException, KazooTimeoutError):
                self.unknown.append(i)
                time.sleep(0.05)
            i += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        self.zk.stop()
        self.zk.close()


def counters_under(tree, parent):
    values = [int(data) for path, (data, _) in tree.items() if path.startswith(parent + "/")]
    return values


def test_leader_sigkill_during_writes_loses_nothing_acknowledged(cluster):
    leader = leader_of(cluster)
    with WriteStream(all_hosts(cluster), "/stream") as stream:
        wait_until(lambda: len(stream.acked) >= 200, 60, "writes before the kill")
        leader.kill()
        acked_at_kill = len(stream.acked)
        wait_until(lambda: len(stream.acked) >= acked_at_kill + 200, 60, "writes after failover")
    survivors = [n for n in cluster if n is not leader]
    assert leader_of(survivors) is not leader
    leader.start()
    tree = assert_replicas_equal(cluster)
    values = counters_under(tree, "/stream")
    assert len(values) == len(set(values)), "a write was applied twice"
    assert set(stream.acked) <= set(values), "an acknowledged write was lost"
    assert set(values) <= set(stream.acked) | set(stream.unknown), "a write nobody made appeared"


def test_restart_of_every_node_recovers_the_exact_tree(tmp_path):
    nodes = start_cluster(tmp_path, 3, tick_ms=TICK_MS, snapshot_every=50)
    try:
        zk = connect(all_hosts(nodes))
        zk.create("/app", b"config")
        for i in range(120):
            zk.create(f"/app/item-{i:03}", str(i).encode())
        for i in range(0, 120, 3):
            zk.set(f"/app/item-{i:03}", b"changed")
        for i in range(0, 120, 5):
            zk.delete(f"/app/item-{i:03}")
        for _ in range(7):
            zk.create("/app/log-", b"entry", sequence=True)
        zk.stop()
        zk.close()
        before = assert_replicas_equal(nodes)

        for n in nodes:
            n.kill()
        # Compaction ran: every node has a snapshot and a log shorter than the writes made.
        for n in nodes:
            assert (n.data_dir / "snapshot").exists(), f"node {n.node_id} wrote no snapshot"
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_ready()
        leader_of(nodes)
        assert assert_replicas_equal(nodes) == before

        # The restarted cluster still writes, and sequence numbers continue.
        zk = connect(all_hosts(nodes))
        assert zk.create("/app/log-", b"entry", sequence=True) == "/app/log-0000000127"  # 120 items and 7 entries before
        zk.stop()
        zk.close()
    finally:
        for n in nodes:
            n.stop()


def test_one_node_restarted_catches_up_from_a_snapshot(tmp_path):
    nodes = start_cluster(tmp_path, 3, tick_ms=TICK_MS, snapshot_every=20)
    try:
        leader = leader_of(nodes)
        lagging = next(n for n in nodes if n is not leader)
        lagging.kill()
        zk = connect(leader.hosts)
        zk.create("/while-down", b"")
        for i in range(100):
            zk.create(f"/while-down/k{i}", str(i).encode())
        zk.stop()
        zk.close()
        # The leader compacted past what the stopped node has, so it must install a snapshot.
        lagging.start()
        assert assert_replicas_equal(nodes)["/while-down"][1].numChildren == 100
    finally:
        for n in nodes:
            n.stop()


def test_partitioned_minority_accepts_no_writes(cluster):
    leader = leader_of(cluster)
    zk = connect(leader.hosts, timeout=30.0)
    zk.create("/before", b"")
    # Freezing the two other processes cuts the leader off from its quorum, as a partition
    # would, while their sockets stay open.
    majority = [n for n in cluster if n is not leader]
    for n in majority:
        os.kill(n.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises((KazooException, KazooTimeoutError)):
            zk.create("/during-partition", b"")
        # Nor can a new client get a session there: opening one is a write too.
        with pytest.raises(KazooTimeoutError):
            connect(leader.hosts, timeout=30.0, connection_retry={"max_tries": 0}).stop()
    finally:
        for n in majority:
            os.kill(n.proc.pid, signal.SIGCONT)
    zk.stop()
    zk.close()
    leader_of(cluster)
    zk = connect(all_hosts(cluster), timeout=10.0)
    zk.create("/after", b"")
    zk.stop()
    zk.close()
    tree = assert_replicas_equal(cluster)
    assert "/before" in tree and "/after" in tree


def test_session_and_ephemerals_survive_the_death_of_their_node(cluster):
    leader = leader_of(cluster)
    others = [n for n in cluster if n is not leader]
    # Connected to the leader first, with the others to fail over to.
    zk = connect(",".join([leader.hosts] + [n.hosts for n in others]), timeout=6.0, randomize_hosts=False)
    session_before = zk.client_id[0]
    zk.create("/lock", b"", ephemeral=True)
    leader.kill()
    def reconnected():
        try:
            return zk.exists("/lock") is not None
        except KazooException:
            return False

    wait_until(reconnected, 30, "reconnect with the session")
    assert zk.client_id[0] == session_before
    assert zk.exists("/lock").ephemeralOwner == session_before

    # The session stays alive on the new leader's clock for longer than its timeout.
    time.sleep(8)
    assert zk.exists("/lock") is not None
    zk.stop()
    zk.close()
    observer = connect(others[0].hosts)
    assert observer.exists("/lock") is None
    observer.stop()
    observer.close()


def test_expired_session_ephemerals_vanish_on_every_node(cluster):
    follower = next(n for n in cluster if n is not leader_of(cluster))
    # A session opened on a follower, whose client then vanishes without closing it: only the
    # leader's clock can end it, and the removal must reach every replica.
    raw = RawClient(follower.client_port, timeout_ms=2000)
    err, _ = raw.request(1, jstring("/worker") + struct.pack(">i", 0) + struct.pack(">i", 1)
                         + struct.pack(">i", 31) + jstring("world") + jstring("anyone") + struct.pack(">i", 1))
    assert err == 0
    probe = connect(all_hosts(cluster))
    assert probe.exists("/worker").ephemeralOwner == raw.session_id
    raw.sock.close()
    wait_until(lambda: probe.exists("/worker") is None, 20, "expiry of the session")
    probe.stop()
    probe.close()
    for n in cluster:
        zk = connect(n.hosts)
        zk.sync("/")
        assert zk.exists("/worker") is None, f"ephemeral of 0x{raw.session_id:x} still on node {n.node_id}"
        zk.stop()
        zk.close()


def test_single_node_sigkilled_mid_stream_keeps_every_acknowledged_write(tmp_path):
    """Acknowledged means fsynced: with many writes sharing each log append, a kill between
    the append and its sync must lose only writes nobody was told about."""
    node = CoordinatorNode(1, tmp_path / "node1", tick_ms=TICK_MS)
    node.start()
    try:
        with WriteStream(node.hosts, "/solo") as stream:
            wait_until(lambda: len(stream.acked) >= 300, 60, "writes before the kill")
            node.kill()
            node.start()
            acked_at_kill = len(stream.acked)
            wait_until(lambda: len(stream.acked) >= acked_at_kill + 100, 60, "writes after the restart")
        tree = dump_of(node)
        values = counters_under(tree, "/solo")
        assert len(values) == len(set(values)), "a write was applied twice"
        assert set(stream.acked) <= set(values), "an acknowledged write was lost"
    finally:
        node.stop()


def test_watches_follow_their_session_to_another_node(cluster):
    """The Java client's reconnect: resume the session on another node with its id and
    password, then setWatches (kazoo drops its watches on a disconnect instead)."""
    leader = leader_of(cluster)
    follower, other = [n for n in cluster if n is not leader]
    setup = connect(leader.hosts)
    setup.create("/watched", b"v0")
    raw = RawClient(follower.client_port, timeout_ms=6000)
    err, _ = raw.request(4, jstring("/watched") + b"\x01")  # getData with a watch
    assert err == 0
    follower.kill()

    moved = RawClient(other.client_port, timeout_ms=6000, session=(raw.session_id, raw.password),
                      last_zxid=raw.last_zxid)
    assert moved.session_id == raw.session_id
    strings = lambda *paths: struct.pack(">i", len(paths)) + b"".join(jstring(p) for p in paths)
    err, _ = moved.request(101, struct.pack(">q", 0) + strings("/watched") + strings() + strings("/"))
    assert err == 0
    setup.set("/watched", b"v1")
    setup.create("/new-child")
    assert sorted(moved.collect_events(wait=2.0)) == [(3, "/watched"), (4, "/")]  # changed, children
    moved.close()
    setup.stop()
    setup.close()


def test_five_nodes_keep_writing_with_two_down(tmp_path):
    nodes = start_cluster(tmp_path, 5, tick_ms=TICK_MS)
    try:
        leader = leader_of(nodes)
        follower = next(n for n in nodes if n is not leader)
        with WriteStream(all_hosts(nodes), "/five") as stream:
            wait_until(lambda: len(stream.acked) >= 100, 60, "writes before the kills")
            leader.kill()
            follower.kill()
            acked = len(stream.acked)
            wait_until(lambda: len(stream.acked) >= acked + 100, 60, "writes with two of five down")
        survivors = [n for n in nodes if n.proc is not None]
        assert leader_of(survivors) not in (leader, follower)
        leader.start(wait=False)
        follower.start(wait=False)
        leader.wait_ready()
        follower.wait_ready()
        tree = assert_replicas_equal(nodes)
        values = counters_under(tree, "/five")
        assert len(values) == len(set(values)) and set(stream.acked) <= set(values)
    finally:
        for n in nodes:
            n.stop()


def test_cut_off_from_its_quorum_a_node_serves_read_only_sessions(cluster):
    """ZooKeeper's read-only mode: a client that accepts a read-only server (kazoo's
    read_only=True, canBeReadOnly on the wire) gets a session on a node that cannot reach a
    quorum, reads what the node last applied, and has every write refused with NOTREADONLY;
    once the quorum is back the session ends and the client moves to a read-write one. A
    client that did not ask for read-only gets nothing there, as before."""
    leader = leader_of(cluster)
    zk = connect(all_hosts(cluster), timeout=30.0)
    zk.create("/kept", b"before the outage")
    zk.sync("/kept")
    zk.stop()
    zk.close()
    for n in cluster:
        if n is not leader:
            os.kill(n.proc.pid, signal.SIGSTOP)
    states = []
    client = KazooClient(hosts=leader.hosts, read_only=True, timeout=5)
    client.add_listener(lambda state: states.append((state, client.client_state)))
    try:
        wait_until(lambda: four_letter(leader.client_port, "isro") == "ro", 10, "the leader sees itself cut off")
        client.start(timeout=20)
        assert client.client_state == KeeperState.CONNECTED_RO
        assert client.get("/kept")[0] == b"before the outage"
        for write in (lambda: client.create("/during", b""), lambda: client.set("/kept", b"x"),
                      lambda: client.delete("/kept")):
            with pytest.raises(NotReadOnlyCallError):
                write()
        with pytest.raises(KazooTimeoutError):
            connect(leader.hosts, timeout=5.0, connection_retry={"max_tries": 0}).stop()
    finally:
        for n in cluster:
            os.kill(n.proc.pid, signal.SIGCONT)
    wait_until(lambda: client.client_state == KeeperState.CONNECTED, 30, "a read-write session after the outage")
    client.create("/after", b"")
    assert four_letter(leader.client_port, "isro") == "rw"
    client.stop()
    client.close()
    tree = assert_replicas_equal(cluster)
    assert "/after" in tree and "/during" not in tree
