"""The ingestor writes to a storage node that serves its insert port over TLS
(`--tls-cert`/`--tls-key`), trusting the CA given as `--storage-tls-ca`; one that does not
trust that CA writes nothing and says why."""

from certs import Authority
from ingest_services import Ingestor, StorageNode, table_state, wait_for_rows, wait_until
from test_kafka import PARTITIONS, messages, write_pipeline


def test_blocks_go_over_tls_to_a_node_whose_ca_is_trusted(tmp_path, broker, keeper, topic):
    authority = Authority(tmp_path / "certs")
    server = authority.issue("storage-node", server=True)
    node = StorageNode(tmp_path, keeper.hosts, extra_args=["--tls-cert", str(server.cert), "--tls-key", str(server.key)],
                       client_args=["--tls-ca", str(authority.cert)]).start()
    try:
        broker.create_topic(topic, PARTITIONS)
        broker.produce(topic, messages(range(1000)))
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "tls_orders")
        ingestor = Ingestor(tmp_path, pipeline, node, keeper.hosts,
                            extra_args=["--storage-tls-ca", str(authority.cert)]).start()
        wait_for_rows(node, "tls_orders", 1000)
        assert table_state(node, "tls_orders") == (1000, 1000, sum(i * 3 for i in range(1000)))
        assert ingestor.terminate() == 0, ingestor.output()

        # Plain text: the first call fails and the ingestor stops, naming the transport error.
        other = write_pipeline(tmp_path / "other.yaml", broker, topic, "tls_other")
        plain = Ingestor(tmp_path, other, node, keeper.hosts, name="plain").start()
        wait_until(lambda: not plain.alive(), 60, "the plain-text ingestor stopped")
        assert "transport error" in plain.output(), plain.output()
        # TLS with the system's roots, which do not hold the test CA: the handshake fails, and
        # the ingestor says why while it waits for a node it can reach.
        roots = Ingestor(tmp_path, other, node, keeper.hosts, name="roots", extra_args=["--storage-tls"]).start()
        wait_until(lambda: "the storage node is not reachable yet" in roots.output(), 60, "a refused handshake")
        assert "UnknownIssuer" in roots.output(), roots.output()
        roots.kill()
        assert "tls_other" not in node.query("SHOW TABLES")
    finally:
        node.kill()
