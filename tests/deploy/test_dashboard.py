"""The Grafana dashboard: valid against Grafana's dashboard schema, its queries valid Prometheus
queries, every metric they read exported by a running Berth, and no label that names a tenant,
task or pool; the Helm chart ships the same file for the Grafana sidecar."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.live import live_server
from tests.deploy.release import CHART, REPO, SCHEMAS

DASHBOARD = REPO / "deploy" / "grafana" / "berth.json"

#: PromQL words that are not metric names: functions, aggregations and keywords.
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "rate", "irate", "increase",
    "histogram_quantile", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "offset", "bool", "clamp_min", "clamp_max", "abs", "vector",
}
#: Labels no Berth metric may be grouped or filtered by (their values are unbounded).
UNBOUNDED_LABELS = {"tenant", "tenant_id", "task", "task_id", "pool", "pool_id", "label"}
#: The quota metrics: the only ones with a tenant label (tenants with quotas are set by an
#: admin, a bounded set).
QUOTA_PREFIX = "berth_quota_"
QUOTA_METRICS = {"berth_quota_nominal", "berth_quota_used", "berth_quota_borrowed"}
QUOTA_LABELS = {"tenant"}


@cache
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def targets() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """Return the metric names a PromQL expression reads."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    bare = re.sub(r"\{[^}]*\}", " ", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", " ", bare)  # range selectors
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)  # grouping labels
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare):
        word = match.group(0)
        following = bare[match.end():].lstrip()[:1]
        if word in PROMQL_WORDS or following == "(" or word.startswith("__"):
            continue
        names.add(word)
    return names


def labels_used(expr: str) -> set[str]:
    """Return the label names an expression groups or filters by."""
    used = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        used |= {name.strip() for name in group.split(",") if name.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        used |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return used


def samples_exposed(text: str) -> set[str]:
    """Return every sample name the exposition's metric families can have, observed or not."""
    names = set()
    for family in text_string_to_metric_families(text):
        base = family.name
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names |= {f"{base}_total", f"{base}_created"}
        elif family.type == "histogram":
            names |= {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
        elif family.type == "summary":
            names |= {base, f"{base}_sum", f"{base}_count"}
        else:
            names.add(base)
    return names


def test_the_dashboard_is_valid_against_grafanas_dashboard_schema() -> None:
    schema = json.loads((SCHEMAS / "grafana-dashboard.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(dashboard())]
    assert not errors, errors


def test_every_query_is_a_valid_prometheus_query_of_the_chosen_datasource() -> None:
    schema = json.loads((SCHEMAS / "grafana-prometheus-query.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    variables = {v["name"] for v in dashboard()["templating"]["list"]}
    assert "datasource" in variables
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            errors = [e.message for e in validator.iter_errors(target)]
            assert not errors, (panel["title"], errors)
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    "topic",
    ["Placement rate", "Queue wait", "Pending by reason", "Pool utilization",
     "Reservation conflicts", "Preemptions", "API requests", "API errors", "Database 503s",
     "Quota usage", "Quota borrowed", "Quota waits", "Reclaims", "Nominations"],
)
def test_the_dashboard_shows(topic: str) -> None:
    assert topic in {p["title"] for p in dashboard()["panels"]}


def test_the_metric_name_parser_reads_what_grafana_sends() -> None:
    expr = ('sum by (le) (rate(berth_queue_wait_seconds_bucket{job="x"}[$__rate_interval])) '
            '/ max by (resource, status) (berth_pool_capacity) > 0')
    assert metric_names(expr) == {"berth_queue_wait_seconds_bucket", "berth_pool_capacity"}
    assert labels_used(expr) == {"le", "job", "resource", "status"}


@cache
def exposed_by_a_running_berth(database_url: str) -> frozenset[str]:
    with live_server(database_url) as base_url:
        metrics = httpx.get(f"{base_url}/metrics", timeout=30)
    assert metrics.status_code == 200
    return frozenset(samples_exposed(metrics.text))


def test_every_metric_the_dashboard_reads_is_served_by_a_running_berth(
    database_url: str,
) -> None:
    exposed = exposed_by_a_running_berth(database_url)
    used = {name for _, expr in targets() for name in metric_names(expr)}
    used -= {name for name in used if name.startswith(QUOTA_PREFIX)}
    assert len(used) >= 15, used
    missing = sorted(used - exposed)
    assert not missing, f"the dashboard reads metrics Berth does not export: {missing}"


def test_the_quota_panels_read_the_quota_metrics_berth_serves(database_url: str) -> None:
    exposed = exposed_by_a_running_berth(database_url)
    used = {name for _, expr in targets() for name in metric_names(expr)
            if name.startswith(QUOTA_PREFIX)}
    assert used == {"berth_quota_nominal", "berth_quota_used", "berth_quota_borrowed"}
    if not any(name.startswith(QUOTA_PREFIX) for name in exposed):
        pytest.skip("this build exports no quota metrics (quotas are not in it)")
    missing = sorted(used - exposed)
    assert not missing, f"the quota panels read metrics Berth does not export: {missing}"


def test_the_reclaims_panel_reads_metrics_berth_serves(database_url: str) -> None:
    exposed = exposed_by_a_running_berth(database_url)
    (panel,) = [p for p in dashboard()["panels"] if p["title"] == "Reclaims"]
    used = {name for t in panel["targets"] for name in metric_names(t["expr"])}
    assert used == {"berth_reclaims_total", "berth_reclaim_victims_total"}
    missing = sorted(used - exposed)
    assert not missing, f"the reclaims panel reads metrics Berth does not export: {missing}"


def test_no_query_groups_or_filters_by_an_unbounded_label() -> None:
    for title, expr in targets():
        allowed = QUOTA_LABELS if metric_names(expr) <= QUOTA_METRICS else set()
        assert not (labels_used(expr) & UNBOUNDED_LABELS) - allowed, (title, expr)


def test_the_chart_ships_the_same_dashboard() -> None:
    shipped = CHART / "dashboards" / "berth.json"
    assert DASHBOARD.resolve() == shipped.resolve() or (
        DASHBOARD.read_bytes() == shipped.read_bytes()
    )
