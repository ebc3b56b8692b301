"""The ingestor where the data it depends on is damaged or the system is misconfigured: it
must stop (the partition, or the whole process, with an error naming the cause) rather than
loop, start over, or insert anything twice."""

import urllib.request

from kazoo.client import KazooClient

from ingest_services import Ingestor, StorageNode, free_port, table_state, wait_for_rows
from test_kafka import PARTITIONS, messages, write_pipeline


def test_a_corrupt_offset_record_stops_its_partition_instead_of_starting_over(tmp_path, broker, keeper, storage,
                                                                               topic):
    broker.create_topic(topic, PARTITIONS)
    broker.produce(topic, messages(range(400)))
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "orders")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "orders", 400)
    assert ingestor.terminate() == 0

    node = f"/mergestream/pipelines/orders/offsets/orders/{topic}/0"
    zk = KazooClient(hosts=keeper.hosts)
    zk.start()
    zk.set(node, b"\x00\x01 not an offset record")
    zk.stop()
    broker.produce(topic, messages(range(400, 800)))
    metrics_port = free_port()
    restarted = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="restarted", metrics_port=metrics_port).start()
    # Partitions 1 to 3 go on; partition 0 is neither read again from the start nor read on.
    wait_for_rows(storage, "orders", 700)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert "mergestream_ingestor_stopped_partitions 1" in metrics, metrics
    assert restarted.alive()
    count, distinct, _ = table_state(storage, "orders")
    assert (count, distinct) == (700, 700)
    log = restarted.output()
    assert node in log and "damaged" in log and "stopped" in log, log[-3000:]
    restarted.terminate()


def test_a_storage_node_without_a_coordinator_stops_the_ingestor_with_the_reason(tmp_path, broker, keeper, topic):
    lonely = StorageNode(tmp_path, None, name="lonely").start()
    try:
        broker.create_topic(topic, PARTITIONS)
        broker.produce(topic, messages(range(100)))
        pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "orders")
        ingestor = Ingestor(tmp_path, pipeline, lonely, keeper.hosts).start()
        code = ingestor.wait(120)
        assert code != 0
        log = ingestor.output()
        assert "--coordinator" in log and "cannot take this pipeline's inserts" in log, log[-3000:]
        assert "giving it up" not in log
        assert lonely.query("SELECT count() FROM orders") == "0\n"
    finally:
        lonely.kill()
