"""The restart drill: the embedded PostgreSQL of ``berth serve`` (the single-node default) is
restarted 20 times while 8 clients submit tasks and a runtime heartbeats.

Berth must answer every request with a 2xx or a 503 carrying ``Retry-After`` (never a 500,
never a reset client connection), every task answered 2xx must exist afterwards, and
placements must resume after each restart without anyone touching the process. The 503
window and the time until placements resumed are printed per restart (``pytest -s -n 0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from app.embedded import PORT, _bin_dir, _postmaster_read, _run_as
from tests.test_serve import Serve, berth_run, keys_printed

RESTARTS = 20
CLIENTS = 8
TENANT = "acme"
INSTANCE = "rt-drill"
SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 1}}
POOL = {
    "id": "pool-drill", "tenantIds": [TENANT], "runtimeClass": "gpu-small",
    "runtimeInstanceId": INSTANCE, "region": "eu-west", "dataResidency": "eu",
    "failureDomain": "fd-1", "labels": {}, "artifactRegions": ["eu-west"], "costWeight": 1.0,
    "operators": [],
}
CAPACITY = {"cpuMillis": 100_000_000, "memoryMiB": 100_000_000, "llmSlots": 0}


def _pg_ctl(pgdata: Path, *args: str) -> None:
    subprocess.run(
        [str(_bin_dir() / "pg_ctl"), *args, "--pgdata", str(pgdata)],
        check=True, cwd=pgdata, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, timeout=90,
        env={k: v for k, v in os.environ.items() if not k.startswith("PG")},
        **_run_as().kwargs(),
    )


def _restart(pgdata: Path) -> None:
    """Restart the server of ``pgdata`` (fast shutdown, as a package upgrade or a reboot) and
    return once it accepts connections (postmaster.pid says "ready": pg_ctl's own wait for the
    start now and then missed it)."""
    before = _postmaster_read(pgdata)
    assert before is not None
    _pg_ctl(pgdata, "stop", "--mode", "fast", "--wait", "--timeout", "60")
    # As the embedded server is started: its private socket, no TCP.
    options = (f"-c listen_addresses='' -c unix_socket_directories={before.socket_dir} "
               f"-c port={PORT} -c max_connections=200")
    _pg_ctl(pgdata, "start", "--no-wait", "--log", str(pgdata / "log" / "server.log"),
            "-o", options)
    deadline = time.monotonic() + 60
    while (live := _postmaster_read(pgdata)) is None or live.status != "ready":
        assert time.monotonic() < deadline, "the embedded PostgreSQL did not come back"
        time.sleep(0.01)


def _key(tmp_path: Path, data_dir: Path, *args: str) -> str:
    made = berth_run("keys", "create", *args, cwd=tmp_path, BERTH_DATA_DIR=str(data_dir))
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


class Drill:
    """The load: submissions and heartbeats, with every answer recorded."""

    def __init__(self, base: str, tenant: str, runtime: str) -> None:
        self.base = base
        self.tenant = {"Authorization": f"Bearer {tenant}"}
        self.runtime = {"Authorization": f"Bearer {runtime}"}
        self.stop = asyncio.Event()
        #: (monotonic time, status) of every answer to a submission
        self.answers: list[tuple[float, int]] = []
        self.created: list[str] = []
        self.resets: list[str] = []
        self.bad: list[str] = []
        #: (status, detail) of every /readyz answer
        self.readiness: list[tuple[int, str]] = []

    async def submit(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            while not self.stop.is_set():
                try:
                    answer = await http.post("/v1/tasks", json=SPEC, headers=self.tenant)
                except httpx.TransportError as exc:
                    self.resets.append(repr(exc))
                    continue
                self.answers.append((time.monotonic(), answer.status_code))
                if answer.status_code == 201:
                    self.created.append(answer.json()["id"])
                elif answer.status_code != 503 or "retry-after" not in answer.headers:
                    self.bad.append(f"{answer.status_code} {answer.text[:300]}")
                else:
                    await asyncio.sleep(0.05)

    async def heartbeat(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            while not self.stop.is_set():
                try:
                    await http.post(f"/v1/runtimes/{INSTANCE}/heartbeat", headers=self.runtime)
                except httpx.TransportError as exc:
                    self.resets.append(repr(exc))
                await asyncio.sleep(1.0)

    async def ready(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            while not self.stop.is_set():
                try:
                    answer = await http.get("/readyz")
                except httpx.TransportError as exc:
                    self.resets.append(repr(exc))
                    continue
                detail = answer.json().get("detail", "") if answer.status_code == 503 else ""
                self.readiness.append((answer.status_code, detail))
                await asyncio.sleep(0.05)

    async def placed_after(self, http: httpx.AsyncClient, since: float) -> float:
        """Submit a probe task (retrying 503s) and return the seconds from ``since`` until it
        is leased."""
        while True:
            probe = await http.post("/v1/tasks", json=SPEC, headers=self.tenant)
            if probe.status_code == 201:
                break
            assert probe.status_code == 503, probe.text
            await asyncio.sleep(0.05)
        task_id = probe.json()["id"]
        self.created.append(task_id)
        while True:
            got = await http.get(f"/v1/tasks/{task_id}", headers=self.tenant)
            if got.status_code == 200 and got.json()["state"] == "LEASED":
                return time.monotonic() - since
            await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_twenty_restarts_under_load_answer_no_500_and_lose_no_task(tmp_path: Path) -> None:
    data_dir = tmp_path / "berth-data"
    serve = Serve(tmp_path, data_dir, BERTH_TICK_SECONDS="1")
    try:
        await asyncio.to_thread(serve.wait_ready)
        admin = {"Authorization": f"Bearer {keys_printed(serve.stdout)[0]}"}
        tenant = _key(tmp_path, data_dir, "--role", "tenant", "--subject", TENANT,
                      "--tenant", TENANT)
        runtime = _key(tmp_path, data_dir, "--role", "runtime", "--subject", INSTANCE,
                       "--runtime-instance", INSTANCE)
        base = f"http://127.0.0.1:{serve.port}"
        drill = Drill(base, tenant, runtime)
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            made = await http.post("/v1/pools", json=POOL, headers=admin)
            assert made.status_code == 201, made.text
            put = await http.put(f"/v1/pools/{POOL['id']}/capacity", json=CAPACITY,
                                 headers=admin)
            assert put.status_code == 200, put.text
            load = [asyncio.create_task(drill.submit()) for _ in range(CLIENTS)]
            load.append(asyncio.create_task(drill.heartbeat()))
            load.append(asyncio.create_task(drill.ready()))
            await drill.placed_after(http, time.monotonic())  # placing before the first
            figures = []
            for _ in range(RESTARTS):
                await asyncio.sleep(0.5)
                began = time.monotonic()
                await asyncio.to_thread(_restart, data_dir / "pgdata")
                back = time.monotonic()
                resumed = await drill.placed_after(http, back)
                await asyncio.sleep(0.3)
                window = [t for t, s in drill.answers if s == 503 and t >= began]
                figures.append((back - began, (max(window) - min(window)) if window else 0.0,
                                len(window), resumed))
            drill.stop.set()
            await asyncio.gather(*load)

            statuses = Counter(s for _, s in drill.answers)
            print(f"\nanswers {dict(statuses)}; per restart (restart s, 503 window s, 503s, "
                  "placed after restart s):")
            for row in figures:
                print("  {:.2f} {:.2f} {} {:.2f}".format(*row))
            assert not drill.resets, drill.resets[:5]
            assert not drill.bad, drill.bad[:5]
            assert statuses[500] == 0
            # /readyz said why while the database was away, and was ready again after.
            unready = [detail for status, detail in drill.readiness if status == 503]
            assert unready, Counter(status for status, _ in drill.readiness)
            assert all(d.startswith("database unreachable") for d in unready), unready[:5]
            assert {status for status, _ in drill.readiness} == {200, 503}
            assert drill.readiness[-1][0] == 200
            assert len(drill.created) > RESTARTS
            for task_id in drill.created:
                got = await http.get(f"/v1/tasks/{task_id}", headers=drill.tenant)
                assert got.status_code == 200, (task_id, got.text)
        assert serve.stop(signal.SIGTERM) == 0, serve.err.read_text()[-3000:]
    finally:
        serve.kill()
        pgdata = data_dir / "pgdata"
        if (pgdata / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError):
                _pg_ctl(pgdata, "stop", "--mode", "immediate")
