"""docs/quickstart.md runs as written: its commands, in one bash, against a real `berth serve`.

The document's ```sh blocks are taken verbatim (all but the first, which installs the
package) and run in order in one shell, with ``set -euo pipefail`` so that a failing
``curl -f`` stops the run. Each block's output is checked against what the document says
it shows. The server runs on the test database (``BERTH_DATABASE_URL``, migrated here) and on
a free ``BERTH_PORT``, the two settings a user could also set.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.schema import schema_upgrade
from tests.test_serve import REPO, berth_env, database_empty, port_free

DOC = REPO / "docs" / "quickstart.md"
INSTALL = "python3 -m venv .venv && . .venv/bin/activate\npip install -e ."
STEP = "@@quickstart-step@@"
RUN_SECONDS = 240  # generous: the machine may be loaded


def quickstart_blocks() -> list[str]:
    """Return the ```sh blocks of docs/quickstart.md, in order."""
    return re.findall(r"```sh\n(.*?)\n```", DOC.read_text(), re.DOTALL)


def json_values(text: str) -> list[Any]:
    """Return the JSON documents printed one after another in ``text`` (other lines skipped)."""
    decoder, values, index = json.JSONDecoder(), [], 0
    while index < len(text):
        if text[index] in "{[":
            try:
                value, index = decoder.raw_decode(text, index)
            except json.JSONDecodeError:
                index += 1
                continue
            values.append(value)
        else:
            index += 1
    return values


def run_steps(blocks: list[str], *, cwd: Path, env: dict[str, str]) -> list[str]:
    """Run ``blocks`` in one bash and return each block's standard output."""
    script = ["set -euo pipefail"]
    for block in blocks:
        script += [f"echo '{STEP}'", block]
    proc = subprocess.Popen(
        ["bash", "-c", "\n".join(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_SECONDS)
    finally:
        if proc.poll() is None or _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (cwd / "berth.log").read_text() if (cwd / "berth.log").exists() else ""
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}\nberth.log:\n{log}"
    steps = out.split(f"{STEP}\n")[1:]
    assert len(steps) == len(blocks), out
    return steps


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_quickstart_opens_with_the_install_and_readme_links_it() -> None:
    assert quickstart_blocks()[0] == INSTALL
    readme_top = (REPO / "README.md").read_text().split("\n## ", 2)[1]
    assert "(docs/quickstart.md)" in readme_top


@pytest.mark.slow
@pytest.mark.skipif(not all(shutil.which(tool) for tool in ("curl", "jq", "openssl")),
                    reason="the quick start needs curl, jq and openssl")
def test_quickstart_runs_to_a_finished_task(tmp_path: Path, server_url: str) -> None:
    env = berth_env(BERTH_PORT=str(port_free()))
    # `berth` is this interpreter's console script, as after the document's `pip install -e .`.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    with database_empty(server_url) as url:
        asyncio.run(schema_upgrade(url))
        env["BERTH_DATABASE_URL"] = url
        steps = run_steps(quickstart_blocks()[1:], cwd=tmp_path, env=env)
    (start, tenant, pool, heartbeat, submit, decision, lease, complete, final, stop) = steps

    assert json_values(start) == [{"status": "ready"}]
    assert json_values(tenant)[0]["id"] == "acme"
    created, capacity = json_values(pool)
    assert created["id"] == "eu-1" and created["status"] == "ACTIVE"
    assert capacity["capacity"] == {"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 2}
    beat, seen = json_values(heartbeat)
    assert beat["instanceId"] == "rt-1"
    assert seen["healthy"] is True and seen["status"] == "ACTIVE"

    task_id = str(uuid.UUID(submit.strip()))
    (placed,) = json_values(decision)
    assert placed["state"] == "LEASED" and placed["placement"]["poolId"] == "eu-1"
    assert {c["name"] for c in placed["placement"]["components"]} >= {"least_loaded"}
    (granted,) = json_values(lease)
    assert granted["taskId"] == task_id and granted["state"] == "ACTIVE"
    assert granted["epoch"] >= 1
    (completed,) = json_values(complete)
    assert completed["taskId"] == task_id and completed["state"] == "SUCCEEDED"

    (finished,) = json_values(final)
    assert finished["state"] == "SUCCEEDED" and finished["finishedAt"]
    events = [line.split()[1:] for line in final.splitlines() if line.count("  ") == 2]
    assert events == [["ADMITTED", "submitted"], ["LEASED", "leased"],
                      ["SUCCEEDED", "lease_succeeded"]]
    assert stop.strip() == ""
