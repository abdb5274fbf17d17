"""The Helm chart in deploy/helm/berth, rendered offline, and the schemas its manifests obey.

Helm runs in-process through ``helm-python-sdk`` (Helm v4's Go SDK as a native library), so
neither a ``helm`` binary nor a cluster is needed. Core Kubernetes kinds are validated with
the schemas ``kubernetes-validate`` ships (offline), the Prometheus Operator's kinds with the
CRD schemas in ``schemas/``.
"""

from __future__ import annotations

import copy
import json
import platform
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "berth"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

#: Kubernetes versions every manifest is validated against: the floor of the chart's
#: kubeVersion and the newest one whose schemas the pinned kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.29", "1.37")

#: Platforms helm-python-sdk publishes a native library for (pyproject.toml's marker).
HELM_PLATFORMS = {
    ("linux", "x86_64"),
    ("linux", "aarch64"),
    ("darwin", "arm64"),
    ("win32", "amd64"),
}

#: Prometheus Operator kinds and the CRD schema each is validated with.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.json",
}

Manifest = dict[str, Any]


def helm() -> ModuleType:
    """Return the ``helm_python`` module, or skip when its native library cannot load here."""
    where = (sys.platform, platform.machine().lower())
    try:
        import helm_python
    except ImportError as exc:
        if where in HELM_PLATFORMS:
            raise AssertionError(
                f"helm-python-sdk is missing ({exc}): pip install -e '.[dev]'"
            ) from exc
        pytest.skip(f"helm-python-sdk publishes no native Helm library for {where}")
    except Exception as exc:  # HelmLibraryError: the library is there but does not load
        if type(exc).__name__ != "HelmLibraryError":
            raise
        pytest.skip(f"Helm's native library does not load on {where}: {exc}")
    return helm_python


@dataclass(frozen=True)
class Release:
    """The manifests (and NOTES.txt) of one offline render of the chart."""

    values: dict[str, Any]
    manifests: list[Manifest]
    notes: str

    def kinds(self) -> list[str]:
        """Return the kind of every manifest, sorted."""
        return sorted(m["kind"] for m in self.manifests)

    def all(self, kind: str) -> list[Manifest]:
        """Return the manifests of ``kind``."""
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, component: str) -> Manifest:
        """Return the single manifest of ``kind`` labelled with ``component``."""
        found = [m for m in self.all(kind) if component_of(m) == component]
        assert len(found) == 1, (kind, component, [m["metadata"]["name"] for m in found])
        return found[0]

    def pod_specs(self) -> list[tuple[Manifest, dict[str, Any]]]:
        """Return (workload, pod template) of every Deployment and Job."""
        return [
            (m, m["spec"]["template"])
            for m in self.manifests
            if m["kind"] in {"Deployment", "Job", "StatefulSet", "DaemonSet"}
        ]


def component_of(manifest: Manifest) -> str | None:
    """Return the ``app.kubernetes.io/component`` label of a manifest."""
    return manifest["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def release_render(
    values: dict[str, Any] | None = None, *, name: str = "berth", namespace: str = "berth"
) -> Release:
    """Render the chart as `helm install` would (schema-checked values) and parse it."""
    helm_python = helm()
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    manifests: list[Manifest] = []
    notes = ""
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                assert isinstance(doc, dict), (path, doc)
                manifests.append(doc)
    return Release(values=values or {}, manifests=manifests, notes=notes)


def values_merged(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the chart's default values with ``values`` over them, as Helm coalesces them."""
    with helm().Chart.load(CHART) as chart:
        return chart.merge_values(values or {})


def chart_lint(values: dict[str, Any] | None = None) -> list[str]:
    """Return the findings of `helm lint --strict` that are warnings or errors."""
    helm_python = helm()
    report = helm_python.lint(CHART, values, strict=True, kube_version="v1.29.0")
    assert report["total_charts_linted"] == 1, report
    findings = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return findings + list(report["errors"])


@cache
def _crd_schema(filename: str) -> dict[str, Any]:
    return schema_strict(json.loads((SCHEMAS / filename).read_text()))


def schema_strict(schema: Any) -> Any:
    """Return ``schema`` with unknown fields refused wherever its objects list their fields.

    A CRD schema leaves unknown fields to the API server, which prunes them or (with field
    validation, kubectl's default) refuses them; either way a typo in the chart would be
    silently lost, so the tests refuse it.
    """
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def manifest_validate(manifest: Manifest, kubernetes_version: str) -> None:
    """Raise a jsonschema ValidationError unless ``manifest`` is a valid object of its kind."""
    crd = CRD_SCHEMAS.get((manifest["apiVersion"], manifest["kind"]))
    if crd is not None:
        jsonschema.Draft202012Validator(_crd_schema(crd)).validate(manifest)
        return
    import kubernetes_validate

    _kubernetes_schemas_cache()
    kubernetes_validate.validate(manifest, kubernetes_version, strict=True)


@cache
def _kubernetes_schemas_cache() -> None:
    """Make kubernetes-validate parse each schema file once instead of on every call.

    It reads the 1 MB ``_definitions.json`` of a version for every manifest (30 ms each);
    caching the parsed files keeps the chart tests at a few seconds. Should the library stop
    reading through ``schema_contents``, validation stays the same, only slower.
    """
    from kubernetes_validate import utils

    utils.schema_contents = cache(utils.schema_contents)
