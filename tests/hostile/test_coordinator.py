"""The coordinator's ports under clients and peers that misbehave: connections that never
shake hands, clients that never read, forged and malformed Raft messages, and data
directories that are not a coordinator's. Where Apache ZooKeeper 3.8 has the same limit, both
are held to it side by side."""

import hashlib
import hmac
import os
import socket
import struct
import subprocess
import time

import pytest
from kazoo.client import KazooClient

from rawzk import RawClient, jstring
from services import CLUSTER_SECRET, COORDINATOR_BIN, CoordinatorNode, ZooKeeper, free_port, start_cluster, wait_until

HANDSHAKE_MS = 2000


def closed_after(port, limit=30.0):
    """Seconds until the server closes a connection on which nothing is sent."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
        try:
            while s.recv(1024):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
    return time.monotonic() - started


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture
def node(tmp_path):
    n = CoordinatorNode(1, tmp_path / "node1", extra_args=["--handshake-timeout-ms", str(HANDSHAKE_MS)]).start()
    yield n
    n.stop()


def test_a_connection_without_a_handshake_is_closed_as_zookeeper_closes_it(tmp_path, node):
    zk = ZooKeeper(tmp_path / "zk", jvm_flags=[f"-Dzookeeper.nio.sessionlessCnxnTimeout={HANDSHAKE_MS}"])
    try:
        ours, theirs = closed_after(node.client_port), closed_after(zk.port)
    finally:
        zk.stop()
    # Both close it after about the timeout (ZooKeeper's expiry runs in ticks of it).
    assert HANDSHAKE_MS / 1000 * 0.9 <= ours <= HANDSHAKE_MS / 1000 * 3, ours
    assert theirs <= HANDSHAKE_MS / 1000 * 3, theirs


def test_idle_connections_cannot_lock_clients_out(node):
    idle = [socket.create_connection(("127.0.0.1", node.client_port)) for _ in range(200)]
    try:
        time.sleep(HANDSHAKE_MS / 1000 * 2)
        closed = 0
        for s in idle:
            s.settimeout(5)
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == len(idle)
        client = KazooClient(hosts=node.hosts)
        client.start(timeout=10)
        client.stop()
    finally:
        for s in idle:
            s.close()


def test_a_client_that_never_reads_is_cut_off_before_it_costs_memory(node):
    writer = KazooClient(hosts=node.hosts)
    writer.start()
    writer.create("/big", b"x" * (1000 * 1024))
    writer.stop()
    before = rss_mib(node.proc.pid)
    raw = RawClient(node.client_port)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        for xid in range(1, 401):
            raw.send_frame(struct.pack(">ii", xid, 4) + jstring("/big") + b"\0")  # getData, no watch
    except OSError:
        pass  # the node closed the connection part way: what the test wants
    time.sleep(2)
    grown = rss_mib(node.proc.pid) - before
    assert grown < 150, f"the node grew by {grown:.0f} MiB for a client that does not read"
    raw.sock.settimeout(10)
    with pytest.raises((ConnectionError, OSError)):
        while True:  # what was sent before the cut, then the end
            if not raw.sock.recv(1 << 20):
                raise ConnectionError("closed")
    assert "does not read its replies" in (node.data_dir.parent / "node1.log").read_text(errors="replace")
    reader = KazooClient(hosts=node.hosts)
    reader.start()
    assert len(reader.get("/big")[0]) == 1000 * 1024
    reader.stop()


# --- the Raft port -----------------------------------------------------------------------

def bincode_close_session(session_id):
    """PeerRequest::Write(Command::CloseSession { session_id }) as bincode writes it."""
    return struct.pack("<II", 3, 1) + struct.pack("<q", session_id)


def nested_batch(depth, session_id):
    payload = struct.pack("<I", 3)
    payload += (struct.pack("<I", 3) + struct.pack("<Q", 1)) * depth
    return payload + struct.pack("<I", 1) + struct.pack("<q", session_id)


class Peer:
    """The caller's side of the peers' handshake (raft/transport.rs), in Python."""

    def __init__(self, port, secret: bytes, check_the_callee=True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        nc = os.urandom(32)
        self.sock.sendall(b"MSRAFT1\0" + nc)
        answer = self._exact(64)
        ns, proof = answer[:32], answer[32:]
        if check_the_callee:
            assert hmac.compare_digest(proof, hmac.new(secret, b"callee" + nc + ns, hashlib.sha256).digest())
        self.sock.sendall(hmac.new(secret, b"caller" + nc + ns, hashlib.sha256).digest())
        self.key = hmac.new(secret, b"caller->callee" + nc + ns, hashlib.sha256).digest()
        self.sent = 0

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def send(self, payload: bytes):
        tag = hmac.new(self.key, struct.pack(">Q", self.sent) + payload, hashlib.sha256).digest()
        self.sent += 1
        self.sock.sendall(struct.pack(">I", len(payload)) + payload + tag)

    def closed(self):
        self.sock.settimeout(10)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def send_raw_frame(port, payload):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack(">I", len(payload)) + payload)
        s.settimeout(10)
        try:
            return s.recv(1)
        except ConnectionResetError:
            return b""


def test_a_forged_peer_message_is_not_applied(node):
    client = KazooClient(hosts=node.hosts)
    client.start()
    client.create("/mine", b"", ephemeral=True)
    session_id = client.client_id[0]
    try:
        # A node without peers takes no peer connection at all.
        assert send_raw_frame(node.raft_port, bincode_close_session(session_id)) == b""
        time.sleep(1)
        assert client.exists("/mine") is not None
        assert "refusing a peer connection" in (node.data_dir.parent / "node1.log").read_text()
    finally:
        client.stop()


def test_cluster_peers_must_hold_the_secret_and_malformed_messages_are_dropped(tmp_path):
    nodes = start_cluster(tmp_path, 3, tick_ms=500)
    try:
        client = KazooClient(hosts=",".join(n.hosts for n in nodes))
        client.start()
        client.create("/mine", b"", ephemeral=True)
        session_id = client.client_id[0]
        for n in nodes:
            # The old, unauthenticated frame and a wrong secret are both refused.
            assert send_raw_frame(n.raft_port, bincode_close_session(session_id)) == b""
            with pytest.raises(AssertionError):
                Peer(n.raft_port, b"not the cluster's secret")
            impostor = Peer(n.raft_port, b"not the cluster's secret", check_the_callee=False)
            impostor.send(bincode_close_session(session_id))
            assert impostor.closed()
            # With the secret, a batch nested 200,000 deep is dropped, not decoded.
            peer = Peer(n.raft_port, CLUSTER_SECRET.strip().encode())
            peer.send(nested_batch(200_000, session_id))
            assert peer.closed()
            assert n.proc.poll() is None, f"node {n.node_id} died"
        time.sleep(1)
        assert client.exists("/mine") is not None
        client.create("/after", b"ok")
        assert client.get("/after")[0] == b"ok"
        logs = "".join((tmp_path / f"node{n.node_id}.log").read_text() for n in nodes)
        assert "does not hold this cluster's secret" in logs
        assert "dropping a peer message" in logs
        client.stop()
    finally:
        for n in nodes:
            n.stop()


def test_a_cluster_without_a_secret_does_not_start(tmp_path):
    out = subprocess.run([str(COORDINATOR_BIN), "serve", "--node-id", "1", "--client-addr", f"127.0.0.1:{free_port()}",
                          "--raft-addr", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"),
                          "--peer", "2=127.0.0.1:1"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "RUST_BACKTRACE": "0"})
    assert out.returncode != 0 and "--cluster-secret-file" in out.stderr, out.stderr


# --- the data directory ------------------------------------------------------------------

def serve_once(data_dir):
    node = CoordinatorNode(1, data_dir)
    try:
        node.start(wait=False)
        try:
            wait_until(lambda: node.proc.poll() is not None or node.mntr().get("zk_server_state"), 30, "coordinator")
        except TimeoutError:
            pass
        if node.proc.poll() is None:
            return None
        return (data_dir.parent / "node1.log").read_text()
    finally:
        node.stop()


def test_an_empty_data_directory_is_a_new_node(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert serve_once(empty) is None


def test_a_data_directory_holding_other_files_is_refused_by_name(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    log = serve_once(foreign)
    assert log is not None and str(foreign) in log and "notes.txt" in log and "File exists" not in log, log
    assert (foreign / "notes.txt").read_text() == "mine"
    in_the_way = tmp_path / "in_the_way"
    in_the_way.mkdir()
    (in_the_way / "log").write_text("a file")
    log = serve_once(in_the_way)
    assert log is not None and "is a file, where the coordinator keeps its Raft log directory" in log, log
