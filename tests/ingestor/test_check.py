"""`ingestor check`: every problem of a pipeline file, each at file:line:column."""

from pathlib import Path

from ingest_services import check

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_pipelines_are_valid():
    examples = sorted((ROOT / "pipelines").glob("*.yaml"))
    assert examples
    for example in examples:
        code, out = check(example)
        assert code == 0, out
        assert out.startswith(f"{example}: ok"), out


def test_every_problem_is_reported_where_it_is(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("""name: orders
source:
  kafka:
    brokers: 127.0.0.1:9092
    topic: [orders]
format: xml
tables:
  - ddl: |
      CREATE TABLE orders (id UInt64, v Float64)
      ENGINE = ReplacingMergeTree(v, v) ORDER BY id
    columns:
      id: id
  - ddl: CREATE TABLE other (id UInt64) ENGINE = MergeTree ORDER BY id
    columns:
      id: { field: id, convert: to_uppercase }
      nope: { key: true }
batch: { max_rows: -5 }
errors: { mode: dead_letter }
retries: 3
""")
    code, out = check(path)
    assert code == 1
    lines = out.strip().splitlines()
    expected = [
        f"{path}:4:5: source.kafka: missing required key `topics`",
        f"{path}:5:5: source.kafka: unknown key `topic`; expected one of: brokers, topics, group_id, properties",
        f"{path}:6:9: format: unknown format `xml`; expected json, avro or avro-confluent",
        f"{path}:9:7: tables[].ddl: ",
        f"{path}:15:33: tables[].columns.id: unknown conversion `to_uppercase`",
        f"{path}:16:7: tables[].columns: `nope` is not a column of other; its columns are id",
        f"{path}:17:20: batch.max_rows: expected a positive whole number",
        f"{path}:18:17: errors: mode dead_letter needs `dead_letter_topic`",
        f"{path}:19:1: pipeline: unknown key `retries`",
    ]
    assert len(lines) == len(expected), out
    for line, prefix in zip(lines, expected):
        assert line.startswith(prefix), (line, prefix)
    assert "same column" in lines[3].lower() or "version" in lines[3].lower(), lines[3]


def test_not_yaml_and_a_missing_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [x\n")
    code, out = check(path)
    assert code == 1 and out.startswith(f"{path}:") and "not valid YAML" in out, out
    code, out = check(tmp_path / "absent.yaml")
    assert code == 1 and "cannot read" in out and "absent.yaml" in out, out


def test_avro_schemas_and_the_fields_mapped_from_them(tmp_path):
    (tmp_path / "broken.avsc").write_text('{"type": "record", "name": "x"}')
    path = tmp_path / "avro.yaml"
    path.write_text(f"""name: orders
source: {{ kafka: {{ brokers: b, topics: [t] }} }}
format:
  avro: {{ schema: {ROOT / "schemas" / "avro" / "orders.avsc"} }}
tables:
  - ddl: CREATE TABLE o (id UInt64, who String, city String) ENGINE = MergeTree ORDER BY id
    columns:
      id: order_id
      who: customer.name
      city: customer.address.city
""")
    code, out = check(path)
    assert (code, out.strip()) == (1, f"{path}:10:13: tables[].columns.city: the Avro record mergestream.sample.Customer "
                                      "has no field `address`; its fields are name"), out
    path.write_text(path.read_text().replace(str(ROOT / "schemas" / "avro" / "orders.avsc"), "broken.avsc"))
    code, out = check(path)
    assert code == 1 and out.strip() == (f"{path}:4:19: format.avro.schema: {tmp_path / 'broken.avsc'} is not an Avro "
                                        "schema: No `fields` in record"), out
