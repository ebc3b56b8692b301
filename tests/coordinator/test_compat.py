"""The same operation scripts against Apache ZooKeeper 3.8 and the coordinator, compared."""

import struct

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from compat import Recorder
from rawzk import RawClient, jstring
from services import four_letter


def both(zookeeper, coordinator, script, clients=1, auth=None):
    outcomes = []
    for server in (zookeeper, coordinator):
        rec = Recorder(server.hosts, clients, auth)
        try:
            script(rec)
            outcomes.append(rec.result())
        finally:
            rec.close()
    (zk_log, zk_events), (ours_log, our_events) = outcomes
    assert ours_log == zk_log
    assert our_events == zk_events
    return zk_log, zk_events


def test_create_modes_sequences_and_stats(zookeeper, coordinator, prefix):
    def script(r):
        zk = r.clients[0]
        r.call("create root", zk.create, prefix, b"root")
        r.call("exists root", zk.exists, prefix)
        for i in range(3):
            r.call(f"seq {i}", zk.create, f"{prefix}/s-", b"x" * i, sequence=True)
        r.call("ephemeral", zk.create, f"{prefix}/e", ephemeral=True)
        r.call("ephemeral seq", zk.create, f"{prefix}/es-", ephemeral=True, sequence=True)
        r.call("child of ephemeral", zk.create, f"{prefix}/e/c")
        r.call("duplicate", zk.create, f"{prefix}/e")
        r.call("no parent", zk.create, f"{prefix}/x/y")
        r.call("create2", zk.create, f"{prefix}/c2", b"abc", include_data=True)
        r.call("delete seq", zk.delete, f"{prefix}/s-0000000001")
        r.call("seq after delete", zk.create, f"{prefix}/s-", sequence=True)
        r.call("trailing slash seq", zk.create, f"{prefix}/", sequence=True)
        r.call("stat after", zk.exists, prefix)
        r.call("get_children", zk.get_children, prefix)
        r.call("get_children2", zk.get_children, prefix, include_data=True)
        r.call("root stat", zk.exists, "/zookeeper")
        r.call("bad path", zk.create, prefix + "/\u0001")
        r.call("delete root", zk.delete, "/")
        r.call("delete system", zk.delete, "/zookeeper")

    both(zookeeper, coordinator, script)


def test_versions_on_delete_and_set(zookeeper, coordinator, prefix):
    def script(r):
        zk = r.clients[0]
        r.call("create", zk.create, prefix, b"a")
        r.call("create child", zk.create, f"{prefix}/k", b"")
        r.call("set v0", zk.set, prefix, b"bb", version=0)
        r.call("set stale", zk.set, prefix, b"cc", version=0)
        r.call("set any", zk.set, prefix, b"ddd")
        r.call("get", zk.get, prefix)
        r.call("delete wrong version", zk.delete, prefix, version=7)
        r.call("delete not empty", zk.delete, prefix, version=2)
        r.call("delete child", zk.delete, f"{prefix}/k", version=0)
        r.call("delete missing", zk.delete, f"{prefix}/k")
        r.call("set missing", zk.set, f"{prefix}/k", b"")
        r.call("get missing", zk.get, f"{prefix}/k")
        r.call("exists missing", zk.exists, f"{prefix}/k")
        r.call("children missing", zk.get_children, f"{prefix}/k")
        r.call("acl", zk.get_acls, prefix)
        r.call("delete", zk.delete, prefix, version=2)

    both(zookeeper, coordinator, script)


def test_multi_all_or_nothing(zookeeper, coordinator, prefix):
    def script(r):
        zk = r.clients[0]
        r.call("create", zk.create, prefix, b"v")
        t = zk.transaction()
        t.create(f"{prefix}/a", b"1")
        t.set_data(prefix, b"w")
        t.check(prefix, 1)
        t.create(f"{prefix}/a/b")
        t.delete(f"{prefix}/a/b")
        r.call("multi ok", t.commit)
        t = zk.transaction()
        t.create(f"{prefix}/m1")
        t.check(prefix, 5)
        t.create(f"{prefix}/m2")
        t.delete(f"{prefix}/a")
        r.call("multi bad check", t.commit)
        t = zk.transaction()
        t.delete(f"{prefix}/a")
        t.create(f"{prefix}/a")
        t.create(f"{prefix}/a")
        r.call("multi duplicate", t.commit)
        r.call("children after", zk.get_children, prefix)
        r.call("stat after", zk.exists, prefix)
        r.call("empty multi", zk.transaction().commit)

    both(zookeeper, coordinator, script)


def test_pipelined_requests_are_answered_in_order_and_read_their_own_writes(zookeeper, coordinator, prefix):
    """Requests sent without waiting for answers: the coordinator commits the writes of such a
    run together, and every answer must still be what ZooKeeper, taking them one by one, gives."""
    def script(r):
        zk = r.clients[0]
        r.call("create root", zk.create, prefix)

        def pipelined():
            sent = []
            for i in range(40):
                node = f"{prefix}/n{i % 10}"
                sent.append(zk.create_async(node, str(i).encode()))
                sent.append(zk.get_async(node))
                sent.append(zk.set_async(node, b"v" * i, version=i % 3))
                sent.append(zk.exists_async(node))
                if i % 4 == 3:
                    sent.append(zk.delete_async(node))
                tx = zk.transaction()
                tx.create(f"{prefix}/t{i}")
                tx.check(node, 1)
                sent.append(tx.commit_async())
            out = []
            for a in sent:
                try:
                    out.append(a.get(timeout=20))
                except KazooException as e:
                    out.append(e)
            # ZooKeeper lists children in hash order; only the set is specified.
            out.append(sorted(zk.get_children(prefix)))
            return out

        r.call("pipelined", pipelined)

    both(zookeeper, coordinator, script)


def test_one_shot_watches(zookeeper, coordinator, prefix):
    def script(r):
        zk = r.clients[0]
        r.call("exists watch on missing", zk.exists, prefix, watch=r.watcher("exists"))
        r.call("create", zk.create, prefix, b"")
        r.call("get watch", zk.get, prefix, watch=r.watcher("data"))
        r.call("children watch", zk.get_children, prefix, watch=r.watcher("children"))
        r.call("set", zk.set, prefix, b"1")
        r.call("set again (no watch left)", zk.set, prefix, b"2")
        r.call("create child", zk.create, f"{prefix}/c")
        r.call("children watch 2", zk.get_children, prefix, watch=r.watcher("children2"))
        r.call("child data watch", zk.get, f"{prefix}/c", watch=r.watcher("child-data"))
        r.call("exists watch", zk.exists, f"{prefix}/c", watch=r.watcher("child-exists"))
        r.call("delete child", zk.delete, f"{prefix}/c")
        t = zk.transaction()
        t.create(f"{prefix}/t")
        t.set_data(prefix, b"3")
        r.call("get watch again", zk.get, prefix, watch=r.watcher("data2"))
        r.call("children watch 3", zk.get_children, prefix, watch=r.watcher("children3"))
        r.call("multi", t.commit)

    both(zookeeper, coordinator, script)


def test_ephemerals_go_when_their_session_closes(zookeeper, coordinator, prefix):
    def script(r):
        owner, observer = r.clients
        r.call("create", observer.create, prefix)
        r.call("ephemeral", owner.create, f"{prefix}/lock", b"me", ephemeral=True)
        r.call("ephemeral seq", owner.create, f"{prefix}/q-", ephemeral=True, sequence=True)
        r.call("watch", observer.exists, f"{prefix}/lock", watch=r.watcher("lock"))
        r.call("children watch", observer.get_children, prefix, watch=r.watcher("children"))
        r.call("observer sees owner", observer.exists, f"{prefix}/lock")
        r.close(0)
        r.settle()
        r.call("gone", observer.exists, f"{prefix}/lock")
        r.call("children", observer.get_children, prefix)

    both(zookeeper, coordinator, script, clients=2)


def _persistent_watch_events(server, prefix):
    raw = RawClient(server.port if hasattr(server, "port") else server.client_port)
    zk = KazooClient(hosts=server.hosts)
    zk.start(timeout=15)
    try:
        assert raw.add_watch(prefix, 0) == 0
        assert raw.add_watch(f"{prefix}/deep", 1) == 0
        zk.create(prefix)
        zk.set(prefix, b"1")
        zk.create(f"{prefix}/child")
        zk.create(f"{prefix}/deep")
        zk.create(f"{prefix}/deep/a")
        zk.set(f"{prefix}/deep/a", b"2")
        zk.create(f"{prefix}/deep/a/b")
        zk.delete(f"{prefix}/deep/a/b")
        zk.set(prefix, b"again")
        zk.delete(f"{prefix}/child")
        return raw.collect_events()
    finally:
        zk.stop()
        raw.close()


def test_persistent_and_recursive_watches(zookeeper, coordinator, prefix):
    expected = _persistent_watch_events(zookeeper, prefix)
    assert _persistent_watch_events(coordinator, prefix) == expected
    assert len(expected) > 5


def _oversized_and_malformed(port):
    observations = []
    healthy = RawClient(port)
    big = RawClient(port)
    body = jstring("/big") + struct.pack(">i", 2 * 1024 * 1024) + b"x" * (2 * 1024 * 1024)
    try:
        big.send_frame(struct.pack(">ii", 1, 1) + body)
        big.read_frame()
        observations.append("big answered")
    except (ConnectionError, OSError):
        observations.append("big closed")
    bad = RawClient(port)
    try:
        # A getData whose path length runs past the end of the frame.
        bad.send_frame(struct.pack(">ii", 1, 4) + struct.pack(">i", 1000) + b"/x")
        bad.read_frame()
        observations.append("malformed answered")
    except (ConnectionError, OSError):
        observations.append("malformed closed")
    err, _ = healthy.request(3, jstring("/") + b"\0")
    observations.append(("healthy exists", err))
    healthy.close()
    return observations


def test_oversized_and_malformed_frames_close_only_their_connection(zookeeper, coordinator):
    theirs = _oversized_and_malformed(zookeeper.port)
    ours = _oversized_and_malformed(coordinator.client_port)
    # ZooKeeper answers a truncated request with an error reply; the coordinator closes that
    # connection instead (a client that sends such a frame is broken). Everything else agrees.
    assert ours == ["big closed", "malformed closed", ("healthy exists", 0)]
    assert theirs[0] == ours[0] and theirs[2] == ours[2]


def test_four_letter_words(zookeeper, coordinator):
    for server_port in (zookeeper.port, coordinator.client_port):
        assert four_letter(server_port, "ruok") == "imok"
        srvr = four_letter(server_port, "srvr")
        assert "Zookeeper version: 3.8" in srvr and "Mode: standalone" in srvr
        assert "Clients:" in four_letter(server_port, "stat")
        mntr = dict(line.split("\t", 1) for line in four_letter(server_port, "mntr").splitlines() if "\t" in line)
        assert int(mntr["zk_znode_count"]) >= 4


@pytest.mark.parametrize("timeout", [1.0, 10.0, 100.0])
def test_session_timeout_negotiation(zookeeper, coordinator, timeout):
    negotiated = []
    for server in (zookeeper, coordinator):
        raw = RawClient(server.port if server is zookeeper else server.client_port, int(timeout * 1000))
        negotiated.append(raw.timeout_ms)
        raw.close()
    assert negotiated[0] == negotiated[1]
