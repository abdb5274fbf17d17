"""README.md's Kubernetes section works as written: its commands, read from the README text,
build the image the chart pulls, create the Secrets the chart reads, and install cleanly."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.serve import bootstrap_key_read
from tests.deploy.release import (
    CHART,
    KUBERNETES_VERSIONS,
    REPO,
    chart_lint,
    helm,
    manifest_validate,
    release_render,
    values_merged,
)

README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    """Return the text of README's ``## title`` section."""
    pattern = rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)"
    match = re.search(pattern, README, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def commands(text: str) -> list[list[str]]:
    """Return the shell commands of the ```sh blocks in ``text``, continuation lines joined."""
    found = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(shlex.split(line))
    return found


def deep_merge(into: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            deep_merge(into[key], value)
        else:
            into[key] = value
    return into


@dataclass
class Steps:
    """What the README's commands do, as data."""

    image_built: str = ""
    image_pushed: str = ""
    namespaces: list[str] = field(default_factory=list)
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    release: str = ""
    chart: str = ""
    namespace: str = "default"
    values: dict[str, Any] = field(default_factory=dict)


def steps_read() -> Steps:
    """Interpret the README's Kubernetes commands; any command or flag not understood fails."""
    helm_python = helm()
    steps = Steps()
    for argv in commands(section("Kubernetes")):
        match argv:
            case ["docker", "build", "-f", dockerfile, "-t", image, "."]:
                assert (REPO / dockerfile).is_file(), dockerfile
                assert dockerfile == "deploy/Dockerfile"
                steps.image_built = image
            case ["docker", "push", image]:
                steps.image_pushed = image
            case ["kubectl", "create", "namespace", namespace]:
                steps.namespaces.append(namespace)
            case ["kubectl", "-n", namespace, "create", "secret", "generic", name, *literals]:
                data = {}
                for literal in literals:
                    key, _, value = literal.removeprefix("--from-literal=").partition("=")
                    assert literal.startswith("--from-literal=") and key and value, literal
                    data[key] = value
                steps.secrets[(namespace, name)] = data
            case ["helm", "install", release, chart, *flags]:
                steps.release, steps.chart = release, chart
                while flags:
                    flag, value, *flags = flags
                    if flag in {"--namespace", "-n"}:
                        steps.namespace = value
                    elif flag == "--set":
                        deep_merge(steps.values, helm_python.parse_set_string(value))
                    else:
                        raise AssertionError(f"README's helm install uses {flag}, not tested here")
            case _:
                raise AssertionError(f"README's Kubernetes section runs {argv}, not tested here")
    return steps


def test_readme_names_every_step() -> None:
    steps = steps_read()
    assert steps.image_built and steps.image_built == steps.image_pushed
    assert steps.release and (REPO / steps.chart).resolve() == CHART
    assert steps.namespace in steps.namespaces
    assert len(steps.secrets) == 2


def test_readme_install_renders_lints_and_validates() -> None:
    steps = steps_read()
    assert chart_lint(steps.values) == []
    release = release_render(steps.values, name=steps.release, namespace=steps.namespace)
    for manifest in release.manifests:
        for version in KUBERNETES_VERSIONS:
            manifest_validate(manifest, version)
    # No Prometheus Operator needed: nothing of monitoring.coreos.com by default.
    assert not [m for m in release.manifests if "coreos" in m["apiVersion"]]
    assert release.all("Deployment") and release.all("Job")


def test_readme_image_is_the_one_the_chart_pulls() -> None:
    steps = steps_read()
    release = release_render(steps.values, name=steps.release, namespace=steps.namespace)
    images = {
        c["image"] for _, pod in release.pod_specs() for c in pod["spec"]["containers"]
    }
    assert images == {steps.image_built}


def test_readme_secrets_are_the_ones_the_chart_reads() -> None:
    steps = steps_read()
    release = release_render(steps.values, name=steps.release, namespace=steps.namespace)
    referenced: set[tuple[str, str]] = set()
    for _, pod in release.pod_specs():
        for container in pod["spec"]["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    referenced.add((ref["name"], ref["key"]))
        for volume in pod["spec"].get("volumes", []):
            if "secret" in volume:
                for item in volume["secret"]["items"]:
                    referenced.add((volume["secret"]["secretName"], item["key"]))
    created = {
        (name, key)
        for (namespace, name), data in steps.secrets.items()
        if namespace == steps.namespace
        for key in data
    }
    assert len(referenced) == 2
    assert referenced <= created, f"the chart reads {referenced}, the README creates {created}"


def test_readme_secret_values_are_what_berth_accepts(tmp_path: Path) -> None:
    steps = steps_read()
    values = values_merged(steps.values)
    database, admin_key = values["database"], values["bootstrapAdminKey"]
    url = steps.secrets[(steps.namespace, database["secretName"])][database["secretKey"]]
    assert url.startswith("postgresql://")
    recipe = steps.secrets[(steps.namespace, admin_key["secretName"])][admin_key["secretKey"]]
    if shutil.which("bash") is None or shutil.which("openssl") is None:
        pytest.skip("bash and openssl are needed to run the README's key recipe")
    key = subprocess.run(
        ["bash", "-c", f'printf %s "{recipe}"'], capture_output=True, text=True, check=True
    ).stdout
    assert key != recipe
    path = tmp_path / "key"
    path.write_text(key)
    assert bootstrap_key_read(path) == key
