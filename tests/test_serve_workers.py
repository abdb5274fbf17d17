"""No preview worker outlives its server: `berth serve` starts worker processes that compute
previews, and whether the server stops (SIGTERM) or is killed (SIGKILL, which no handler
sees), every one of them exits."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.test_serve import berth_command, berth_env, port_free

WORKERS = 2
#: How long the processes get to start, and to exit once the server is gone.
DEADLINE_SECONDS = 60


def _stat(pid: int) -> tuple[str, int] | None:
    """Return the state and parent of process ``pid``, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def _children(pid: int) -> set[int]:
    """Return the live processes whose parent is ``pid``."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            if stat[1] == pid and stat[0] != "Z":
                out.add(int(entry))
    return out


def _alive(pids: set[int]) -> set[int]:
    """Return the processes of ``pids`` still running (a zombie has exited)."""
    return {p for p in pids if (s := _stat(p)) is not None and s[0] != "Z"}


def _serve(database_url: str) -> tuple[subprocess.Popen, set[int]]:
    """Start `berth serve` with its preview workers; return it and its worker processes."""
    port = port_free()
    proc = subprocess.Popen(
        [*berth_command(), "serve", "--port", str(port)],
        env=berth_env(BERTH_DATABASE_URL=database_url, BERTH_RECONCILER_ENABLED="false",
                      BERTH_LOG_LEVEL="warning", BERTH_PREVIEW_WORKERS=str(WORKERS)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        assert proc.poll() is None, "berth serve exited"
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            ready = False
        workers = _children(proc.pid)
        if ready and len(workers) >= WORKERS:
            return proc, workers
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise AssertionError("berth serve did not start its preview workers")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_preview_worker_outlives_its_server(database_url: str, sig: signal.Signals) -> None:
    proc, workers = _serve(database_url)
    try:
        proc.send_signal(sig)
        proc.wait(timeout=DEADLINE_SECONDS)
        deadline = time.monotonic() + DEADLINE_SECONDS
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _alive(workers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in left:  # leave nothing behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of {len(workers)} processes outlived the server"
