"""`ingestor run --config FILE`: a pipeline run set up from a TOML file alone, an unknown key
refused with its file:line:column before anything connects, and the example file accepted;
a pipeline's `${MERGESTREAM_…}` values (its secrets) read from the environment."""

import subprocess

from ingest_services import INGESTOR_BIN, Ingestor, Process, check, table_state, wait_for_rows
from test_kafka import PARTITIONS, messages, write_pipeline


def test_a_run_configured_by_file_alone_ingests_every_message(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, PARTITIONS)
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "configured")
    config = tmp_path / "run.toml"
    config.write_text(f'pipeline = "{pipeline}"\n'
                      f'storage_nodes = ["{storage.addr}"]\n'
                      f'coordinator = "{keeper.hosts}"\n'
                      'instance = "from-file"\n'
                      "session_timeout_ms = 3000\n")
    ingestor = Process("ingestor", [str(INGESTOR_BIN), "run", "--config", str(config)], tmp_path).start()
    try:
        broker.produce(topic, messages(range(500)))
        wait_for_rows(storage, "configured", 500)
        assert table_state(storage, "configured") == (500, 500, sum(i * 3 for i in range(500)))
        assert 'instance="from-file"' in ingestor.output()
    finally:
        ingestor.kill()


def test_pipeline_values_come_from_merge_stream_variables(tmp_path, broker, keeper, storage, topic):
    broker.create_topic(topic, PARTITIONS)
    pipeline = write_pipeline(tmp_path / "p.yaml", broker, topic, "from_env")
    text = pipeline.read_text()
    assert f"    brokers: {broker.brokers}\n" in text
    pipeline.write_text(text.replace(f"    brokers: {broker.brokers}\n", "    brokers: ${MERGESTREAM_TEST_BROKERS}\n"))

    code, out = check(pipeline)
    assert code != 0
    assert f"{pipeline}:4:14: `${{MERGESTREAM_TEST_BROKERS}}`: the environment variable MERGESTREAM_TEST_BROKERS " \
        "is not set" in out, out

    ingestor = Ingestor(tmp_path, pipeline, storage, keeper.hosts)
    ingestor.env = {"MERGESTREAM_TEST_BROKERS": broker.brokers}
    ingestor.start()
    try:
        broker.produce(topic, messages(range(200)))
        wait_for_rows(storage, "from_env", 200)
    finally:
        ingestor.kill()


def run(args):
    return subprocess.run([str(INGESTOR_BIN), *args], capture_output=True, text=True, timeout=30)


def test_an_unknown_key_is_refused_with_its_place(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('pipeline = "p.yaml"\n\nstorage_node = "127.0.0.1:1"\n')
    out = run(["run", "--config", str(config)])
    assert out.returncode != 0
    assert f"{config}:3:1: unknown field `storage_node`" in out.stderr, out.stderr


def test_config_example_prints_a_file_run_accepts(tmp_path):
    example = run(["config-example"])
    assert example.returncode == 0 and "# session_timeout_ms = 6000" in example.stdout
    config = tmp_path / "run.toml"
    config.write_text(example.stdout)
    out = run(["run", "--config", str(config)])
    assert out.returncode != 0 and "no pipeline: give --pipeline" in out.stderr, out.stderr
