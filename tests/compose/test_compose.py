"""compose.yaml, validated against the Compose Specification's JSON schema (fetched by
scripts/install-compose-schema) with every image pinned to a version, and run without
Docker: each mergestream service's own command line, with the binaries the test script
built, the service host names and ports mapped to free loopback ports and the volumes to
directories; the `kafka` service is the Tansu broker the other
ingestor tests use. Orders produced to the `orders` topic must reach the table through the
pipeline the ingestor service runs. What this cannot check is the image build itself: no
Docker engine runs on the machines this project is tested on."""

import json
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "ingestor"))
sys.path.insert(0, str(ROOT / "tests" / "metrics"))

from ingest_services import (  # noqa: E402
    INGESTOR_BIN, STORAGE_BIN, Process, Tansu, free_port, port_open, wait_until,
)
from services import COORDINATOR_BIN  # noqa: E402
from dashboard import PROMETHEUS, catalogue, exported_name, panels, parse, selected_names  # noqa: E402

BINARIES = {"coordinator": COORDINATOR_BIN, "storage-node": STORAGE_BIN, "ingestor": INGESTOR_BIN}
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
OURS = {name: s for name, s in COMPOSE["services"].items() if s.get("image") == "mergestream:local"}
ADDRESS = re.compile(r"\b([A-Za-z0-9.-]+):(\d+)\b")
# Dashboard metrics this run cannot produce, and why; every other one must be scraped.
NOT_IN_THIS_RUN = {
    "mergestream_ingestor_decode_errors_total": "every message sent is good",
    "mergestream_replication_queue_entries": "the table of pipelines/orders-compose.yaml is not replicated",
}


def start_order(services):
    """Services after those they depend on (the ones outside `services` are started already)."""
    done = []
    for _ in services:
        for name, service in services.items():
            if name not in done and all(d in done or d not in services for d in service.get("depends_on", [])):
                done.append(name)
    assert len(done) == len(services), f"a depends_on cycle among {sorted(services)}"
    return done


def test_compose_yaml_follows_the_compose_specification():
    import jsonschema

    schema_path = subprocess.run([sys.executable, str(ROOT / "scripts" / "install-compose-schema")], check=True,
                                 capture_output=True, text=True, timeout=120).stdout.strip()
    schema = json.loads(Path(schema_path).read_text())
    errors = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
              for e in jsonschema.Draft201909Validator(schema).iter_errors(COMPOSE)]
    assert errors == [], errors


def test_every_image_is_pinned_to_a_version():
    for name, service in COMPOSE["services"].items():
        image = service["image"]
        if image == "mergestream:local":
            continue  # built from this repository (the Dockerfile's bases are checked below)
        repository, _, tag = image.rpartition(":")
        assert repository and re.fullmatch(r"v?\d+(\.\d+)+", tag), f"{name}: {image} is not pinned to a version"
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            image = line.split()[1]
            assert re.search(r":v?\d+\.\d+", image), f"Dockerfile: {line} is not pinned to a version"


def test_every_published_port_is_one_the_service_listens_on():
    for name, service in OURS.items():
        listening = {int(port) for host, port in ADDRESS.findall(service["command"]) if host == "0.0.0.0"}
        published = {int(p.split(":")[1]) for p in service.get("ports", [])}
        assert published <= listening, (name, published, listening)


def test_the_services_commands_ingest_orders_end_to_end(tmp_path):
    ports = {}  # a port of the compose network → a free loopback port

    def local(text):
        def swap(match):
            host, port = match.groups()
            if host != "0.0.0.0" and host not in COMPOSE["services"]:
                return match.group(0)
            return f"127.0.0.1:{ports.setdefault(int(port), free_port())}"
        text = ADDRESS.sub(swap, text)
        return text.replace("/pipelines/", f"{tmp_path}/pipelines/")

    kafka_port = int(re.search(r"INTERNAL://kafka:(\d+)", COMPOSE["services"]["kafka"]["environment"]
                               ["KAFKA_ADVERTISED_LISTENERS"]).group(1))
    ports[kafka_port] = free_port()
    (tmp_path / "pipelines").mkdir()
    for pipeline in (ROOT / "pipelines").glob("*.yaml"):
        (tmp_path / "pipelines" / pipeline.name).write_text(local(pipeline.read_text()))

    broker = Tansu(tmp_path / "kafka", port=ports[kafka_port])
    processes = [broker]
    try:
        broker.create_topic("orders", int(COMPOSE["services"]["kafka"]["environment"]["KAFKA_NUM_PARTITIONS"]))
        for name in start_order(OURS):
            service = OURS[name]
            command = shlex.split(local(service["command"]))
            command[0] = str(BINARIES[command[0]])
            for volume in service.get("volumes", []):
                source, target = volume.split(":")
                (tmp_path / source).mkdir(exist_ok=True)
                command = [str(tmp_path / source) if arg == target else arg for arg in command]
            process = Process(name, command, tmp_path).start()
            processes.append(process)
            for port in service.get("ports", []):
                inside = int(port.split(":")[1])
                wait_until(lambda: port_open(ports[inside]) or not process.alive(), 60, f"{name} on {inside}")
                assert process.alive(), process.output()

        orders = [(i % 4, str(i).encode(), json.dumps({"order_id": i, "customer": {"name": f"c{i}"}, "amount": i / 2,
                                                      "status": "paid", "version": 1}).encode(), None)
                  for i in range(500)]
        broker.produce("orders", orders)
        storage_addr = f"127.0.0.1:{ports[9100]}"

        def count():
            out = subprocess.run([str(STORAGE_BIN), "client", "--addr", storage_addr, "--query",
                                  "SELECT count(), sum(amount) FROM orders FINAL"], capture_output=True, text=True,
                                 timeout=30)
            return out.stdout.split() if out.returncode == 0 else None
        wait_until(lambda: count() == ["500", "62375"], 120, "500 orders")
        subprocess.run([str(STORAGE_BIN), "client", "--addr", storage_addr, "--query", "OPTIMIZE TABLE orders FINAL"],
                       check=True, timeout=60)
        check_the_dashboards_metrics_are_scraped(lambda host, port: f"127.0.0.1:{ports[port]}")
    finally:
        for process in reversed(processes):
            process.kill()



def check_the_dashboards_metrics_are_scraped(address_of):
    """Every metric the Grafana dashboard reads is in the scrape of the service that exports it,
    at the target deploy/prometheus/prometheus.yml names (`address_of` maps it to loopback)."""
    exports = {service: catalogue(BINARIES[service]) for service in BINARIES}
    targets = {job["job_name"]: target for job in PROMETHEUS["scrape_configs"]
               for c in job["static_configs"] for target in c["targets"]}
    wanted = {}  # service → the series names the dashboard reads from it
    for panel in panels():
        for t in panel["targets"]:
            for series in selected_names(parse(t["expr"])):
                for service, metrics in exports.items():
                    name = exported_name(series, metrics)
                    if name and name not in NOT_IN_THIS_RUN:
                        wanted.setdefault(service, set()).add(series)
    assert set(wanted) == set(targets), (set(wanted), set(targets))

    def missing(service):
        host, port = targets[service].split(":")
        with urllib.request.urlopen(f"http://{address_of(host, int(port))}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        scraped = {re.split(r"[{ ]", line, 1)[0] for line in text.splitlines() if line and not line.startswith("#")}
        return wanted[service] - scraped
    for service in wanted:
        # The part gauges are published every 5 s, the coordinator's every second.
        try:
            wait_until(lambda: not missing(service), 30, f"{service}'s metrics")
        except TimeoutError:
            raise AssertionError(f"{service} does not export {sorted(missing(service))}") from None
