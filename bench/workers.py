"""Worker processes started together, and the CPU PostgreSQL spends on one database.

The baselines run as ``python -m bench.X`` worker processes: each connects, says ``ready``,
waits for ``go``, works, prints one JSON result and waits for ``bye`` (so the parent can
sample the CPU of the worker's server process before it goes away).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = ["REPO_ROOT", "postgres_cpu_seconds", "worker_serve", "workers_run"]

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Server processes that work for every database (the WAL and the checkpoints we cause).
_SHARED = ("checkpointer", "background writer", "walwriter")


async def worker_serve(work: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Say ready, wait for go, run ``work``, print its result (with wall-clock bounds and the
    CPU it used), and wait for goodbye."""
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    began, cpu = time.time(), time.process_time()
    result = await work()
    result.update(began=began, ended=time.time(), cpu=time.process_time() - cpu)
    print(json.dumps(result), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    return result


def postgres_cpu_seconds(database: str, since: dict[int, float] | None = None) -> Any:
    """Return CPU seconds per PostgreSQL process serving ``database`` (plus the shared WAL
    writer, checkpointer and background writer) now; with ``since``, the total used since.

    Backends of other databases (other work on a shared server) are left out.
    """
    import psutil

    now: dict[int, float] = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] not in ("postgres", "postmaster"):
            continue
        title = " ".join(proc.info["cmdline"] or ())
        if f" {database} " not in title and not any(title.endswith(s) for s in _SHARED):
            continue
        try:
            t = proc.cpu_times()
            now[proc.pid] = t.user + t.system
        except psutil.Error:
            pass
    if since is None:
        return now
    return sum(v - since.get(pid, 0.0) for pid, v in now.items())


def python_env() -> dict[str, str]:
    """Return the environment for a child Python that imports this checkout first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def workers_run(database: str, argvs: list[list[str]]) -> tuple[list[dict[str, Any]], float]:
    """Run one ``python ARGV`` worker per item of ``argvs`` (each serving
    :func:`worker_serve`) from a common start; return their results and the CPU seconds
    PostgreSQL spent on ``database`` meanwhile."""
    procs = [
        subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=python_env(), cwd=REPO_ROOT)
        for argv in argvs
    ]

    def tell(line: str) -> None:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(line + "\n")
            p.stdin.flush()

    def hear(p: subprocess.Popen) -> str:
        line = p.stdout.readline() if p.stdout else ""
        if not line:
            raise RuntimeError(f"bench worker failed with exit status {p.wait()}")
        return line

    try:
        # The clock starts once every worker has connected.
        for p in procs:
            if hear(p).strip() != "ready":
                raise RuntimeError("bench worker did not start")
        pg_before = postgres_cpu_seconds(database)
        tell("go")
        results = [json.loads(hear(p)) for p in procs]
        pg_cpu = postgres_cpu_seconds(database, pg_before)
        tell("bye")
        for p in procs:
            if p.wait(timeout=60) != 0:
                raise RuntimeError(f"bench worker failed with exit status {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results, pg_cpu
