"""The coordinator's secure client port (ZooKeeper's secureClientPort): TLS with rustls beside
the plain port, client certificates required when a client CA is given, and TLS files that
cannot serve refused at startup with the file named. kazoo is the client, over Python's ssl."""

import subprocess

import pytest
from kazoo.client import KazooClient

from certs import Authority
from services import COORDINATOR_BIN, CoordinatorNode, free_port


@pytest.fixture
def ca(tmp_path):
    return Authority(tmp_path / "certs")


def secure_node(tmp_path, ca, client_ca=None):
    server = ca.issue("coordinator", server=True)
    port = free_port()
    args = ["--secure-client-addr", f"127.0.0.1:{port}", "--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    if client_ca:
        args += ["--tls-client-ca", str(client_ca)]
    node = CoordinatorNode(1, tmp_path / "node1", extra_args=args).start()
    node.secure_hosts = f"127.0.0.1:{port}"
    return node


def connects(hosts, **options):
    client = KazooClient(hosts=hosts, timeout=3, connection_retry={"max_tries": 1}, **options)
    try:
        client.start(timeout=4)
    except Exception:  # kazoo raises its timeout, or the ssl error of the handshake
        client.close()
        return None
    return client


def test_the_secure_port_serves_tls_beside_the_plain_port(tmp_path, ca):
    node = secure_node(tmp_path, ca)
    try:
        secure = connects(node.secure_hosts, use_ssl=True, ca=str(ca.cert))
        assert secure is not None, "no TLS session"
        secure.create("/over-tls", b"sealed")
        plain = connects(node.hosts)
        assert plain.get("/over-tls")[0] == b"sealed"
        # The same session on either port: watches and ephemerals do not care.
        plain.stop()
        secure.stop()
        # Plain text on the secure port is not a ZooKeeper client.
        assert connects(node.secure_hosts) is None
        # Nor is a TLS client that does not trust the coordinator's certificate.
        other = Authority(tmp_path / "other", name="another CA")
        assert connects(node.secure_hosts, use_ssl=True, ca=str(other.cert)) is None
    finally:
        node.stop()


def test_with_a_client_ca_only_its_clients_connect(tmp_path, ca):
    node = secure_node(tmp_path, ca, client_ca=ca.cert)
    try:
        ours = ca.issue("ingestor", server=False)
        client = connects(node.secure_hosts, use_ssl=True, ca=str(ca.cert), certfile=str(ours.cert),
                          keyfile=str(ours.key))
        assert client is not None, "a client with a certificate of the CA was refused"
        assert client.exists("/zookeeper")
        client.stop()
        assert connects(node.secure_hosts, use_ssl=True, ca=str(ca.cert)) is None, "no certificate, yet served"
        stranger = Authority(tmp_path / "other", name="another CA").issue("stranger", server=False)
        assert connects(node.secure_hosts, use_ssl=True, ca=str(ca.cert), certfile=str(stranger.cert),
                        keyfile=str(stranger.key)) is None, "a certificate of another CA was accepted"
    finally:
        node.stop()


def serve_with(tmp_path, *tls_args):
    args = [str(COORDINATOR_BIN), "serve", "--node-id", "1", "--client-addr", f"127.0.0.1:{free_port()}",
            "--raft-addr", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data"),
            "--secure-client-addr", f"127.0.0.1:{free_port()}", *tls_args]
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


def test_tls_files_that_cannot_serve_stop_the_node_naming_the_file(tmp_path, ca):
    server = ca.issue("coordinator", server=True)
    other = ca.issue("other", server=True)
    missing = tmp_path / "missing.key"
    out = serve_with(tmp_path, "--tls-cert", str(server.cert), "--tls-key", str(missing))
    assert out.returncode != 0 and str(missing) in out.stderr, out.stderr
    out = serve_with(tmp_path, "--tls-cert", str(server.cert), "--tls-key", str(other.key))
    assert out.returncode != 0 and "does not match the certificate" in out.stderr, out.stderr
    out = serve_with(tmp_path, "--tls-cert", str(server.key), "--tls-key", str(server.key))
    assert out.returncode != 0 and "no PEM certificate" in out.stderr, out.stderr
    out = serve_with(tmp_path, "--tls-cert", str(server.cert))
    assert out.returncode != 0 and "--tls-key" in out.stderr, out.stderr
