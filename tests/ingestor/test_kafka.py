"""`ingestor run` against the real Tansu broker, a coordinator and a serving storage node."""

import json
import time
import urllib.request

from ingest_services import (
    Ingestor, free_port, kill_and_restart_while_producing, peak_rss_kib, table_state, wait_for_rows, wait_until,
)

PARTITIONS = 4


def write_pipeline(path, broker, topic, table, *, errors="", batch="{ max_rows: 300, max_ms: 200 }",
                   engine="MergeTree", extra_columns="", settings="", extra=""):
    path.write_text(f"""name: {table}
source:
  kafka:
    brokers: {broker.brokers}
    topics: [{topic}]
format: json
tables:
  - ddl: |
      CREATE TABLE {table} (id UInt64, v UInt64, who String, p UInt32, o UInt64{extra_columns})
      ENGINE = {engine} ORDER BY id {settings}
    columns:
      id: id
      v: {{ field: payload.v }}
      who: {{ key: true }}
      p: {{ partition: true }}
      o: {{ offset: true }}
batch: {batch}
{errors}
{extra}
""")
    return path


def messages(ids):
    return [(i % PARTITIONS, f"k{i}".encode(), json.dumps({"id": i, "payload": {"v": i * 3}}).encode(), None)
            for i in ids]


def test_messages_land_once_and_sigterm_commits_the_offsets(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, PARTITIONS)
    broker.produce(topic, messages(range(2000)))
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "orders")
    metrics_port = free_port()
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts, metrics_port=metrics_port).start()
    wait_for_rows(storage, "orders", 2000)
    assert table_state(storage, "orders") == (2000, 2000, sum(i * 3 for i in range(2000)))
    # Every column of the mapping: the key, the partition and the offset of each message.
    rows = storage.query("SELECT id, who, p, o FROM orders WHERE id IN (0, 5, 1999) ORDER BY id").splitlines()
    assert rows == ["0\tk0\t0\t0", "5\tk5\t1\t1", "1999\tk1999\t3\t499"]

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert 'mergestream_ingestor_rows_total{table="orders"} 2000' in metrics, metrics
    assert "mergestream_ingestor_insert_duration_seconds" in metrics

    broker.produce(topic, messages(range(2000, 2100)))
    wait_for_rows(storage, "orders", 2100)
    assert ingestor.terminate() == 0, ingestor.output()
    # Offsets went to the consumer group too, for lag tools: each partition's end.
    assert broker.committed("mergestream-orders", topic, PARTITIONS) == {p: 525 for p in range(PARTITIONS)}


def test_header_timestamp_and_topic_columns(tmp_path, broker, keeper, storage, topic):
    """Headers and timestamps are read only when a column maps one; this pipeline does, so
    every message's header value (or NULL without it), its timestamp and its topic reach the
    table."""
    broker.create_topic(topic, PARTITIONS)
    stamp = 1_700_000_000_000
    sent = [(i % PARTITIONS, f"k{i}".encode(), json.dumps({"id": i, "payload": {"v": i}}).encode(),
             [("trace", f"t{i}".encode()), ("other", b"x")] if i % 2 == 0 else None, stamp + i) for i in range(200)]
    broker.produce(topic, sent)
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "headers",
                              extra_columns=", trace Nullable(String), t String, ms Int64, at DateTime")
    text = pipeline.read_text().replace("      o: { offset: true }\n",
                                        "      o: { offset: true }\n      trace: { header: trace }\n"
                                        "      t: { topic: true }\n      ms: { timestamp: true }\n"
                                        "      at: { timestamp: true }\n")
    pipeline.write_text(text)
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "headers", 200)
    rows = storage.query("SELECT id, trace, t, ms, at FROM headers WHERE id IN (0, 1, 198) "
                         "ORDER BY id").splitlines()
    at = "2023-11-14 22:13:20"  # the stamp in whole seconds, UTC
    assert rows == [f"0\tt0\t{topic}\t{stamp}\t{at}", f"1\t\\N\t{topic}\t{stamp + 1}\t{at}",
                    f"198\tt198\t{topic}\t{stamp + 198}\t{at}"]
    assert storage.query("SELECT count() FROM headers WHERE trace IS NOT NULL").strip() == "100"
    assert ingestor.terminate() == 0, ingestor.output()


def test_sigterm_flushes_what_is_buffered(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, PARTITIONS)
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "slow", batch="{ max_rows: 100000, max_ms: 600000 }")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_until(lambda: "owning partition" in ingestor.output(), 60, "partitions owned")
    broker.produce(topic, messages(range(300)))
    time.sleep(3)
    assert table_state(storage, "slow")[0] == 0, "nothing is flushed before a threshold"
    assert ingestor.terminate() == 0, ingestor.output()
    assert table_state(storage, "slow") == (300, 300, sum(i * 3 for i in range(300)))


def test_idle_ms_flushes_once_the_source_is_quiet(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, PARTITIONS)
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "idle",
                              batch="{ max_rows: 100000, max_ms: 600000, idle_ms: 300 }")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_until(lambda: "owning partition" in ingestor.output(), 60, "partitions owned")
    broker.produce(topic, messages(range(300)))
    # Far below max_ms (10 minutes) and max_rows: only the quiet source flushes them.
    wait_for_rows(storage, "idle", 300, timeout=30)
    assert table_state(storage, "idle") == (300, 300, sum(i * 3 for i in range(300)))
    assert ingestor.terminate() == 0, ingestor.output()


def test_exactly_once_while_ingestors_and_the_storage_node_are_killed(tmp_path, broker, keeper, storage, topic):
    n = 20_000
    broker.create_topic(topic, PARTITIONS)
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "eo")
    a = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="a").start()
    b = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="b").start()

    def produce():
        for chunk in range(20):
            broker.produce(topic, messages(range(chunk * 1000, (chunk + 1) * 1000)))
            time.sleep(0.3)

    kill_and_restart_while_producing(produce, {"a": a, "b": b, "storage": storage}, seed=7)
    wait_for_rows(storage, "eo", n, timeout=180)
    time.sleep(2)  # late duplicates, if there were any, would land now
    assert table_state(storage, "eo") == (n, n, sum(i * 3 for i in range(n)))
    for ingestor in (a, b):
        assert ingestor.terminate() == 0, ingestor.output()


def test_the_partitions_of_a_dead_ingestor_are_taken_over(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, PARTITIONS)
    broker.produce(topic, messages(range(1000)))
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "takeover")
    first = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="first").start()
    wait_for_rows(storage, "takeover", 1000)
    second = Ingestor(tmp_path, pipeline, storage, keeper.hosts, name="second").start()
    time.sleep(3)
    assert "owning partition" not in second.output(), "every partition is held by the first"
    first.kill()
    broker.produce(topic, messages(range(1000, 2000)))
    # The first one's session expires (4 s here) and its locks go with it.
    wait_for_rows(storage, "takeover", 2000, timeout=60)
    assert second.output().count("owning partition") == PARTITIONS
    assert table_state(storage, "takeover") == (2000, 2000, sum(i * 3 for i in range(2000)))
    assert second.terminate() == 0


BAD = [
    (b"{not json", "malformed"),
    (json.dumps({"payload": {"v": 1}}).encode(), "missing_field"),
    (json.dumps({"id": "seven", "payload": {"v": 1}}).encode(), "wrong_type"),
    (json.dumps([1, 2]).encode(), "not_an_object"),
]


def bad_and_good():
    """Good messages 0..99 on partition 0 with the bad ones in between."""
    out = []
    for i in range(100):
        out.append((0, None, json.dumps({"id": i, "payload": {"v": i}}).encode(), None))
        if i % 25 == 10:
            out.append((0, b"bad", BAD[i // 25][0], None))
    return out


def test_bad_messages_go_to_the_dead_letter_topic_with_the_reason(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, 1)
    broker.create_topic(f"{topic}-dlq", 1)
    broker.produce(topic, bad_and_good())
    errors = f"errors: {{ mode: dead_letter, dead_letter_topic: {topic}-dlq, max_error_rate: 0.5 }}"
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "dlq", errors=errors)
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "dlq", 100)
    assert table_state(storage, "dlq") == (100, 100, sum(range(100)))
    dead = broker.consume_all(f"{topic}-dlq", 1, len(BAD))
    assert [m.value() for m in dead] == [b for b, _ in BAD]
    for m, (_, kind) in zip(dead, BAD):
        headers = {k: v.decode() for k, v in m.headers()}
        assert headers["mergestream.error"] == kind
        assert headers["mergestream.table"] == "dlq"
        assert headers["mergestream.source.topic"] == topic
        assert headers["mergestream.reason"], headers
    reasons = [dict(m.headers())["mergestream.reason"].decode() for m in dead]
    assert reasons[1] == "missing required field `id` (column id)"
    assert reasons[2].startswith("column id: cannot parse 'seven' as UInt64"), reasons[2]
    assert ingestor.terminate() == 0


def test_skip_mode_drops_bad_messages_and_keeps_the_good(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, 1)
    broker.produce(topic, bad_and_good())
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "skipped", errors="errors: { mode: skip }")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "skipped", 100)
    assert table_state(storage, "skipped") == (100, 100, sum(range(100)))
    assert ingestor.terminate() == 0


def test_fail_mode_stops_at_the_first_bad_message_keeping_what_came_before(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, 1)
    broker.produce(topic, bad_and_good())
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "strict", errors="errors: { mode: fail }")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    assert ingestor.wait(60) != 0
    assert f"{topic}/0 offset 11: not valid JSON" in ingestor.output(), ingestor.output()
    assert table_state(storage, "strict") == (11, 11, sum(range(11)))


def test_too_many_bad_messages_stop_the_pipeline(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, 1)
    broker.produce(topic, [(0, None, b"junk", None)] * 50 + messages(range(0, 200, PARTITIONS)))
    errors = "errors: { mode: skip, max_error_rate: 0.1 }"
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "noisy", errors=errors,
                              batch="{ max_rows: 100, max_ms: 200 }")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    assert ingestor.wait(60) != 0
    assert "above errors.max_error_rate 0.1" in ingestor.output(), ingestor.output()
    assert table_state(storage, "noisy")[0] == 0


def test_memory_in_flight_stays_within_max_in_flight_bytes(tmp_path, broker, keeper, storage, topic):
    # 120 MB of messages behind a storage node that delays inserts: with an 8 MiB bound the
    # ingestor holds a few MiB of them at a time (librdkafka's prefetch included), not the topic.
    broker.create_topic(topic, PARTITIONS)
    pad = "x" * 2000
    broker.produce(topic, [(i % PARTITIONS, None, json.dumps({"id": i, "payload": {"v": i * 3}, "pad": pad}).encode(),
                            None) for i in range(60_000)])
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "bounded",
                              batch="{ max_rows: 100000, max_bytes: 64MiB, max_ms: 1000 }",
                              settings="SETTINGS parts_to_delay_insert = 2, parts_to_throw_insert = 4, "
                                       "max_delay_to_insert = 1",
                              extra="max_in_flight_bytes: 8MiB")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "bounded", 60_000, timeout=300)
    assert table_state(storage, "bounded") == (60_000, 60_000, sum(i * 3 for i in range(60_000)))
    peak_kib = peak_rss_kib(ingestor.proc.pid)
    # About 90 MiB here (the process, Arrow blocks and their IPC copies); 200 MiB with the
    # default 256 MiB bound.
    assert peak_kib < 140 * 1024, f"peak RSS {peak_kib} KiB"
    assert ingestor.terminate() == 0, ingestor.output()


def test_a_storage_node_refusing_inserts_slows_consumption_down(tmp_path, broker, keeper, storage, topic):
    """Too many parts: the storage node refuses inserts (RESOURCE_EXHAUSTED) until its merges
    catch up; the ingestor retries the same block and loses nothing."""
    broker.create_topic(topic, PARTITIONS)
    broker.produce(topic, messages(range(3000)))
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "crowded", batch="{ max_rows: 100, max_ms: 100 }",
                              settings="SETTINGS parts_to_delay_insert = 2, parts_to_throw_insert = 3, "
                                       "max_delay_to_insert = 1")
    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts).start()
    wait_for_rows(storage, "crowded", 3000, timeout=180)
    time.sleep(1)
    assert table_state(storage, "crowded") == (3000, 3000, sum(i * 3 for i in range(3000)))
    assert "insert delayed; retrying the same block" in ingestor.output()
    assert ingestor.terminate() == 0, ingestor.output()
