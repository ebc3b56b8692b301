"""Progress where work is long: `storage-node local` and `storage-node client` draw a progress
line on standard error when it is a terminal (a pseudo-terminal here) and nothing otherwise;
`ingestor run` prints a status line per pipeline on a terminal and logs a structured status
event otherwise."""

import os
import pty
import re
import select
import subprocess
import time

from ingest_services import INGESTOR_BIN, STORAGE_BIN, Ingestor, StorageNode, wait_for_rows
from test_kafka import PARTITIONS, messages, write_pipeline

ROWS = 3_000_000
LINE = re.compile(rb"\r\x1b\[KProgress: ([\d.]+)( thousand| million)? rows, [\d.]+ [KMG]?B \([\d.]+( thousand| million)? "
                  rb"rows/s\., [\d.]+ [KMG]?B/s\.\) [\d.]+ s")
FILL = (f"CREATE TABLE t (x UInt64, s String) ENGINE = MergeTree ORDER BY x; "
        f"INSERT INTO t SELECT number, toString(number) FROM numbers({ROWS})")
LONG_SELECT = "SELECT count() FROM t WHERE s LIKE '%99%'"


class OnTerminal:
    """A process whose standard error is a pseudo-terminal; its stdout is a pipe."""

    def __init__(self, args):
        master, slave = pty.openpty()
        self.master = master
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        self.err = b""

    def read_until(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while not pattern.search(self.err) and time.monotonic() < deadline:
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the process closed its side
                    break
                if not chunk:
                    break
                self.err += chunk
        return pattern.search(self.err)

    def finish(self, timeout=120):
        out, _ = self.proc.communicate(timeout=timeout)
        self.read_until(re.compile(rb"(?!)"), 0.5)
        os.close(self.master)
        return out


def rows_of(match):
    value, unit = float(match.group(1)), (match.group(2) or b"").strip()
    return value * {b"": 1, b"thousand": 1e3, b"million": 1e6}[unit]


def test_local_draws_a_progress_line_on_a_terminal_only(tmp_path):
    script = f"{FILL}; {LONG_SELECT}"
    on_terminal = OnTerminal([str(STORAGE_BIN), "local", "--path", str(tmp_path / "a"), "--query", script])
    out = on_terminal.finish()
    assert on_terminal.proc.returncode == 0, on_terminal.err
    assert out.decode().strip().isdigit(), out  # the result alone on stdout
    lines = list(LINE.finditer(on_terminal.err))
    assert lines, on_terminal.err[-2000:]
    # The SELECT reads the table: its line counts up to every row.
    assert max(rows_of(m) for m in lines) >= ROWS * 0.5, on_terminal.err[-2000:]
    assert on_terminal.err.endswith(b"\r\x1b[K"), "the line is erased at the end"

    piped = subprocess.run([str(STORAGE_BIN), "local", "--path", str(tmp_path / "b"), "--query", script],
                           capture_output=True, timeout=300)
    assert piped.returncode == 0 and piped.stdout == out
    assert b"Progress" not in piped.stderr and b"\x1b" not in piped.stderr, piped.stderr


def test_client_draws_the_servers_progress_on_a_terminal_only(tmp_path):
    storage = StorageNode(tmp_path, None).start()
    try:
        storage.query(FILL)
        on_terminal = OnTerminal([str(STORAGE_BIN), "client", "--addr", storage.addr, "--query", LONG_SELECT])
        out = on_terminal.finish()
        assert on_terminal.proc.returncode == 0, on_terminal.err
        lines = list(LINE.finditer(on_terminal.err))
        assert lines and max(rows_of(m) for m in lines) > 0, on_terminal.err[-2000:]
        piped = subprocess.run([str(STORAGE_BIN), "client", "--addr", storage.addr, "--query", LONG_SELECT],
                               capture_output=True, timeout=120)
        assert piped.returncode == 0 and piped.stdout == out
        assert b"Progress" not in piped.stderr, piped.stderr
        # A failing statement still ends with its error, not a progress line.
        bad = subprocess.run([str(STORAGE_BIN), "client", "--addr", storage.addr, "--query", "SELECT * FROM nope"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "nope" in bad.stderr, bad.stderr
    finally:
        storage.kill()


def test_ingestor_prints_a_status_line_on_a_terminal_and_logs_it_otherwise(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, PARTITIONS)
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "status_line")
    on_terminal = OnTerminal([str(INGESTOR_BIN), "run", "--pipeline", str(pipeline), "--storage-node", storage.addr,
                              "--coordinator", keeper.hosts, "--instance", "tty"])
    try:
        broker.produce(topic, messages(range(1000)))
        wait_for_rows(storage, "status_line", 1000)
        status = re.compile(rb"status_line: [1-9]\d* rows/s, lag 0 \(" + re.escape(topic.encode())
                            + rb"/\d+ 0.*\), last commit [\d.]+ s ago, \d+ partitions")
        assert on_terminal.read_until(status, 30), on_terminal.err[-3000:]
    finally:
        on_terminal.proc.kill()
        on_terminal.finish()

    logged = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="logged").start()
    try:
        deadline = time.monotonic() + 30
        while "status" not in logged.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = logged.output()
        assert re.search(r"INFO .*status pipeline=\"?status_line\"? rows_per_second=\d+ lag=\d+", log), log[-3000:]
        assert "rows/s, lag" not in log
    finally:
        logged.kill()
