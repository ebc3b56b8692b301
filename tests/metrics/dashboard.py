"""The Grafana dashboard and the Prometheus config of deploy/, read as their tests need them:
every query of every panel, parsed as PromQL, and the metric names each one reads."""

import json
import subprocess
from pathlib import Path

import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "mergestream.json").read_text())
PROMETHEUS = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
# Grafana's own variables, given a value PromQL accepts before the query is parsed.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def panels():
    """Every panel that queries (rows hold none), nested ones included."""
    def walk(items):
        for panel in items:
            if panel.get("type") == "row":
                yield from walk(panel.get("panels", []))
            else:
                yield panel
    return list(walk(DASHBOARD["panels"]))


def parse(expr):
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return promql_parser.parse(expr)


def selected_names(node):
    """The metric names a parsed PromQL expression selects."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        return {node.name} if node.name else set()
    names = set()
    for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (int, float, str)):
            names |= selected_names(child)
    for arg in getattr(node, "args", None) or []:
        names |= selected_names(arg)
    return names


def exported_name(series, metrics):
    """The name in `metrics` (a catalogue) of a series a query reads: a histogram is read
    through its `_bucket`, `_sum` and `_count` series. None when no metric has it."""
    if series in metrics:
        return series
    for suffix in HISTOGRAM_SERIES:
        base = series.removesuffix(suffix)
        if base != series and metrics.get(base, ("",))[0] == "histogram":
            return base
    return None


def catalogue(binary_path):
    """`binary metrics` as {name: (kind, labels)}."""
    out = subprocess.run([str(binary_path), "metrics"], check=True, capture_output=True, text=True).stdout
    metrics = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`mergestream_"):
            labels = {label.strip("`") for label in cells[3].split(", ") if label}
            metrics[cells[0].strip("`")] = (cells[1], labels)
    return metrics
