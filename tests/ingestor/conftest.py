import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest_services import INGESTOR_BIN, CoordinatorNode, NatsServer, StorageNode, Tansu  # noqa: E402
from ingest_services import kill_leftovers  # noqa: E402,F401  (autouse, for every test here)


def pytest_collection_modifyitems(config, items):
    if not INGESTOR_BIN.exists():
        raise pytest.UsageError(f"{INGESTOR_BIN} is missing: build it with `cargo build --bin ingestor`")


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    tansu = Tansu(tmp_path_factory.mktemp("tansu"))
    yield tansu
    tansu.kill()


@pytest.fixture(scope="session")
def keeper(tmp_path_factory):
    # A short tick so that sessions (and the partitions of a dead ingestor) expire in seconds.
    node = CoordinatorNode(1, tmp_path_factory.mktemp("keeper") / "node1", tick_ms=500).start()
    yield node
    node.stop()


@pytest.fixture
def storage(tmp_path, keeper):
    node = StorageNode(tmp_path, keeper.hosts).start()
    yield node
    node.kill()


_topics = itertools.count()


@pytest.fixture
def topic(request):
    """A fresh topic name per test (the broker is shared)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"{name}-{next(_topics)}"


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory):
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    yield server
    server.kill()
