"""Dynamic reconfiguration (`reconfig`, as ZooKeeper 3.5+ offers it) on a coordinator cluster:
a fourth node, started with the others as its peers, joins as a participant and takes part in
writes; a member leaves; observers join and leave without voting; only the superuser may
reconfigure, a stale config version is refused, and `/zookeeper/config` lists the ensemble as
ZooKeeper lists it. kazoo's own reconfig tests run against the coordinator in kazoo_upstream/."""

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadArgumentsError, BadVersionError, NoAuthError

from services import CoordinatorNode, free_port, leader_of, start_cluster, wait_until

# super:test, the digest kazoo's own harness gives ZooKeeper.
SUPER = ["--super-digest", "super:D/InIHSb7yEEbrWz8b9l71RjZJU="]


def members(data):
    lines = data.decode().split("\n")
    assert lines[-1].startswith("version="), lines
    return {line.split("=", 1)[0]: line.split("=", 1)[1] for line in lines[:-1]}


@pytest.fixture
def cluster(tmp_path):
    nodes = start_cluster(tmp_path, 3, extra_args=SUPER)
    leader_of(nodes)
    yield nodes
    for n in nodes:
        n.stop()


def client(hosts, super_user=True):
    c = KazooClient(hosts=hosts, timeout=10, auth_data=[("digest", "super:test")] if super_user else None)
    c.start(timeout=30)
    return c


def test_a_participant_joins_and_a_member_leaves(tmp_path, cluster):
    newcomer = CoordinatorNode(4, tmp_path / "node4", extra_args=SUPER)
    newcomer.peers = {n.node_id: n.raft_addr for n in cluster}
    for n in cluster:
        n.peers[4] = newcomer.raft_addr
    newcomer.start()
    admin = client(",".join(n.hosts for n in cluster))
    try:
        joining = f"server.4=127.0.0.1:{newcomer.raft_port}:{newcomer.raft_port}:participant;127.0.0.1:{newcomer.client_port}"
        data, stat = admin.reconfig(joining=joining, leaving=None, new_members=None)
        listed = members(data)
        assert listed["server.4"] == joining.split("=", 1)[1]
        assert {"server.1", "server.2", "server.3", "server.4"} == set(listed)
        assert int(data.decode().split("\n")[-1].split("=")[1], 16) == stat.mzxid
        wait_until(lambda: newcomer.mntr().get("raft_leader") not in (None, "none"), 30, "the newcomer follows")
        # The newcomer serves clients and commits with the others.
        on_newcomer = client(newcomer.hosts, super_user=False)
        on_newcomer.create("/from-the-newcomer", b"4")
        on_newcomer.stop()
        assert admin.get("/from-the-newcomer")[0] == b"4"
        assert admin.get("/zookeeper/config")[0] == data

        data, _ = admin.reconfig(joining=None, leaving="1", new_members=None)
        assert set(members(data)) == {"server.2", "server.3", "server.4"}
        rest = [n for n in cluster if n.node_id != 1] + [newcomer]
        leader_of(rest)
        after = client(",".join(n.hosts for n in rest), super_user=False)
        after.create("/after-the-leave", b"")
        wait_until(lambda: newcomer.mntr().get("zk_znode_count") == rest[0].mntr().get("zk_znode_count"), 20,
                   "the members agree")
        after.stop()
    finally:
        admin.stop()
        newcomer.stop()


def test_observers_join_and_leave_and_only_the_superuser_reconfigures(cluster):
    hosts = ",".join(n.hosts for n in cluster)
    stranger = client(hosts, super_user=False)
    admin = client(hosts)
    try:
        with pytest.raises(NoAuthError):
            stranger.reconfig(joining="server.9=127.0.0.1:1:2:observer;3", leaving=None, new_members=None)
        with pytest.raises(BadArgumentsError):
            admin.reconfig(joining="some thing", leaving=None, new_members=None)
        # An observer follows the log and does not vote: one that is not running does not
        # stop the ensemble from committing.
        observer = f"server.100=127.0.0.1:{free_port()}:{free_port()}:observer;127.0.0.1:{free_port()}"
        data, _ = admin.reconfig(joining=observer, leaving=None, new_members=None)
        assert observer.encode() in data
        stranger.create("/with-an-observer", b"")
        data, _ = admin.reconfig(joining=None, leaving="100", new_members=None)
        assert observer.encode() not in data
        version = int(data.decode().split("\n")[-1].split("=")[1], 16)
        with pytest.raises(BadVersionError):
            admin.reconfig(joining=observer, leaving=None, new_members=None, from_config=version + 1)
        # Anyone reads the configuration; nobody but the superuser writes it.
        assert stranger.get("/zookeeper/config")[0] == data
        with pytest.raises(NoAuthError):
            stranger.set("/zookeeper/config", b"server.1=evil:1:1")
    finally:
        stranger.stop()
        admin.stop()
