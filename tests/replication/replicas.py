"""Storage nodes serving as replicas of replicated tables, over a coordinator or ZooKeeper."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingestor"))

from ingest_services import STORAGE_BIN, Process, free_port, port_open, wait_until  # noqa: E402,F401


# The engine arguments of every test table: ClickHouse's default layout, macros expanded per replica.
PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


def zk_path(table):
    """The coordinator path of a test table (shard 01, database default)."""
    return f"/clickhouse/tables/01/default/{table}"


def active_parts(replica, table):
    return replica.query(f"SELECT name FROM system.parts WHERE table = '{table}' AND active ORDER BY name").split()


class Replica(Process):
    """`storage-node serve --coordinator … --replica NAME --macro shard=…`."""

    def __init__(self, workdir: Path, keeper_hosts: str, name: str, shard="01"):
        self.grpc_port = free_port()
        self.interserver_port = free_port()
        self.path = workdir / f"{name}-data"
        args = [str(STORAGE_BIN), "serve", "--path", str(self.path), "--grpc-addr", f"127.0.0.1:{self.grpc_port}",
                "--coordinator", keeper_hosts, "--session-timeout-ms", "4000", "--replica", name,
                "--interserver-addr", f"127.0.0.1:{self.interserver_port}", "--macro", f"shard={shard}"]
        super().__init__(name, args, workdir)
        # Info logs: tests read what the replica did (fetched, merged) from them.
        self.env = {"MERGESTREAM_LOG": "info"}

    def start(self):
        super().start()
        wait_until(lambda: port_open(self.grpc_port), 60, "storage node")
        return self

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def run(self, sql, fmt="TSV"):
        """(exit code, stdout, stderr) of `storage-node client --query`."""
        out = subprocess.run([str(STORAGE_BIN), "client", "--addr", f"127.0.0.1:{self.grpc_port}", "--query", sql,
                              "--format", fmt], capture_output=True, text=True, timeout=60)
        return out.returncode, out.stdout, out.stderr

    def query(self, sql, fmt="TSV"):
        code, stdout, stderr = self.run(sql, fmt)
        assert code == 0, stderr
        return stdout
