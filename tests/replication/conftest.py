import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "coordinator"))

from services import CoordinatorNode, ZooKeeper  # noqa: E402


@pytest.fixture(scope="session")
def our_coordinator(tmp_path_factory):
    node = CoordinatorNode(1, tmp_path_factory.mktemp("coordinator") / "node1").start()
    yield node
    node.stop()


@pytest.fixture(scope="session")
def apache_zookeeper(tmp_path_factory):
    zk = ZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    yield zk
    zk.stop()


@pytest.fixture(params=["coordinator", "zookeeper"])
def keeper_hosts(request):
    """The replicated tables' Keeper: our coordinator, and Apache ZooKeeper 3.8 as ClickHouse allows."""
    server = request.getfixturevalue("our_coordinator" if request.param == "coordinator" else "apache_zookeeper")
    return server.hosts


@pytest.fixture
def kazoo(keeper_hosts):
    client = KazooClient(hosts=keeper_hosts)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()
