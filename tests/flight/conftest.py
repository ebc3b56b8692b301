import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ingestor"))
sys.path.insert(0, str(HERE.parent / "coordinator"))
sys.path.insert(0, str(HERE.parent))

from ingest_services import StorageNode, free_port, port_open, wait_until  # noqa: E402
from ingest_services import kill_leftovers  # noqa: E402,F401  (autouse, for every test here)


@pytest.fixture
def node(tmp_path):
    """A storage node serving Flight SQL on `node.flight_uri`."""
    port = free_port()
    node = StorageNode(tmp_path, None, extra_args=["--flight-addr", f"127.0.0.1:{port}"]).start()
    wait_until(lambda: port_open(port), 30, "the Flight SQL port")
    node.flight_uri = f"grpc://127.0.0.1:{port}"
    yield node
    node.kill()
