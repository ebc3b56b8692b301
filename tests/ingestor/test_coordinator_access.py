"""The storage node and the ingestor reach the coordinator through its secure port with an
identity (`--coordinator-tls-ca`, `--coordinator-identity`): messages land exactly as over the
plain port, and the nodes both processes create belong to that identity (the `auth` ACL, as
ClickHouse creates its nodes when it has an `<identity>`): a client without it can neither read
nor change them."""

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from certs import Authority
from ingest_services import CoordinatorNode, Ingestor, StorageNode, free_port, table_state, wait_for_rows
from test_kafka import PARTITIONS, messages, write_pipeline

IDENTITY = "mergestream:s3cret"


def test_ingestion_through_a_tls_coordinator_with_an_identity(tmp_path, broker, topic):
    ca = Authority(tmp_path / "certs")
    server = ca.issue("coordinator", server=True)
    secure_port = free_port()
    keeper = CoordinatorNode(1, tmp_path / "keeper" / "node1", tick_ms=500, extra_args=[
        "--secure-client-addr", f"127.0.0.1:{secure_port}", "--tls-cert", str(server.cert),
        "--tls-key", str(server.key)]).start()
    secure_hosts = f"127.0.0.1:{secure_port}"
    access = ["--coordinator-tls-ca", str(ca.cert), "--coordinator-identity", IDENTITY]
    storage = StorageNode(tmp_path, secure_hosts, extra_args=access).start()
    ingestor = None
    try:
        broker.create_topic(topic, PARTITIONS)
        broker.produce(topic, messages(range(600)))
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "orders")
        ingestor = Ingestor(tmp_path, pipeline, storage, secure_hosts, extra_args=access).start()
        wait_for_rows(storage, "orders", 600)
        assert table_state(storage, "orders") == (600, 600, sum(i * 3 for i in range(600)))

        offset = f"/mergestream/pipelines/orders/offsets/orders/{topic}/0"
        owner = f"/mergestream/pipelines/orders/owners/{topic}/0"
        stranger = KazooClient(hosts=keeper.hosts)
        stranger.start(timeout=20)
        owner_client = KazooClient(hosts=keeper.hosts, auth_data=[("digest", IDENTITY)])
        owner_client.start(timeout=20)
        for path in (offset, owner):
            acl, _ = owner_client.get_acls(path)
            assert [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acl] == [("digest", "mergestream", 31)], acl
            assert owner_client.get(path)[1].version >= 0
            for denied in (stranger.get, stranger.get_acls, lambda p: stranger.set(p, b"rewound")):
                with pytest.raises(NoAuthError):
                    denied(path)
        stranger.stop()
        owner_client.stop()

        assert ingestor.terminate() == 0, ingestor.output()
        ingestor = None
    finally:
        if ingestor is not None:
            ingestor.kill()
        storage.kill()
        keeper.stop()
