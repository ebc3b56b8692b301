import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from services import COORDINATOR_BIN, CoordinatorNode, ZooKeeper  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if not COORDINATOR_BIN.exists():
        raise pytest.UsageError(f"{COORDINATOR_BIN} is missing: build it with `cargo build --bin coordinator`")


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    zk = ZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    yield zk
    zk.stop()


@pytest.fixture(scope="session")
def coordinator(tmp_path_factory):
    node = CoordinatorNode(1, tmp_path_factory.mktemp("coordinator") / "node1").start()
    yield node
    node.stop()


_prefixes = itertools.count()


@pytest.fixture
def prefix(request):
    """A fresh top-level path per test, the same on both servers."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    return f"/{name}_{next(_prefixes)}"
