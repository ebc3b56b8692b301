"""The Rust example client (examples/flight-sql-client, arrow-flight's FlightSqlServiceClient)
against a storage node: a FINAL query, a prepared statement with parameters, and a user's
handshake. scripts/test builds it with the binaries."""

import os
import subprocess
from pathlib import Path

from ingest_services import ROOT, StorageNode, free_port, port_open, wait_until

CLIENT_BIN = Path(os.environ.get("MERGESTREAM_FLIGHT_CLIENT_BIN", ROOT / "target" / "debug" / "flight-sql-client"))


def run(uri, *args):
    out = subprocess.run([str(CLIENT_BIN), "--addr", uri, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_rust_example_queries_prepares_and_authenticates(tmp_path):
    (tmp_path / "node.toml").write_text(
        '[[users]]\nname = "alice"\n'
        'password_sha256_hex = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"\n')
    port = free_port()
    node = StorageNode(tmp_path, None, extra_args=["--config", str(tmp_path / "node.toml"),
                                                   "--flight-addr", f"127.0.0.1:{port}"]).start()
    try:
        wait_until(lambda: port_open(port), 30, "the Flight SQL port")
        uri = f"http://127.0.0.1:{port}"
        login = ["--user", "alice", "--password", "secret"]
        run(uri, *login, "CREATE TABLE t (k UInt64, v String) ENGINE = ReplacingMergeTree ORDER BY k")
        run(uri, *login, "INSERT INTO t VALUES (1, 'old'), (2, 'two')")
        run(uri, *login, "INSERT INTO t VALUES (1, 'new')")
        assert run(uri, *login, "SELECT k, v FROM t FINAL ORDER BY k") == "k\tv\n1\tnew\n2\ttwo\n"
        assert run(uri, *login, "SELECT v FROM t FINAL WHERE k = ? AND v != ?", "--param", "1",
                   "--param", "x") == "v\nnew\n"
        refused = subprocess.run([str(CLIENT_BIN), "--addr", uri, "SELECT 1"], capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode != 0 and "credentials needed" in refused.stderr, refused.stderr
    finally:
        node.kill()
