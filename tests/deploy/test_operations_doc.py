"""docs/operations.md names only metrics, labels and label values that Berth really exports."""

from __future__ import annotations

import re

from prometheus_client.metrics import MetricWrapperBase

import app.metrics
from tests.deploy.release import REPO

DOC = (REPO / "docs" / "operations.md").read_text()
APP_SOURCE = "\n".join(p.read_text() for p in (REPO / "app").rglob("*.py"))
#: Names in the doc that look like metrics but are not (the wakeup channel).
NOT_METRICS = {"berth_wakeup"}


def exported() -> dict[str, tuple[str, ...]]:
    """Return Berth's metrics, by name without the _total suffix, with their label names."""
    return {
        metric._name: tuple(metric._labelnames)
        for metric in vars(app.metrics).values()
        if isinstance(metric, MetricWrapperBase)
    }


def test_every_metric_the_runbook_names_is_exported() -> None:
    metrics = exported()
    named = set(re.findall(r"\b(berth_[a-z_]*[a-z])\b", DOC)) - NOT_METRICS
    assert len(named) >= 10
    for name in named:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert base in metrics, f"docs/operations.md names {name}, which Berth does not export"


def test_every_metric_label_and_value_in_the_runbook_exists() -> None:
    metrics = exported()
    uses = re.findall(r"\b(berth_[a-z_]*[a-z])\{([^}]*)\}", DOC)
    assert len(uses) >= 10
    for name, selector in uses:
        labels = metrics[re.sub(r"_(total|bucket|sum|count)$", "", name)]
        for part in filter(None, (p.strip() for p in selector.split(","))):
            label, _, value = part.partition("=")
            assert label.strip() in labels, f"{name} has no label {label}"
            if value:
                literal = value.strip().strip('"')
                assert f'"{literal}"' in APP_SOURCE, f"{name}{{{part}}}: no such value in app/"


def test_every_metric_berth_exports_is_in_the_runbook() -> None:
    for name in exported():
        assert name in DOC, f"docs/operations.md does not say what {name} tells"


def test_the_failover_settings_are_the_ones_the_drill_runs_with() -> None:
    from tests.drill.test_failover import KEEPER_SETTINGS, MONITOR_SETTINGS

    rows = {line.split("|")[1].strip().split(" ")[0].strip("`"): line.split("|")[3].strip()
            for line in DOC.splitlines()
            if line.startswith(("| `pgautofailover.", "| `timeout."))}
    assert rows == {**{name: f"{value} ms" for name, value in MONITOR_SETTINGS.items()},
                    **{name: f"{value} s" for name, value in KEEPER_SETTINGS.items()}}
