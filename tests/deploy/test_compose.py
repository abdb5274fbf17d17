"""docker-compose.yml: valid against the Compose Specification's JSON schema, and its Berth
health check, database URL and Prometheus scrape target match the real ports and routes."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from tests.deploy.release import REPO, SCHEMAS
from tests.deploy.test_chart import app_paths

COMPOSE = REPO / "docker-compose.yml"


@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@cache
def compose_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def berth_port() -> int:
    """Return the port `berth serve` listens on in the berth service's command."""
    command = " ".join(compose()["services"]["berth"]["command"])
    match = re.search(r"berth serve .*--port (\d+)", command)
    assert match, command
    return int(match.group(1))


def test_compose_file_meets_the_compose_specification() -> None:
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in compose_validator().iter_errors(compose())
    ]
    assert errors == []


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("services.berth", {"healthchek": {"test": ["CMD", "true"]}}),
        ("services.berth", {"ports": "8000:8000"}),
        ("services.berth.healthcheck", {"interval": 5}),
        ("services.prometheus.depends_on.berth", {"condition": "service_ready"}),
    ],
    ids=["typo", "ports-not-a-list", "interval-not-a-duration", "unknown-condition"],
)
def test_the_compose_schema_refuses_mistakes(where: str, change: dict[str, Any]) -> None:
    """Guards the guard: the shipped schema is strict enough to catch a broken file."""
    broken = json.loads(json.dumps(compose()))
    node = broken
    for key in where.split("."):
        node = node[key]
    node.update(change)
    assert not compose_validator().is_valid(broken)


def test_berth_health_check_uses_the_real_port_and_route() -> None:
    berth = compose()["services"]["berth"]
    port = berth_port()
    test = berth["healthcheck"]["test"]
    assert test[0] == "CMD"
    (url,) = re.findall(r"https?://[^'\"\s]+", " ".join(test))
    parts = urlsplit(url)
    assert parts.hostname in {"127.0.0.1", "localhost"}
    assert parts.port == port
    assert parts.path in app_paths() and parts.path in {"/healthz", "/readyz"}
    published = [p.rsplit(":", 1)[-1] for p in berth["ports"]]
    assert published == [str(port)]
    assert berth["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
    assert (REPO / berth["build"]["dockerfile"]).is_file()
    assert "berth migrate &&" in " ".join(berth["command"])


def test_berth_database_url_names_the_postgres_service() -> None:
    services = compose()["services"]
    url = urlsplit(services["berth"]["environment"]["BERTH_DATABASE_URL"])
    postgres = services["postgres"]["environment"]
    assert url.scheme == "postgresql" and url.hostname == "postgres" and url.port == 5432
    assert (url.username, url.password, url.path) == (
        postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], f"/{postgres['POSTGRES_DB']}"
    )
    assert services["berth"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in services["postgres"]


def test_prometheus_scrapes_berth_where_it_serves_metrics() -> None:
    prometheus = compose()["services"]["prometheus"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prometheus["volumes"]}
    source = mounts["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load((REPO / source).read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "berth"]
    assert job.get("metrics_path", "/metrics") in app_paths()
    (targets,) = [s["targets"] for s in job["static_configs"]]
    assert targets == [f"berth:{berth_port()}"]
    assert "berth" in compose()["services"]
