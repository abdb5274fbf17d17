"""deploy/Dockerfile, read with a Dockerfile parser (no Docker engine here): multi-stage, no
build tools in the final stage, a non-root user, a health check on the app's real route, and a
build context that holds what the build stage copies."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from functools import cache
from typing import Any

from dockerfile_parse import DockerfileParser

from tests.deploy.release import REPO

DOCKERFILE = REPO / "deploy" / "Dockerfile"
#: A RUN that compiles or installs something: none belongs in the final stage.
BUILDING = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|build-base|[a-z0-9.+-]+-dev|"
    r"apt-get\s+install|apk\s+add|pip\s+install)\b"
)


@cache
def stages() -> list[list[dict[str, Any]]]:
    """Return the Dockerfile's instructions, one list per stage (FROM first)."""
    found: list[list[dict[str, Any]]] = []
    for instruction in DockerfileParser(path=str(DOCKERFILE)).structure:
        if instruction["instruction"] == "FROM":
            found.append([])
        if found and instruction["instruction"] != "COMMENT":
            found[-1].append(instruction)
    return found


def values(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == name]


def env_of(stage: list[dict[str, Any]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values(stage, "ENV"):
        for pair in shlex.split(value):
            key, _, val = pair.partition("=")
            env[key] = val
    return env


def test_the_image_is_built_in_stages() -> None:
    build, final = stages()[0], stages()[-1]
    assert len(stages()) >= 2
    assert " AS " in build[0]["value"].upper()
    stage_names = {s[0]["value"].split()[-1].lower() for s in stages()[:-1]}
    base = final[0]["value"].split()[0]
    assert base.lower() not in stage_names, "the final stage must start from a clean base"
    parser = DockerfileParser(path=str(DOCKERFILE))
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", parser.baseimage), parser.baseimage
    copies = values(final, "COPY")
    assert copies and all(c.startswith("--from=") for c in copies), copies


def test_the_final_stage_has_no_build_tools() -> None:
    final = stages()[-1]
    for run in values(final, "RUN"):
        assert not BUILDING.search(run), run
    assert any(BUILDING.search(r) for s in stages()[:-1] for r in values(s, "RUN"))


def test_the_image_runs_as_a_non_root_user() -> None:
    final = stages()[-1]
    users = values(final, "USER")
    assert users, "no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert user.isdigit() and int(user) >= 1000, "a numeric uid lets runAsNonRoot verify it"
    # The chart's pod securityContext runs as the same uid.
    values_yaml = (REPO / "deploy" / "helm" / "berth" / "values.yaml").read_text()
    assert f"runAsUser: {user}\n" in values_yaml
    last_user = max(i["startline"] for i in final if i["instruction"] == "USER")
    cmd = [i for i in final if i["instruction"] == "CMD"]
    assert cmd and cmd[-1]["startline"] > last_user


def test_health_check_and_command_use_the_real_port_and_route() -> None:
    from tests.deploy.test_chart import app_paths

    final = stages()[-1]
    env = env_of(final)
    (expose,) = values(final, "EXPOSE")
    assert expose == env["BERTH_PORT"] == "8000"
    assert env["BERTH_HOST"] == "0.0.0.0"
    assert "/opt/berth/bin" in env["PATH"].split(":")
    (healthcheck,) = values(final, "HEALTHCHECK")
    assert "CMD" in healthcheck
    probe = json.loads(healthcheck[healthcheck.index("CMD") + 3:].strip())
    code = probe[-1]
    assert "/healthz" in code and "/healthz" in app_paths()
    assert "BERTH_PORT" in code and "'8000'" in code
    assert json.loads(values(final, "CMD")[-1]) == ["berth", "serve"]


def test_build_context_holds_what_the_build_copies() -> None:
    """The .dockerignore keeps out everything but what COPY needs, and nothing COPY needs."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def sent(path: str) -> bool:
        """Apply Docker's rules for the patterns this file uses: the last match wins, and a
        pattern matching a parent directory matches everything under it."""
        keep = True
        parts = path.split("/")
        for pattern in patterns:
            body = pattern.removeprefix("!").rstrip("/")
            if body.startswith("**/"):
                hit = any(fnmatch.fnmatch(part, body[3:]) for part in parts)
            else:
                hit = fnmatch.fnmatch("/".join(parts[: body.count("/") + 1]), body)
            if hit:
                keep = pattern.startswith("!")
        return keep

    copied = []
    for stage in stages():
        for copy in values(stage, "COPY"):
            if not copy.startswith("--from="):
                copied += shlex.split(copy)[:-1]
    assert copied
    for source in copied:
        assert (REPO / source).exists(), source
        assert sent(source), f"{source} is copied but .dockerignore keeps it out"
    assert {"app", "migrations", "pyproject.toml"} <= set(copied)
    # Runtime code outside the copied paths would be missing from the image.
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert packages <= set(copied), packages - set(copied)
    for private in (".git", ".berth", ".venv", "tests", "docs", "deploy", ".env"):
        assert not sent(private), private
    assert not sent("app/__pycache__")
