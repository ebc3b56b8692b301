import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BIN, Oracle  # noqa: E402


def pytest_sessionstart(session):
    if not BIN.exists():
        raise pytest.UsageError(f"{BIN} is missing: build it with `cargo build --bin storage-node`")


@pytest.fixture(scope="session")
def oracle():
    return Oracle()
