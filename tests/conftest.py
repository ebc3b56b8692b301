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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed cross-process test shows the tail of every process log it left in its
    directory: CI's output is all there is to debug a failure that happened only there."""
    outcome = yield
    report = outcome.get_result()
    tmp_path = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if report.when != "call" or not report.failed or tmp_path is None:
        return
    for log in sorted(Path(tmp_path).rglob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-60:]
        report.sections.append((f"tail of {log.relative_to(tmp_path)}", "\n".join(lines)))
