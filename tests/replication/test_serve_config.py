"""`storage-node serve --config FILE`: a replica set up from a TOML file alone (its
coordinator, name, interserver address and macros), flags winning over the file, and a file
with an unknown key refused with its file:line:column before anything starts."""

import subprocess

from ingest_services import STORAGE_BIN, Process, free_port
from replicas import Replica


class ConfiguredReplica(Replica):
    """A storage node whose settings come from `serve.toml` (and `extra` flags)."""

    def __init__(self, workdir, keeper_hosts, name, extra=()):
        self.grpc_port, self.interserver_port = free_port(), free_port()
        self.path = workdir / f"{name}-data"
        self.config = workdir / f"{name}.toml"
        self.config.write_text(
            f'path = "{self.path}"\n'
            f'grpc_addr = "127.0.0.1:{self.grpc_port}"\n'
            f'coordinator = "{keeper_hosts}"\n'
            "session_timeout_ms = 4000\n"
            f'replica = "{name}"\n'
            f'interserver_addr = "127.0.0.1:{self.interserver_port}"\n'
            "\n[macros]\nshard = \"05\"\nlayer = \"blue\"\n")
        Process.__init__(self, name, [str(STORAGE_BIN), "serve", "--config", str(self.config), *extra], workdir)
        self.env = {"MERGESTREAM_LOG": "info"}


def test_a_replica_configured_by_file_alone_registers_as_the_file_says(tmp_path, keeper_hosts, kazoo):
    r1 = ConfiguredReplica(tmp_path, keeper_hosts, "r1").start()
    r2 = ConfiguredReplica(tmp_path, keeper_hosts, "r2", extra=["--macro", "layer=green"]).start()
    try:
        engine = "ReplicatedMergeTree('/clickhouse/tables/{layer}/{shard}/{table}', '{replica}')"
        for replica in (r1, r2):
            replica.query(f"CREATE TABLE cfg (k UInt64) ENGINE = {engine} ORDER BY k")
        # r2's flag overrode the file's macro: its table is another one.
        assert kazoo.get_children("/clickhouse/tables/blue/05/cfg/replicas") == ["r1"]
        assert kazoo.get_children("/clickhouse/tables/green/05/cfg/replicas") == ["r2"]
        host, _ = kazoo.get("/clickhouse/tables/blue/05/cfg/replicas/r1/host")
        assert f"port: {r1.interserver_port}\n" in host.decode(), host
        r1.query("INSERT INTO cfg VALUES (1)")
        assert r1.query("SELECT count() FROM cfg") == "1\n"
    finally:
        r1.stop()
        r2.stop()


def test_an_unknown_key_in_the_config_file_is_refused_with_its_place(tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text(f'path = "{tmp_path / "data"}"\n\nreplicas = "r1"\n')
    out = subprocess.run([str(STORAGE_BIN), "serve", "--config", str(config)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0
    assert f"{config}:3:1: unknown field `replicas`" in out.stderr, out.stderr
    assert not (tmp_path / "data").exists(), "nothing was started"


def test_config_example_prints_a_file_serve_accepts(tmp_path):
    example = subprocess.run([str(STORAGE_BIN), "config-example"], capture_output=True, text=True, timeout=30)
    assert example.returncode == 0 and "# session_timeout_ms = 10000" in example.stdout
    config = tmp_path / "serve.toml"
    config.write_text(example.stdout)
    # Valid, but with no data directory in it or on the command line: that is the only complaint.
    out = subprocess.run([str(STORAGE_BIN), "serve", "--config", str(config)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0 and "no data directory" in out.stderr, out.stderr
