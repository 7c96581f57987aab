"""The metrics reference and the Grafana dashboard against the metric definitions: the committed
docs/reference/metrics.md is what the generator writes, every gpufed metric of every module is in
it, and the dashboard's PromQL names only metrics that exist and shows every one of them."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpufed import PACKAGES
from gpufed.devtools import metricsdoc
from tests.paths import REPO

REFERENCE = REPO / metricsdoc.DEFAULT_PATH
DASHBOARD = REPO / "deploy" / "grafana" / "gpufed-dashboard.json"
REGENERATE = "run `.venv/bin/python -m gpufed.devtools.metricsdoc` (writes docs/reference/metrics.md)"
NAME = re.compile(r"\bgpufed_[a-z_]+\b")


def test_the_committed_reference_is_what_the_generator_writes() -> None:
    assert REFERENCE.exists(), f"{REFERENCE.relative_to(REPO)} is missing: {REGENERATE}"
    assert REFERENCE.read_text() == metricsdoc.render(), f"the metrics reference drifted from the code: {REGENERATE}"


def test_every_gpufed_metric_of_every_module_is_in_the_reference() -> None:
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    registered = {f.name for f in REGISTRY.collect() if f.name.startswith("gpufed_")}
    documented = {m.name.removesuffix("_total") for m in metricsdoc.families()}
    assert registered - documented == set(), (
        "metrics defined in a module metricsdoc.INSTRUMENTED does not list: add the module there, then " + REGENERATE
    )
    assert documented <= registered


def test_the_reference_describes_each_metric() -> None:
    families = metricsdoc.families()
    assert len(families) >= 20
    for m in families:
        assert m.help.strip() and m.component, m.name
        assert m.name.startswith("gpufed_")
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        assert not {"pod", "uid", "name", "namespace"} & set(m.labels), f"{m.name}: a high-cardinality label"


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])  # collapsed rows hold their panels
    return out


def _expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query, templating variables included."""
    out = [(p["title"], t["expr"]) for p in _panels(dashboard) for t in p.get("targets") or []]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if var.get("type") == "query":
            out.append((f"variable {var['name']}", query if isinstance(query, str) else query.get("query", "")))
    return out


def test_the_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus() -> None:
    d = _dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    (source,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    assert (source["name"], source["query"]) == ("datasource", "prometheus")
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in _panels(d):
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys(), p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["refId"] and t["expr"].strip(), p["title"]


def test_every_dashboard_query_names_existing_metrics_and_every_metric_has_a_panel() -> None:
    families = metricsdoc.families()
    sample_names = {s: m for m in families for s in m.samples}
    shown: set[str] = set()
    for title, expr in _expressions(_dashboard()):
        names = NAME.findall(expr)
        assert names, f"{title}: {expr!r} queries no gpufed metric"
        for name in names:
            assert name in sample_names, f"{title}: {name} is not a metric (see docs/reference/metrics.md)"
            family = sample_names[name]
            shown.add(family.name)
            if name.endswith("_bucket"):
                assert re.search(rf"histogram_quantile\([0-9.]+, sum by \([^)]*\ble\b[^)]*\) \(rate\({name}\[", expr), (
                    f"{title}: a histogram's buckets are read with histogram_quantile over sum by (le) of a rate"
                )
            if family.type == "counter":
                assert re.search(rf"\b(rate|increase)\({name}\b", expr), f"{title}: a counter is read through rate()"
    missing = {m.name for m in families} - shown
    assert not missing, f"metrics without a panel in {DASHBOARD.relative_to(REPO)}: {sorted(missing)}"


@pytest.mark.parametrize("name", ["gpufed_workqueue_latency_seconds_bucket", "gpufed_workqueue_retries_total"])
def test_sample_names_map_to_their_family(name: str) -> None:
    assert any(name in m.samples for m in metricsdoc.families())
