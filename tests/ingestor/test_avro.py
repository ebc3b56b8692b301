"""`ingestor run` with Avro payloads on the real Tansu broker: one writer schema from a file,
and the Confluent wire format with schema ids from the pipeline file or a schema registry.
The messages are encoded by fastavro, an implementation independent of ours."""

import base64
import http.server
import io
import json
import ssl
import struct
import subprocess
import threading
from decimal import Decimal
from pathlib import Path

import fastavro

from ingest_services import Ingestor, table_state, wait_for_rows

ROOT = Path(__file__).resolve().parents[2]
ORDERS_AVSC = ROOT / "schemas" / "avro" / "orders.avsc"


def order(i):
    return {"order_id": i, "customer": {"name": f"c{i % 7}"}, "amount": Decimal(i) / 4 - Decimal("12.50"),
            "status": ["new", "paid", "shipped"][i % 3], "note": None if i % 2 else f"n{i}", "version": i // 10,
            "created": 1_790_000_000_000 + i}


def avro_bytes(schema, record):
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def confluent(schema_id, schema, record):
    return b"\x00" + struct.pack(">I", schema_id) + avro_bytes(schema, record)


def pipeline_text(broker, topic, table, fmt, dead_letters):
    return f"""name: {table}
source:
  kafka:
    brokers: {broker.brokers}
    topics: [{topic}]
format:
{fmt}
tables:
  - ddl: |
      CREATE TABLE {table} (id UInt64, v UInt64, customer String, amount Decimal(12, 2),
                            status String, note Nullable(String), created DateTime64(3))
      ENGINE = ReplacingMergeTree(v) ORDER BY id
    columns:
      id: order_id
      v: version
      customer: customer.name
      amount: amount
      status: status
      note: note
      created: created
batch: {{ max_rows: 200, max_ms: 200 }}
errors: {{ mode: dead_letter, dead_letter_topic: {dead_letters}, max_error_rate: 0.5 }}
"""


def ch_decimal(d):
    """A Decimal as ClickHouse prints it: no trailing zeros (output_format_decimal_trailing_zeros = 0)."""
    text = f"{d:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def expected_rows(ids):
    out = []
    for i in ids:
        o = order(i)
        note = "\\N" if o["note"] is None else o["note"]
        out.append(f"{i}\t{o['customer']['name']}\t{ch_decimal(o['amount'])}\t{o['status']}\t{note}")
    return out


def check_table(storage, table, n):
    wait_for_rows(storage, table, n)
    count, distinct, _ = table_state(storage, table)
    assert (count, distinct) == (n, n)
    rows = storage.query(f"SELECT id, customer, amount, status, note FROM {table} WHERE id IN (0, 1, 50) ORDER BY id")
    assert rows.splitlines() == expected_rows([0, 1, 50])
    assert storage.query(f"SELECT sum(amount) FROM {table}").strip() == ch_decimal(sum(order(i)['amount'] for i in range(n)))
    assert storage.query(f"SELECT created FROM {table} WHERE id = 3").strip() == "2026-09-21 14:13:20.003"


def test_avro_with_one_writer_schema(tmp_path, broker, keeper, storage, topic):
    schema = fastavro.parse_schema(json.loads(ORDERS_AVSC.read_text()))
    broker.create_topic(topic, 2)
    broker.create_topic(f"{topic}-dlq", 1)
    good = [(i % 2, None, avro_bytes(schema, order(i)), None) for i in range(300)]
    bad = [(0, None, b"\x02", None), (0, None, avro_bytes(schema, order(5))[:-3], None)]
    broker.produce(topic, good[:100] + bad + good[100:])
    path = tmp_path / "p.yaml"
    path.write_text(pipeline_text(broker, topic, "avro_orders", f"  avro: {{ schema: {ORDERS_AVSC} }}", f"{topic}-dlq"))
    ingestor = Ingestor(tmp_path, path, storage, keeper.hosts).start()
    check_table(storage, "avro_orders", 300)
    dead = broker.consume_all(f"{topic}-dlq", 1, 2)
    assert [m.value() for m in dead] == [b for _, _, b, _ in bad]
    for m in dead:
        headers = {k: v.decode() for k, v in m.headers()}
        assert headers["mergestream.error"] == "malformed"
        assert headers["mergestream.reason"].startswith("not valid Avro"), headers
    assert ingestor.terminate() == 0, ingestor.output()


V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "order_id", "type": "long"}, {"name": "version", "type": "long"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [{"name": "name", "type": "string"}]}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "status", "type": "string"},
    {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}


def test_confluent_framing_with_schema_ids_from_the_pipeline(tmp_path, broker, keeper, storage, topic):
    """Two writer schemas by id (v1 without `note`, the file's v2 with it), an unknown id and
    a message without the magic byte."""
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    v1 = fastavro.parse_schema(V1)
    v2 = fastavro.parse_schema(json.loads(ORDERS_AVSC.read_text()))
    broker.create_topic(topic, 1)
    broker.create_topic(f"{topic}-dlq", 1)
    messages = []
    for i in range(200):
        record = order(i)
        if i % 2:  # v1 has no note; a missing Nullable field is NULL, as order() has it for odd ids
            messages.append((0, None, confluent(1, v1, {k: v for k, v in record.items() if k != "note"}), None))
        else:
            messages.append((0, None, confluent(2, v2, record), None))
    bad = [(0, None, confluent(99, v2, order(1)), None), (0, None, avro_bytes(v2, order(2)), None)]
    broker.produce(topic, messages[:50] + bad + messages[50:])
    fmt = f"  avro-confluent:\n    schemas: {{ 1: {tmp_path / 'v1.avsc'}, 2: {ORDERS_AVSC} }}"
    path = tmp_path / "p.yaml"
    path.write_text(pipeline_text(broker, topic, "confluent_orders", fmt, f"{topic}-dlq"))
    ingestor = Ingestor(tmp_path, path, storage, keeper.hosts).start()
    check_table(storage, "confluent_orders", 200)
    dead = broker.consume_all(f"{topic}-dlq", 1, 2)
    kinds = [{k: v.decode() for k, v in m.headers()}["mergestream.error"] for m in dead]
    assert kinds == ["unknown_schema", "malformed"]
    assert ingestor.terminate() == 0, ingestor.output()


class SchemaRegistry:
    """The schema-by-id endpoint of the Confluent Schema Registry REST API
    (`GET /schemas/ids/<id>`), served on loopback. No Confluent-compatible registry can be
    installed from this machine's package sources, so the test serves the one endpoint the
    ingestor reads, with the registry's answers for a known and an unknown id."""

    def __init__(self, schemas, tls=None, credentials=None):
        """`tls`: (certificate file, key file) to serve https; `credentials`: "user:password"
        that every request must carry (HTTP basic authentication), as Confluent's does."""
        self.requests = []
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if credentials is not None:
                    expected = "Basic " + base64.b64encode(credentials.encode()).decode()
                    if self.headers.get("Authorization") != expected:
                        registry.requests.append(("unauthorized", self.path))
                        self.send_response(401)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                registry.requests.append(self.path)
                prefix = "/schemas/ids/"
                schema = schemas.get(int(self.path[len(prefix):])) if self.path.startswith(prefix) else None
                if schema is None:
                    body, status = {"error_code": 40403, "message": "Schema not found"}, 404
                else:
                    body, status = {"schema": json.dumps(schema)}, 200
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


def test_confluent_framing_with_schemas_from_a_registry(tmp_path, broker, keeper, storage, topic):
    registry = SchemaRegistry({7: json.loads(ORDERS_AVSC.read_text())})
    try:
        schema = fastavro.parse_schema(json.loads(ORDERS_AVSC.read_text()))
        broker.create_topic(topic, 1)
        broker.create_topic(f"{topic}-dlq", 1)
        unknown = (0, None, confluent(8, schema, order(1)), None)
        good = [(0, None, confluent(7, schema, order(i)), None) for i in range(100)]
        broker.produce(topic, good[:10] + [unknown] + good[10:] + [unknown])
        fmt = f"  avro-confluent: {{ registry_url: {registry.url} }}"
        path = tmp_path / "p.yaml"
        path.write_text(pipeline_text(broker, topic, "registry_orders", fmt, f"{topic}-dlq"))
        ingestor = Ingestor(tmp_path, path, storage, keeper.hosts).start()
        check_table(storage, "registry_orders", 100)
        dead = broker.consume_all(f"{topic}-dlq", 1, 2)
        assert [{k: v.decode() for k, v in m.headers()}["mergestream.error"] for m in dead] == ["unknown_schema"] * 2
        # Each id is asked for once: known schemas and unknown ids are both remembered.
        assert sorted(registry.requests) == ["/schemas/ids/7", "/schemas/ids/8"]
        assert ingestor.terminate() == 0, ingestor.output()
    finally:
        registry.close()


def make_certificates(directory):
    """A private CA and a certificate it signs for 127.0.0.1, made with the openssl CLI."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=mergestream test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                          "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return directory / "ca.pem", (directory / "server.pem", directory / "server.key")


def test_an_https_registry_with_a_private_ca_and_basic_auth(tmp_path, broker, keeper, storage, topic):
    ca, server_tls = make_certificates(tmp_path)
    registry = SchemaRegistry({7: json.loads(ORDERS_AVSC.read_text())}, tls=server_tls, credentials="ann:s3cret")
    try:
        schema = fastavro.parse_schema(json.loads(ORDERS_AVSC.read_text()))
        broker.create_topic(topic, 1)
        broker.create_topic(f"{topic}-dlq", 1)
        broker.produce(topic, [(0, None, confluent(7, schema, order(i)), None) for i in range(100)])
        fmt = (f"  avro-confluent: {{ registry_url: {registry.url}, registry_ca_file: {ca},"
               f" registry_basic_auth: 'ann:s3cret' }}")
        path = tmp_path / "p.yaml"
        path.write_text(pipeline_text(broker, topic, "tls_orders", fmt, f"{topic}-dlq"))
        ingestor = Ingestor(tmp_path, path, storage, keeper.hosts).start()
        check_table(storage, "tls_orders", 100)
        assert registry.requests == ["/schemas/ids/7"], "one authenticated lookup over TLS"
        assert ingestor.terminate() == 0, ingestor.output()

        # The system's CAs do not know the private one: the registry cannot be asked, and the
        # ingestor stops rather than dead-letter messages whose schema it could not get.
        untrusted = tmp_path / "untrusted.yaml"
        untrusted.write_text(pipeline_text(broker, topic, "tls_untrusted", fmt.replace(f" registry_ca_file: {ca},", ""),
                                           f"{topic}-dlq"))
        failing = Ingestor(tmp_path, untrusted, storage, keeper.hosts, name="untrusted").start()
        assert failing.wait(120) != 0
        assert "certificate" in failing.output().lower(), failing.output()
        assert registry.requests == ["/schemas/ids/7"], "no request got through without trust"
    finally:
        registry.close()
