"""The Helm chart: rendered with realistic values, linted strictly, every manifest validated.

Each value set is what an operator would really pass; the assertions are the properties a
broken chart would lose: probes on the real health routes, migrations as a hook before any
Deployment, no Service for reconcilers, the database URL only from its Secret, locked-down
pods, and Prometheus Operator objects only when asked for.
"""

from __future__ import annotations

import json
import socket
from functools import cache
from typing import Any

import jsonschema
import pytest
import yaml

from app.config import Settings
from tests.deploy.release import (
    CHART,
    KUBERNETES_VERSIONS,
    Manifest,
    Release,
    chart_lint,
    component_of,
    helm,
    manifest_validate,
    release_render,
    values_merged,
)

RESOURCES = {
    "requests": {"cpu": "500m", "memory": "384Mi"},
    "limits": {"cpu": "2", "memory": "1Gi"},
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    # A CloudNativePG cluster's application Secret keeps the URL under `uri`.
    "external-database": {
        "database": {"secretName": "berth-pg-app", "secretKey": "uri"},
        "bootstrapAdminKey": {"secretName": "berth-bootstrap", "secretKey": "admin-key"},
    },
    "three-reconcilers": {"reconciler": {"replicas": 3}},
    # verify-full against the database's CA, mounted from a Secret of TLS files.
    "database-tls": {"database": {"secretName": "berth-db", "secretKey": "BERTH_DATABASE_URL",
                                  "tlsSecretName": "berth-db-tls"}},
    "grafana-dashboard": {
        "grafanaDashboard": {"enabled": True, "labels": {"release": "kube-prometheus-stack"},
                             "annotations": {"grafana_folder": "Berth"}}
    },
    "service-monitor": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}
    },
    "ingress": {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "annotations": {"nginx.ingress.kubernetes.io/proxy-body-size": "1m"},
            "hosts": [
                {"host": "berth.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}
            ],
            "tls": [{"secretName": "berth-tls", "hosts": ["berth.example.com"]}],
        }
    },
    "resources": {
        "api": {"resources": RESOURCES},
        "reconciler": {"resources": RESOURCES},
        "migration": {"resources": RESOURCES},
    },
    "network-policy": {
        "networkPolicy": {
            "enabled": True,
            "apiFrom": [
                {"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
            ],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}],
                 "ports": [{"port": 5432, "protocol": "TCP"}]}
            ],
        }
    },
    "api-only": {"reconciler": {"enabled": False}, "api": {"reconcilerEnabled": True}},
    "production": {
        "image": {"repository": "registry.example.com/platform/berth", "tag": "0.1.0-rc1",
                  "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry-example"}],
        "database": {"secretName": "berth-pg-app", "secretKey": "uri"},
        "config": {"BERTH_POLICY": "fair", "BERTH_BATCH_SIZE": 2048, "BERTH_LOG_LEVEL": "info"},
        "api": {"replicas": 3, "resources": RESOURCES},
        "reconciler": {"replicas": 3, "resources": RESOURCES},
        "serviceMonitor": {"enabled": True},
        "ingress": {"enabled": True, "className": "nginx"},
        "networkPolicy": {"enabled": True, "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]},
        "serviceAccountName": "berth",
        "podAnnotations": {"example.com/team": "scheduling"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "berth",
                         "effect": "NoSchedule"}],
    },
}

#: The example values files shipped with the chart (deploy/helm/berth/examples), each a value
#: set of its own: every test below holds for them too.
EXAMPLES = CHART / "examples"
VALUE_SETS.update({
    f"example-{path.stem}": yaml.safe_load(path.read_text())
    for path in sorted(EXAMPLES.glob("*-values.yaml"))
})

SETS = pytest.mark.parametrize("value_set", sorted(VALUE_SETS))


@cache
def _render(value_set: str) -> Release:
    return release_render(VALUE_SETS[value_set])


def merged(value_set: str) -> dict[str, Any]:
    """Return the chart's defaults with the value set's overrides, as Helm coalesces them."""
    return values_merged(VALUE_SETS[value_set])


@cache
def app_paths() -> frozenset[str]:
    """Return the paths the Berth app really serves at its top level."""
    from app.main import create_app

    app = create_app(Settings(database_url="postgresql://berth@127.0.0.1:1/berth"))
    return frozenset(path for r in app.routes if (path := getattr(r, "path", None)))


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Return whether a matchLabels-style selector selects ``labels``."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["spec"]["containers"] + pod["spec"].get("initContainers", [])


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [e["name"] for e in container.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env in {container['name']}: {names}"
    return {e["name"]: e for e in container.get("env", [])}


# --- render, lint, validate --------------------------------------------------------------


@SETS
def test_chart_lints_strictly(value_set: str) -> None:
    assert chart_lint(VALUE_SETS[value_set]) == []


@SETS
@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_every_manifest_validates(value_set: str, kubernetes_version: str) -> None:
    release = _render(value_set)
    assert len(release.manifests) >= 4, release.kinds()
    errors = []
    for manifest in release.manifests:
        try:
            manifest_validate(manifest, kubernetes_version)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            errors.append(f"{manifest['kind']}/{manifest['metadata']['name']} {where}: "
                          f"{exc.message}")
    assert errors == []


def test_default_release_is_exactly_the_core_objects() -> None:
    release = _render("defaults")
    assert release.kinds() == [
        "Deployment", "Deployment", "Job", "PodDisruptionBudget", "Service"
    ]
    assert not any("monitoring.coreos.com" in m["apiVersion"] for m in release.manifests)


def test_validation_catches_typos_and_wrong_types() -> None:
    """Guards the guard: the validator refuses what the API server would refuse."""
    api = _render("defaults").one("Deployment", "api")
    typo = json.loads(json.dumps(api))
    container = typo["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    wrong_type = json.loads(json.dumps(api))
    wrong_type["spec"]["replicas"] = "two"
    monitor = _render("service-monitor").one("ServiceMonitor", "api")
    monitor_typo = json.loads(json.dumps(monitor))
    monitor_typo["spec"]["endpoint"] = monitor_typo["spec"].pop("endpoints")

    manifest_validate(api, KUBERNETES_VERSIONS[0])
    manifest_validate(monitor, KUBERNETES_VERSIONS[0])
    for bad in (typo, wrong_type, monitor_typo):
        with pytest.raises(jsonschema.ValidationError):
            manifest_validate(bad, KUBERNETES_VERSIONS[0])


def test_kubernetes_schemas_ship_with_the_package_and_need_no_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kubernetes_validate.utils

    assert set(KUBERNETES_VERSIONS) <= {
        ".".join(v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()
    }

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("schema validation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    for manifest in _render("production").manifests:
        for version in KUBERNETES_VERSIONS:
            manifest_validate(manifest, version)


def test_values_schema_is_draft_7_and_every_value_set_meets_it() -> None:
    """Draft 7, which Helm 3's validator and Helm 4's both read; checked by a second validator."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    validator.validate(yaml.safe_load((CHART / "values.yaml").read_text()))
    for value_set in VALUE_SETS:
        validator.validate(merged(value_set))
    refused = merged("defaults")
    refused["config"]["BERTH_DATABASE_URL"] = "postgresql://berth@db/berth"
    assert not validator.is_valid(refused)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"config": {"BERTH_DATABASE_URL": "postgresql://berth:pw@db/berth"}},
         "invalid propertyName 'BERTH_DATABASE_URL'"),
        ({"config": {"BERTH_BOOTSTRAP_ADMIN_KEY_FILE": "/tmp/key"}},
         "invalid propertyName 'BERTH_BOOTSTRAP_ADMIN_KEY_FILE'"),
        ({"config": {"LOG_LEVEL": "debug"}}, "invalid propertyName 'LOG_LEVEL'"),
        ({"api": {"replicas": 0}}, "/api/replicas"),
        ({"replicaCount": 3}, "replicaCount"),
        ({"image": {"repository": ""}}, "/image/repository"),
        ({"database": {"secretName": ""}}, "/database/secretName"),
        ({"bootstrapAdminKey": {"secretName": "Not_A_Name"}}, "/bootstrapAdminKey/secretName"),
        ({"securityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRootFilesystem"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
        ({"api": {"resources": {"limits": {"memory": "1Gi"}, "requests": None}}}, "requests"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
)
def test_values_schema_refuses(values: dict[str, Any], complaint: str) -> None:
    helm_python = helm()
    with pytest.raises(helm_python.HelmValuesError, match=complaint):
        release_render(values)


# --- what the manifests must say -------------------------------------------------------


@SETS
def test_api_probes_point_at_the_real_health_routes(value_set: str) -> None:
    values = merged(value_set)
    api = _render(value_set).one("Deployment", "api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": values["api"]["port"]}
    assert container["args"][:2] == ["berth", "serve"]
    assert container["args"][container["args"].index("--port") + 1] == str(values["api"]["port"])
    live = container["livenessProbe"]["httpGet"]
    ready = container["readinessProbe"]["httpGet"]
    assert (live["path"], live["port"]) == ("/healthz", "http")
    assert (ready["path"], ready["port"]) == ("/readyz", "http")
    assert {"/healthz", "/readyz"} <= app_paths()


@SETS
def test_migration_job_is_a_pre_install_and_pre_upgrade_hook(value_set: str) -> None:
    release = _render(value_set)
    job = release.one("Job", "migrate")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["berth", "migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # Helm installs hooks before, and apart from, every other object: no Deployment may be a
    # hook itself (it would then race the migration by weight).
    deployments = release.all("Deployment")
    assert deployments
    for deployment in deployments:
        assert "helm.sh/hook" not in deployment["metadata"].get("annotations", {})


@SETS
def test_reconcilers_get_no_service(value_set: str) -> None:
    release = _render(value_set)
    services = release.all("Service")
    api_pods = release.one("Deployment", "api")["spec"]["template"]["metadata"]["labels"]
    assert [s for s in services if labels_match(s["spec"]["selector"], api_pods)], services
    if not merged(value_set)["reconciler"]["enabled"]:
        assert not [d for d in release.all("Deployment") if component_of(d) == "reconciler"]
        return
    reconciler = release.one("Deployment", "reconciler")
    pods = reconciler["spec"]["template"]["metadata"]["labels"]
    for service in services:
        assert not labels_match(service["spec"].get("selector", {}), pods), service
    (container,) = reconciler["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["berth", "reconcile"]  # dynamic shards: no --shard
    assert reconciler["spec"]["replicas"] == merged(value_set)["reconciler"]["replicas"]


def test_three_reconciler_replicas() -> None:
    assert _render("three-reconcilers").one("Deployment", "reconciler")["spec"]["replicas"] == 3


@SETS
def test_database_url_comes_only_from_its_secret(value_set: str) -> None:
    values = merged(value_set)
    release = _render(value_set)
    # No configuration object at all: the only ConfigMap is the Grafana dashboard's.
    configs = [m for m in release.all("ConfigMap")
               if m["metadata"]["labels"].get("grafana_dashboard") != "1"]
    assert not release.all("Secret") and not configs
    assert "postgresql://" not in yaml.safe_dump_all(release.manifests)
    pods = release.pod_specs()
    assert {component_of(w) for w, _ in pods} >= {"api", "migrate"}
    for workload, pod in pods:
        for container in containers(pod):
            assert "envFrom" not in container, workload["metadata"]["name"]
            env = env_of(container)
            assert env["BERTH_DATABASE_URL"] == {
                "name": "BERTH_DATABASE_URL",
                "valueFrom": {"secretKeyRef": {"name": values["database"]["secretName"],
                                               "key": values["database"]["secretKey"]}},
            }


@SETS
def test_every_berth_variable_is_a_real_setting(value_set: str) -> None:
    for _, pod in _render(value_set).pod_specs():
        for container in containers(pod):
            for name in env_of(container):
                assert name.startswith("BERTH_"), name
                assert name.removeprefix("BERTH_").lower() in Settings.model_fields, name


@SETS
def test_bootstrap_key_is_a_mounted_secret_file_of_the_api_only(value_set: str) -> None:
    values = merged(value_set)
    release = _render(value_set)
    pod = release.one("Deployment", "api")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    path = env_of(container)["BERTH_BOOTSTRAP_ADMIN_KEY_FILE"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == values["bootstrapAdminKey"]["secretName"]
    assert secret["items"] == [{"key": values["bootstrapAdminKey"]["secretKey"],
                                "path": path.removeprefix(mount["mountPath"] + "/")}]
    assert secret.get("optional") is not True  # a missing Secret stops the pod, visibly
    assert values["bootstrapAdminKey"]["secretName"] in release.notes
    for workload, other in release.pod_specs():
        if component_of(workload) != "api":
            for c in containers(other):
                assert "BERTH_BOOTSTRAP_ADMIN_KEY_FILE" not in env_of(c)


@SETS
def test_every_pod_is_locked_down(value_set: str) -> None:
    release = _render(value_set)
    pods = release.pod_specs()
    assert len(pods) >= 2
    for workload, pod in pods:
        name = workload["metadata"]["name"]
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in containers(pod):
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["runAsNonRoot"] is True, name
            assert "ALL" in sc["capabilities"]["drop"], name
            assert not sc.get("privileged"), name
            requests = container["resources"]["requests"]
            assert requests.get("cpu") and requests.get("memory"), name
            (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert "emptyDir" in volumes[tmp["name"]], name


def test_resources_reach_every_container() -> None:
    for workload, pod in _render("resources").pod_specs():
        for container in containers(pod):
            assert container["resources"] == RESOURCES, workload["metadata"]["name"]


@SETS
def test_image_is_the_values_or_the_chart_app_version(value_set: str) -> None:
    values = merged(value_set)
    with helm().Chart.load(CHART) as chart:
        app_version = chart.metadata["appVersion"]
    expected = f"{values['image']['repository']}:{values['image']['tag'] or app_version}"
    images = {c["image"] for _, pod in _render(value_set).pod_specs() for c in containers(pod)}
    assert images == {expected}
    if value_set == "production":
        assert expected == "registry.example.com/platform/berth:0.1.0-rc1"
    if value_set == "defaults":
        assert expected == f"berth:{app_version}"


def test_chart_app_version_is_the_package_version() -> None:
    import tomllib

    from tests.deploy.release import REPO

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    with helm().Chart.load(CHART) as chart:
        assert chart.metadata["appVersion"] == project["version"]


@SETS
def test_api_has_a_disruption_budget(value_set: str) -> None:
    release = _render(value_set)
    pdb = release.one("PodDisruptionBudget", "api")
    api_pods = release.one("Deployment", "api")["spec"]["template"]["metadata"]["labels"]
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], api_pods)
    assert pdb["spec"]["maxUnavailable"] == 1


@SETS
def test_prometheus_operator_objects_only_when_asked_for(value_set: str) -> None:
    values = merged(value_set)
    release = _render(value_set)
    monitors = [m for m in release.manifests if m["apiVersion"].startswith("monitoring.coreos")]
    if not values["serviceMonitor"]["enabled"]:
        assert monitors == []
        return
    assert "/metrics" in app_paths()
    service_monitor = release.one("ServiceMonitor", "api")
    (service,) = [s for s in release.all("Service")
                  if labels_match(service_monitor["spec"]["selector"]["matchLabels"],
                                  s["metadata"]["labels"])]
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in service_monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
    for key, value in values["serviceMonitor"]["labels"].items():
        assert service_monitor["metadata"]["labels"][key] == value
    pod_monitor = release.one("PodMonitor", "reconciler")
    reconciler = release.one("Deployment", "reconciler")["spec"]["template"]
    assert labels_match(pod_monitor["spec"]["selector"]["matchLabels"],
                        reconciler["metadata"]["labels"])
    (container,) = reconciler["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": values["reconciler"]["metricsPort"]}
    assert env_of(container)["BERTH_RECONCILER_METRICS_PORT"]["value"] == str(ports["metrics"])
    for endpoint in pod_monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert len(monitors) == 2


def test_ingress_routes_to_the_api_service() -> None:
    release = _render("ingress")
    ingress = release.one("Ingress", "api")
    service = release.one("Service", "api")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "berth-tls", "hosts": ["berth.example.com"]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "berth.example.com"
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": service["metadata"]["name"],
                                          "port": {"name": "http"}}
    assert "http" in {p["name"] for p in service["spec"]["ports"]}
    assert not _render("defaults").all("Ingress")


def test_network_policies_open_only_the_serving_ports() -> None:
    release = _render("network-policy")
    assert not _render("defaults").all("NetworkPolicy")
    for component, port in (("api", "http"), ("reconciler", "metrics")):
        policy = release.one("NetworkPolicy", component)
        pods = release.one("Deployment", component)["spec"]["template"]
        assert labels_match(policy["spec"]["podSelector"]["matchLabels"],
                            pods["metadata"]["labels"])
        (rule,) = policy["spec"]["ingress"]
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        (container,) = pods["spec"]["containers"]
        assert port in {p["name"] for p in container["ports"]}
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        dns, database = policy["spec"]["egress"]
        assert {p["port"] for p in dns["ports"]} == {53}
        assert database["ports"] == [{"port": 5432, "protocol": "TCP"}]
    api_rule = release.one("NetworkPolicy", "api")["spec"]["ingress"][0]
    assert api_rule["from"] == VALUE_SETS["network-policy"]["networkPolicy"]["apiFrom"]
    assert "from" not in release.one("NetworkPolicy", "reconciler")["spec"]["ingress"][0]


def test_api_only_release_runs_the_reconciler_in_the_api() -> None:
    release = _render("api-only")
    (container,) = release.one("Deployment", "api")["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["BERTH_RECONCILER_ENABLED"]["value"] == "true"
    assert "each API pod runs one" in release.notes
    (default,) = _render("defaults").one("Deployment", "api")["spec"]["template"]["spec"][
        "containers"]
    assert env_of(default)["BERTH_RECONCILER_ENABLED"]["value"] == "false"


def _manifest_names(release: Release) -> list[tuple[str, str]]:
    return sorted((m["kind"], m["metadata"]["name"]) for m in release.manifests)


def test_release_name_prefixes_every_object() -> None:
    release = release_render({}, name="sched", namespace="prod")
    names: list[Manifest] = release.manifests
    assert all(m["metadata"]["name"].startswith("sched-berth-") for m in names)
    assert all(m["metadata"]["labels"]["app.kubernetes.io/instance"] == "sched" for m in names)
    assert "-n prod" in release.notes


@pytest.mark.parametrize(
    ("machine", "outcome"), [("s390x", "skip"), ("x86_64", "fail")], ids=["unsupported", "linux"]
)
def test_chart_tests_skip_only_where_helm_has_no_native_library(
    monkeypatch: pytest.MonkeyPatch, machine: str, outcome: str
) -> None:
    import platform
    import sys

    monkeypatch.setitem(sys.modules, "helm_python", None)  # import now raises ImportError
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platform, "machine", lambda: machine)
    expected = pytest.skip.Exception if outcome == "skip" else AssertionError
    with pytest.raises(expected, match="helm-python-sdk"):
        helm()


def test_the_examples_are_the_multi_host_url_and_cloudnativepg() -> None:
    assert {"example-multi-host-values", "example-cloudnativepg-values"} <= set(VALUE_SETS)


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_the_multi_host_secret_example_is_a_secret_berth_reads(kubernetes_version: str) -> None:
    from app.db import describe_url
    from app.dburl import database_url_parse

    secret = yaml.safe_load((EXAMPLES / "multi-host-secret.yaml").read_text())
    manifest_validate(secret, kubernetes_version)
    values = merged("example-multi-host-values")
    assert secret["metadata"]["name"] == values["database"]["secretName"]
    url = secret["stringData"][values["database"]["secretKey"]]
    hosts = url.split("@", 1)[1].split("/", 1)[0].split(",")
    assert len(hosts) == 3
    assert database_url_parse(url).get("target_session_attrs") == "read-write"
    assert "CHANGE-ME" not in describe_url(url)


@SETS
def test_the_grafana_dashboard_is_a_configmap_only_when_asked_for(value_set: str) -> None:
    release = _render(value_set)
    maps = [m for m in release.all("ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]
    if not merged(value_set)["grafanaDashboard"]["enabled"]:
        assert maps == []
        return
    (dashboard,) = maps
    labels = dashboard["metadata"]["labels"]
    # The label the Grafana sidecar (kube-prometheus-stack's default) looks for.
    assert labels["grafana_dashboard"] == "1"
    for key, value in merged(value_set)["grafanaDashboard"]["labels"].items():
        assert labels[key] == value
    assert dashboard["metadata"].get("annotations", {}) == (
        merged(value_set)["grafanaDashboard"]["annotations"] or {}
    )
    shipped = (CHART.parent.parent / "grafana" / "berth.json").read_text()
    assert json.loads(dashboard["data"]["berth.json"]) == json.loads(shipped)


@SETS
def test_the_database_tls_files_are_mounted_in_every_pod_when_given(value_set: str) -> None:
    secret = merged(value_set)["database"].get("tlsSecretName")
    pods = _render(value_set).pod_specs()
    assert {component_of(w) for w, _ in pods} >= {"api", "migrate"}
    for workload, pod in pods:
        volumes = [v for v in pod["spec"]["volumes"] if v["name"] == "database-tls"]
        mounts = [m for c in containers(pod) for m in c["volumeMounts"]
                  if m["name"] == "database-tls"]
        if not secret:
            assert not volumes and not mounts, workload["metadata"]["name"]
            continue
        assert [v["secret"]["secretName"] for v in volumes] == [secret]
        assert [(m["mountPath"], m["readOnly"]) for m in mounts] == [
            ("/etc/berth/postgresql", True)]
