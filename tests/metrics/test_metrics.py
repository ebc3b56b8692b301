"""The metrics as documented and as the dashboard reads them: docs/metrics.md is what the
binaries print, every metric is recorded through its crate's catalogue, and every query of
the Grafana dashboard parses and reads only metrics some binary exports, with the labels it
has. That the services really export them is tests/compose/'s end-to-end check."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingestor"))

from dashboard import DASHBOARD, PROMETHEUS, ROOT, catalogue, exported_name, panels, parse, selected_names  # noqa: E402
from ingest_services import INGESTOR_BIN, STORAGE_BIN  # noqa: E402
from services import COORDINATOR_BIN  # noqa: E402

BINARIES = {"coordinator": COORDINATOR_BIN, "storage-node": STORAGE_BIN, "ingestor": INGESTOR_BIN}
# What a dashboard for this system must show (the list), as the metric showing it.
MUST_SHOW = {
    "ingest rate": "mergestream_ingestor_rows_total",
    "lag": "mergestream_ingestor_consumer_lag_messages",
    "parts per partition": "mergestream_engine_max_parts_in_partition",
    "merge throughput": "mergestream_engine_merged_rows_total",
    "insert latency": "mergestream_storage_insert_duration_seconds",
    "query latency": "mergestream_storage_query_duration_seconds",
    "coordinator commit latency": "mergestream_coordinator_commit_duration_seconds",
    "coordinator sessions": "mergestream_coordinator_sessions",
}


@pytest.fixture(scope="module")
def exported():
    return {binary: catalogue(path) for binary, path in BINARIES.items()}


def everything(exported):
    return {name: kind for metrics in exported.values() for name, kind in metrics.items()}


def test_the_documentation_is_what_the_binaries_print():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "metrics-doc"), "--check", "--bin-dir",
                          str(STORAGE_BIN.parent)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_metric_is_recorded_through_its_catalogue():
    # A literal name at a call site would bypass the list (and its documentation and naming test).
    literal = re.compile(r'metrics::(counter|gauge|histogram)!\(\s*"')
    offenders = [f"{path.relative_to(ROOT)}:{number}"
                 for path in ROOT.glob("*/**/src/**/*.rs") if "target" not in path.parts
                 for number, line in enumerate(path.read_text().splitlines(), 1) if literal.search(line)]
    assert offenders == [], f"metric names written at call sites instead of in metrics.rs: {offenders}"


def test_every_dashboard_query_parses_and_reads_exported_metrics(exported):
    metrics = everything(exported)
    assert panels(), "the dashboard has no panels"
    for panel in panels():
        assert panel["targets"], f"panel {panel['title']!r} queries nothing"
        for target in panel["targets"]:
            expr = target["expr"]
            try:
                tree = parse(expr)
            except ValueError as e:
                pytest.fail(f"panel {panel['title']!r}: {expr}: {e}")
            names = selected_names(tree)
            assert names, f"panel {panel['title']!r}: {expr} reads no metric"
            for series in names:
                assert exported_name(series, metrics), f"panel {panel['title']!r}: no binary exports {series}"
            # A `by (label)` on a label the metric does not have is an empty legend, not an error.
            for label in re.findall(r"by \(([^)]*)\)", expr):
                for name in label.replace(" ", "").split(","):
                    if name in ("le", ""):
                        continue
                    assert any(name in metrics[exported_name(s, metrics)][1] for s in names), \
                        f"panel {panel['title']!r}: {expr}: no metric it reads has the label {name}"


def test_the_dashboard_shows_what_an_operator_needs(exported):
    read = {exported_name(s, everything(exported)) for p in panels() for t in p["targets"]
            for s in selected_names(parse(t["expr"]))}
    missing = {what: metric for what, metric in MUST_SHOW.items() if metric not in read}
    assert missing == {}, f"the dashboard does not show {missing}"


def test_panels_use_the_provisioned_datasource_and_do_not_overlap():
    provisioned = yaml.safe_load((ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
                                 .read_text())
    uids = {d["uid"] for d in provisioned["datasources"]}
    assert len({p["id"] for p in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])
    taken = set()
    for panel in DASHBOARD["panels"]:
        if panel.get("type") != "row":
            assert panel["datasource"]["uid"] in uids, panel["title"]
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_prometheus_scrapes_each_service_where_compose_serves_its_metrics():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    serving = {}
    for name, service in compose["services"].items():
        found = re.search(r"--metrics-addr 0\.0\.0\.0:(\d+)", service.get("command", ""))
        if found:
            serving[f"{name}:{found.group(1)}"] = name
    scraped = {target for job in PROMETHEUS["scrape_configs"] for c in job["static_configs"] for target in c["targets"]}
    assert scraped == set(serving), (scraped, serving)
    prometheus = compose["services"]["prometheus"]
    assert any(v.startswith("./deploy/prometheus/prometheus.yml:") for v in prometheus["volumes"])
    grafana = compose["services"]["grafana"]
    assert {v.split(":")[0] for v in grafana["volumes"]} == {"./deploy/grafana/provisioning", "./deploy/grafana/dashboards"}
    for volume in prometheus["volumes"] + grafana["volumes"]:
        assert (ROOT / volume.split(":")[0]).exists(), volume
