import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "coordinator"))

from services import ZooKeeper, leader_of, start_cluster  # noqa: E402

from replicas import Replica  # noqa: E402


class CoordinatorCluster:
    """Three `coordinator serve` nodes: the replicas get all three hosts, as ZooKeeper clients do."""

    def __init__(self, base):
        self.nodes = start_cluster(base, size=3)
        leader_of(self.nodes)

    @property
    def hosts(self):
        return ",".join(n.hosts for n in self.nodes)

    def stop(self):
        for node in self.nodes:
            node.stop()


@pytest.fixture(scope="session")
def our_coordinator(tmp_path_factory):
    cluster = CoordinatorCluster(tmp_path_factory.mktemp("coordinator"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def apache_zookeeper(tmp_path_factory):
    zk = ZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    yield zk
    zk.stop()


@pytest.fixture(params=["coordinator", "zookeeper"])
def keeper_hosts(request):
    """The replicated tables' Keeper: our coordinator as a three-node cluster, and Apache ZooKeeper 3.8
    as ClickHouse allows."""
    server = request.getfixturevalue("our_coordinator" if request.param == "coordinator" else "apache_zookeeper")
    return server.hosts


@pytest.fixture
def kazoo(keeper_hosts):
    client = KazooClient(hosts=keeper_hosts)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def replicas(tmp_path, keeper_hosts):
    """Two storage nodes, r1 and r2, as replicas over the Keeper; no table yet."""
    started = [Replica(tmp_path, keeper_hosts, name).start() for name in ("r1", "r2")]
    yield started
    for replica in started:
        replica.stop()
