"""`coordinator serve --config FILE`: a three-node cluster set up from TOML files alone (their
peers tables included), an unknown key refused with its file:line:column, the example file
accepted, and MERGESTREAM_LOG filtering the coordinator's log as it does the other binaries'.
The cluster secret comes from a file or from MERGESTREAM_CLUSTER_SECRET, never both."""

import os
import subprocess
import time

import pytest

from kazoo.client import KazooClient

from services import CLUSTER_SECRET, COORDINATOR_BIN, four_letter, free_port, wait_until


def write_config(path, node_id, client_ports, raft_ports, data_dir, secret):
    peers = "".join(f'{i} = "127.0.0.1:{port}"\n' for i, port in raft_ports.items() if i != node_id)
    path.write_text(
        f"node_id = {node_id}\n"
        f'client_addr = "127.0.0.1:{client_ports[node_id]}"\n'
        f'raft_addr = "127.0.0.1:{raft_ports[node_id]}"\n'
        f'data_dir = "{data_dir}"\n'
        "tick_ms = 500\n"
        + (f'cluster_secret_file = "{secret}"\n' if secret else "")
        + f"\n[peers]\n{peers}")


@pytest.mark.parametrize("secret_from", ["file", "environment"])
def test_a_cluster_configured_by_files_alone_serves_clients(tmp_path, secret_from):
    ids = (1, 2, 3)
    client_ports = {i: free_port() for i in ids}
    raft_ports = {i: free_port() for i in ids}
    secret = tmp_path / "secret"
    secret.write_text(CLUSTER_SECRET)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERGESTREAM_CLUSTER_SECRET")}
    if secret_from == "environment":
        env["MERGESTREAM_CLUSTER_SECRET"] = CLUSTER_SECRET
    procs = []
    try:
        for i in ids:
            config = tmp_path / f"node{i}.toml"
            write_config(config, i, client_ports, raft_ports, tmp_path / f"node{i}",
                         secret if secret_from == "file" else None)
            log = open(tmp_path / f"node{i}.log", "ab")
            procs.append(subprocess.Popen([str(COORDINATOR_BIN), "serve", "--config", str(config)], stdout=log,
                                          stderr=subprocess.STDOUT, env=env))
        for i in ids:
            wait_until(lambda: four_letter(client_ports[i], "ruok") == "imok", 30, f"node {i}")
        hosts = ",".join(f"127.0.0.1:{client_ports[i]}" for i in ids)
        client = KazooClient(hosts=hosts)
        client.start(timeout=30)
        try:
            client.create("/configured", b"yes")
        finally:
            client.stop()
            client.close()
        # Written through one node, read from each: the three are one cluster.
        for i in ids:
            reader = KazooClient(hosts=f"127.0.0.1:{client_ports[i]}")
            reader.start(timeout=30)
            try:
                reader.sync("/configured")
                assert reader.get("/configured")[0] == b"yes"
            finally:
                reader.stop()
                reader.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def run_serve(args, env=None, timeout=30):
    return subprocess.run([str(COORDINATOR_BIN), "serve", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_cluster_secret_is_given_once_and_checked(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(CLUSTER_SECRET)
    node = ["--node-id", "1", "--client-addr", f"127.0.0.1:{free_port()}", "--raft-addr",
            f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"), "--peer", "2=127.0.0.1:1"]
    twice = run_serve([*node, "--cluster-secret-file", str(secret)],
                      env={**os.environ, "MERGESTREAM_CLUSTER_SECRET": CLUSTER_SECRET})
    assert twice.returncode != 0 and "given twice" in twice.stderr and "MERGESTREAM_CLUSTER_SECRET" in twice.stderr, \
        twice.stderr
    short = run_serve(node, env={**os.environ, "MERGESTREAM_CLUSTER_SECRET": "short"})
    assert short.returncode != 0 and "MERGESTREAM_CLUSTER_SECRET:" in short.stderr, short.stderr


def test_an_unknown_key_is_refused_with_its_place(tmp_path):
    config = tmp_path / "node.toml"
    config.write_text(f'node_id = 1\npeer = "2=127.0.0.1:1"\ndata_dir = "{tmp_path / "data"}"\n')
    out = run_serve(["--config", str(config)])
    assert out.returncode != 0
    assert f"{config}:2:1: unknown field `peer`" in out.stderr, out.stderr
    assert not (tmp_path / "data").exists(), "nothing was started"


def test_config_example_prints_a_file_serve_accepts(tmp_path):
    example = subprocess.run([str(COORDINATOR_BIN), "config-example"], capture_output=True, text=True, timeout=30)
    assert example.returncode == 0 and "# tick_ms = 2000" in example.stdout
    config = tmp_path / "node.toml"
    config.write_text(example.stdout)
    out = run_serve(["--config", str(config)])
    assert out.returncode != 0 and "no node_id: give --node-id" in out.stderr, out.stderr


def test_merge_stream_log_filters_the_coordinators_log(tmp_path):
    """MERGESTREAM_LOG, as for the storage node and the ingestor: `warn` hides the info line
    the default filter shows."""
    logs = {}
    for level in ("warn", None):
        port = free_port()
        env = {"PATH": "/usr/bin:/bin", **({"MERGESTREAM_LOG": level} if level else {})}
        args = ["--node-id", "1", "--client-addr", f"127.0.0.1:{port}", "--raft-addr", f"127.0.0.1:{free_port()}",
                "--data-dir", str(tmp_path / f"data-{level}")]
        log = tmp_path / f"{level}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(COORDINATOR_BIN), "serve", *args], stdout=out, stderr=subprocess.STDOUT,
                                    env=env)
            try:
                wait_until(lambda: four_letter(port, "ruok") == "imok", 30, "coordinator")
                time.sleep(0.2)
            finally:
                proc.kill()
                proc.wait()
        logs[level] = log.read_text()
    assert "coordinator serving" in logs[None]
    assert "coordinator serving" not in logs["warn"]
