"""`ingestor run` with a NATS JetStream source: a real nats-server, a coordinator and a
serving storage node. The stream sequence takes the place of the Kafka offset."""

import json
import time

from ingest_services import Ingestor, kill_and_restart_while_producing, table_state, wait_for_rows, wait_until


def write_pipeline(path, nats_server, stream, table, *, errors="", subjects="", batch="{ max_rows: 300, max_ms: 200 }"):
    path.write_text(f"""name: {table}
source:
  nats:
    url: {nats_server.url}
    stream: {stream}
    consumer: {table}-ingestor
    {subjects}
format: json
tables:
  - ddl: |
      CREATE TABLE {table} (id UInt64, v UInt64, subject String, seq UInt64, msg_id String)
      ENGINE = ReplacingMergeTree ORDER BY id
    columns:
      id: id
      v: {{ field: payload.v }}
      subject: {{ topic: true }}
      seq: {{ sequence: true }}
      msg_id: {{ key: true }}
batch: {batch}
{errors}
""")
    return path


def messages(stream, ids):
    return [(f"{stream}.{'a' if i % 2 else 'b'}", json.dumps({"id": i, "payload": {"v": i * 3}}).encode(),
             {"Nats-Msg-Id": f"m{i}"}) for i in ids]


def test_a_stream_lands_once_with_subject_sequence_and_acks(tmp_path, nats_server, keeper, storage):
    nats_server.add_stream("ORDERS1", ["ORDERS1.*"])
    nats_server.publish(messages("ORDERS1", range(1000)))
    pipeline = write_pipeline(tmp_path / "p.yaml", nats_server, "ORDERS1", "orders_nats")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "orders_nats", 1000)
    assert table_state(storage, "orders_nats") == (1000, 1000, sum(i * 3 for i in range(1000)))
    rows = storage.query("SELECT id, subject, seq, msg_id FROM orders_nats WHERE id IN (0, 1, 999) ORDER BY id")
    assert rows.splitlines() == ["0\tORDERS1.b\t1\tm0", "1\tORDERS1.a\t2\tm1", "999\tORDERS1.a\t1000\tm999"]
    # The durable consumer acknowledges what is committed, for `nats consumer info`.
    wait_until(lambda: nats_server.ack_floor("ORDERS1", "orders_nats-ingestor") == 1000, 30, "the ack floor")
    assert ingestor.terminate() == 0, ingestor.output()


def test_only_the_filtered_subject_is_read(tmp_path, nats_server, keeper, storage):
    nats_server.add_stream("ORDERS2", ["ORDERS2.*"])
    nats_server.publish(messages("ORDERS2", range(200)))
    pipeline = write_pipeline(tmp_path / "p.yaml", nats_server, "ORDERS2", "only_a", subjects="subjects: [ORDERS2.a]")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "only_a", 100)
    time.sleep(1)
    assert table_state(storage, "only_a") == (100, 100, sum(i * 3 for i in range(1, 200, 2)))
    assert ingestor.terminate() == 0, ingestor.output()


def test_exactly_once_while_ingestors_and_the_storage_node_are_killed(tmp_path, nats_server, keeper, storage):
    n = 10_000
    nats_server.add_stream("ORDERS3", ["ORDERS3.*"])
    pipeline = write_pipeline(tmp_path / "p.yaml", nats_server, "ORDERS3", "eo_nats")
    a = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="a").start()
    b = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="b").start()

    def produce():
        for chunk in range(10):
            nats_server.publish(messages("ORDERS3", range(chunk * 1000, (chunk + 1) * 1000)))
            time.sleep(0.3)

    kill_and_restart_while_producing(produce, {"a": a, "b": b, "storage": storage}, seed=11)
    wait_for_rows(storage, "eo_nats", n, timeout=180)
    time.sleep(2)  # late duplicates, if there were any, would land now
    assert table_state(storage, "eo_nats") == (n, n, sum(i * 3 for i in range(n)))
    for ingestor in (a, b):
        assert ingestor.terminate() == 0, ingestor.output()


def test_bad_messages_go_to_a_dead_letter_subject(tmp_path, nats_server, keeper, storage):
    nats_server.add_stream("ORDERS4", ["ORDERS4.*"])
    nats_server.add_stream("DEAD4", ["dead4"])
    good = [("ORDERS4.a", json.dumps({"id": i, "payload": {"v": i}}).encode(), None) for i in range(50)]
    bad = [("ORDERS4.a", b"{oops", None), ("ORDERS4.a", json.dumps({"id": "x", "payload": {"v": 1}}).encode(), None)]
    nats_server.publish(good[:20] + bad[:1] + good[20:40] + bad[1:] + good[40:])
    errors = "errors: { mode: dead_letter, dead_letter_topic: dead4, max_error_rate: 0.5 }"
    pipeline = write_pipeline(tmp_path / "p.yaml", nats_server, "ORDERS4", "dlq_nats", errors=errors)
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "dlq_nats", 50)
    assert table_state(storage, "dlq_nats") == (50, 50, sum(range(50)))
    wait_until(lambda: len(nats_server.read_stream("DEAD4", "dead4")) == 2, 30, "two dead letters")
    dead = nats_server.read_stream("DEAD4", "dead4")
    assert [payload for payload, _ in dead] == [b"{oops", bad[1][1]]
    assert dead[0][1]["mergestream.error"] == "malformed"
    assert dead[0][1]["mergestream.source.offset"] == "21"
    assert dead[1][1]["mergestream.reason"].startswith("column id: cannot parse 'x' as UInt64")
    assert ingestor.terminate() == 0, ingestor.output()
