import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "ingestor"))
sys.path.insert(0, str(HERE.parent / "coordinator"))

from ingest_services import CoordinatorNode, StorageNode  # noqa: E402
from ingest_services import kill_leftovers  # noqa: E402,F401  (autouse, for every test here)


@pytest.fixture
def keeper(tmp_path):
    node = CoordinatorNode(1, tmp_path / "keeper" / "node1", tick_ms=500).start()
    yield node
    node.stop()


@pytest.fixture
def storage(tmp_path, keeper):
    node = StorageNode(tmp_path, keeper.hosts).start()
    yield node
    node.kill()
