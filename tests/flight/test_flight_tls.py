"""TLS on the storage node's client ports (`--tls-cert`, `--tls-key`): Flight SQL through
ADBC and the insert service through `storage-node client` reach it with the CA that signed
its certificate, and neither a plain-text client nor one that does not trust the CA gets an
answer. A certificate or key that cannot serve is refused at start, by file name."""

import subprocess

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pytest
from certs import Authority
from ingest_services import STORAGE_BIN, StorageNode, free_port, port_open, wait_until

TLS_ROOTS = "adbc.flight.sql.client_option.tls_root_certs"


@pytest.fixture
def authority(tmp_path):
    return Authority(tmp_path / "certs")


@pytest.fixture
def tls_node(tmp_path, authority):
    server = authority.issue("storage-node", server=True)
    port = free_port()
    node = StorageNode(tmp_path, None,
                       extra_args=["--flight-addr", f"127.0.0.1:{port}",
                                   "--tls-cert", str(server.cert), "--tls-key", str(server.key)],
                       client_args=["--tls-ca", str(authority.cert)]).start()
    wait_until(lambda: port_open(port), 30, "the Flight SQL port")
    node.flight_port = port
    yield node
    node.kill()


def client(node, *args, sql="SELECT 1"):
    return subprocess.run([str(STORAGE_BIN), "client", "--addr", node.addr, *args, "--query", sql],
                          capture_output=True, text=True, timeout=60)


def test_flight_sql_over_tls_trusting_the_ca(tls_node, authority):
    uri = f"grpc+tls://127.0.0.1:{tls_node.flight_port}"
    with flightsql.connect(uri, db_kwargs={TLS_ROOTS: authority.cert.read_text()}) as conn:
        with conn.cursor() as cursor:
            cursor.execute("CREATE TABLE t (k UInt64, v String) ENGINE = ReplacingMergeTree ORDER BY k")
            cursor.execute("INSERT INTO t SELECT number % 10, toString(number) FROM numbers(100)")
            cursor.execute("SELECT count(), sum(k) FROM t FINAL")
            assert cursor.fetchall() == [(10, 45)]

    # A plain-text client, and one that trusts another CA, get no answer.
    for kwargs in ({}, {TLS_ROOTS: Authority(tls_node.path.parent / "other", "another CA").cert.read_text()}):
        scheme = "grpc+tls" if kwargs else "grpc"
        with pytest.raises(adbc_driver_manager.Error):
            with flightsql.connect(f"{scheme}://127.0.0.1:{tls_node.flight_port}", db_kwargs=kwargs) as conn:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
                    cursor.fetchall()


def test_the_insert_service_over_tls(tls_node, authority, tmp_path):
    tls_node.query("CREATE TABLE s (k UInt64) ENGINE = MergeTree ORDER BY k")
    tls_node.query("INSERT INTO s SELECT number FROM numbers(5)")
    assert tls_node.query("SELECT sum(k) FROM s").strip() == "10"

    plain = client(tls_node)
    assert plain.returncode != 0 and "if the node serves TLS, give --tls-ca" in plain.stderr, plain.stderr
    other = Authority(tmp_path / "other", "another CA")
    untrusted = client(tls_node, "--tls-ca", str(other.cert))
    assert untrusted.returncode != 0 and "certificate" in untrusted.stderr, untrusted.stderr
    # The certificate names localhost and 127.0.0.1: another name does not pass.
    wrong_name = client(tls_node, "--tls-ca", str(authority.cert), "--tls-domain", "storage.example.com")
    assert wrong_name.returncode != 0 and "certificate" in wrong_name.stderr, wrong_name.stderr
    missing = client(tls_node, "--tls-ca", str(tmp_path / "nowhere.pem"))
    assert missing.returncode != 0 and "nowhere.pem" in missing.stderr, missing.stderr


def serve(tmp_path, *args):
    """`storage-node serve` with TLS settings that cannot work: it must exit at once."""
    out = subprocess.run([str(STORAGE_BIN), "serve", "--path", str(tmp_path / "data"), "--grpc-addr",
                          f"127.0.0.1:{free_port()}", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0, out.stderr
    return out.stderr


def test_a_certificate_or_key_that_cannot_serve_is_named_at_start(tmp_path, authority):
    server = authority.issue("storage-node", server=True)
    other = authority.issue("other-node", server=True)
    error = serve(tmp_path, "--tls-cert", str(server.cert), "--tls-key", str(other.key))
    assert "cannot set up TLS" in error and str(server.cert) in error and str(other.key) in error, error
    error = serve(tmp_path, "--tls-cert", str(server.cert), "--tls-key", str(tmp_path / "missing.key"))
    assert f"{tmp_path / 'missing.key'}: No such file" in error, error
    error = serve(tmp_path, "--tls-cert", str(server.key), "--tls-key", str(server.key))
    assert f"{server.key}: no certificate in it" in error, error
    error = serve(tmp_path, "--tls-cert", str(server.cert))
    assert "needs tls_key (--tls-key)" in error, error
