"""scripts/quickstart, run as a user runs it (with the debug binaries instead of a release
build): the whole stack up, the sample orders through Kafka into the table, the printed FINAL
result equal to what the generator says it sent; and nothing it started left running, whether
it ends by itself, by Ctrl-C, by SIGKILL, or by --stop after --keep."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "quickstart"
ENV = {**os.environ, "MERGESTREAM_BIN_DIR": str(ROOT / "target" / "debug")}


def quickstart(tmp_path, *args, timeout=300):
    return subprocess.run([str(SCRIPT), "--free-ports", "--dir", str(tmp_path / "qs"), *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def started_pids(output):
    return {name: int(pid) for name, pid in re.findall(r"started (\S+)\s+pid (\d+)", output)}


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_all_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.1)
    return {name: pid for name, pid in pids.items() if alive(pid)}


def table_cells(output, query):
    """The data row of a PrettyCompact table printed after the line holding `query`."""
    after = output.split(query, 1)[1]
    row = next(line for line in after.splitlines() if re.match(r"\s*1\. ", line))
    return [cell.strip() for cell in row.split("│")[1:-1]]


def test_the_quickstart_shows_the_final_state_the_generator_produced_and_stops_everything(tmp_path):
    out = quickstart(tmp_path, "--count", "2500", "--keys", "250", "--rate", "0", "--seed", "7")
    assert out.returncode == 0, out.stdout + out.stderr
    pids = started_pids(out.stdout)
    assert set(pids) == {"kafka", "coordinator", "storage-node", "producer", "ingestor"}, out.stdout
    expected = re.search(r"the generator sent (\d+) messages about (\d+) orders, (\d+) of them deleted at the end: "
                         r"it expects (\d+) orders worth ([\d.]+)", out.stdout)
    assert expected, out.stdout
    messages, orders, deleted, live, amount = expected.groups()
    assert (messages, orders) == ("2500", "250")
    assert int(deleted) > 0 and int(live) == 250 - int(deleted)
    # The table the user sees, read here apart from the script's own comparison.
    assert table_cells(out.stdout, "FROM orders FINAL   --") == [live, amount]
    assert "FINAL matches" in out.stdout
    statuses = out.stdout.split("GROUP BY status ORDER BY status", 1)[1].split("SELECT id", 1)[0]
    assert sum(int(m) for m in re.findall(r"│ \w+\s+│\s+(\d+) │", statuses)) == int(live)
    assert not wait_all_gone(pids, timeout=5), "every process is stopped when the quickstart ends"


def start_streaming(tmp_path):
    """A quickstart that would produce for a long while, its output merged into one pipe."""
    return subprocess.Popen([str(SCRIPT), "--free-ports", "--dir", str(tmp_path / "qs"), "--count", "1000000",
                             "--rate", "500"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)


def read_until(proc, done):
    """The output up to and including the first line for which `done` holds."""
    seen = ""
    for line in proc.stdout:
        seen += line
        if done(line):
            break
    return seen


def test_ctrl_c_stops_every_process_it_started(tmp_path):
    proc = start_streaming(tmp_path)
    try:
        seen = read_until(proc, lambda line: "produced" in line and "ingested" in line)
        pids = started_pids(seen)
        assert "ingestor" in pids, seen
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, seen + rest
    assert "interrupted" in rest
    assert not wait_all_gone(pids, timeout=5), seen + rest


def test_a_killed_quickstart_leaves_nothing_running(tmp_path):
    proc = start_streaming(tmp_path)
    try:
        seen = read_until(proc, lambda line: "started ingestor" in line)
        pids = started_pids(seen)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert len(pids) == 5, seen
    assert not wait_all_gone(pids), "the kernel stops the children of a quickstart that was SIGKILLed"


def test_keep_leaves_the_stack_up_until_stop(tmp_path):
    out = quickstart(tmp_path, "--count", "300", "--keys", "50", "--rate", "0", "--keep")
    assert out.returncode == 0, out.stdout + out.stderr
    pids = started_pids(out.stdout)
    del pids["producer"]
    try:
        assert all(alive(p) for p in pids.values()), "--keep leaves the services up"
        port = re.search(r"storage node\s+127\.0\.0\.1:(\d+)", out.stdout).group(1)
        count = subprocess.run([str(ROOT / "target" / "debug" / "storage-node"), "client", "--addr",
                                f"127.0.0.1:{port}", "--query", "SELECT count() FROM orders FINAL"],
                               capture_output=True, text=True, timeout=60)
        live = re.search(r"it expects (\d+) orders", out.stdout).group(1)
        assert count.stdout.strip() == live, count.stderr
        again = quickstart(tmp_path, "--count", "10")
        assert again.returncode == 1 and "stop it first with scripts/quickstart --stop" in again.stderr, again.stderr
        stop = quickstart(tmp_path, "--stop")
        assert stop.returncode == 0, stop.stderr
        assert not wait_all_gone(pids, timeout=5)
        assert "stopped ingestor" in stop.stdout
    finally:
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_directory_it_did_not_make_is_refused(tmp_path):
    mine = tmp_path / "qs"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    out = quickstart(tmp_path, "--count", "10")
    assert out.returncode == 1
    assert f"{mine} is not empty and was not made by the quickstart" in out.stderr, out.stderr
    assert (mine / "notes.txt").read_text() == "mine"
