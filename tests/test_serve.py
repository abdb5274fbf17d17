"""`berth serve` run as a user would: a subprocess on the embedded default or on a URL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.db import Database
from app.embedded import EmbeddedPostgres, postgres_processes
from app.ledger.keys import api_key_get
from tests.conftest import _admin

REPO = Path(__file__).resolve().parent.parent
READY_DEADLINE_SECONDS = 90  # generous: a cold embedded start runs initdb and migrations


def berth_command() -> list[str]:
    """Return the `berth` console script of this interpreter, or `python -m app.cli`."""
    script = Path(sys.executable).with_name("berth")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


def berth_env(**settings: str) -> dict[str, str]:
    """Return the environment of a user's shell: no BERTH_ variable but ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(settings)
    return env


def berth_run(*args: str, cwd: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    """Run a `berth` command to completion and return its result."""
    return subprocess.run(
        [*berth_command(), *args],
        cwd=cwd,
        env=berth_env(**settings),
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def port_free() -> int:
    """Return a TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Assert the command failed with exactly one line on stderr containing ``needles``."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    line = lines[0]
    assert line.startswith("berth: ")
    for needle in needles:
        assert needle in line, line
    return line


@contextlib.contextmanager
def database_empty(server_url: str) -> Iterator[str]:
    """Yield the URL of a new database with no schema at all, dropped afterwards."""
    name = f"berth_empty_{uuid.uuid4().hex[:10]}"
    maintenance = make_url(server_url).set(database="postgres").render_as_string(False)
    asyncio.run(_admin(maintenance, f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(False)
    finally:
        asyncio.run(_admin(maintenance, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """Yield the URL of a database on the test server that has no schema."""
    with database_empty(server_url) as url:
        yield url


def keys_printed(stdout: str) -> list[str]:
    """Return the API keys printed in ``stdout`` (each alone on its line)."""
    return [line for line in stdout.splitlines() if line.startswith("berth_")]


async def key_role(url: str, key: str) -> str | None:
    """Return the role of ``key`` on the database at ``url``, or None if it is unknown."""
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            record = await api_key_get(conn, key=key)
    finally:
        await db.close()
    return None if record is None else record.role


class Serve:
    """A `berth serve` subprocess with its output in files (pipes could fill and block it)."""

    def __init__(self, workdir: Path, data_dir: Path, **settings: str) -> None:
        self.port = port_free()
        self.out = workdir / f"serve-{uuid.uuid4().hex[:6]}.out"
        self.err = self.out.with_suffix(".err")
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [*berth_command(), "serve", "--port", str(self.port),
                 "--data-dir", str(data_dir)],
                cwd=workdir,
                env=berth_env(**settings),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_DEADLINE_SECONDS
        url = f"http://127.0.0.1:{self.port}/readyz"
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.err.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"/readyz never answered 200:\n{self.err.read_text()}")

    def stop(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.slow
def test_serve_on_the_embedded_default(tmp_path: Path) -> None:
    data_dir = tmp_path / "berth-data"
    pgdata = data_dir / "pgdata"

    first = Serve(tmp_path, data_dir)
    try:
        first.wait_ready()
        assert httpx.get(f"http://127.0.0.1:{first.port}/healthz").status_code == 200
        # Another command on the same data directory is a guest: it leaves the server running.
        guest = berth_run(
            "keys", "create", "--role", "admin", "--subject", "ops", cwd=tmp_path,
            BERTH_DATA_DIR=str(data_dir),
        )
        assert guest.returncode == 0, guest.stderr
        ready = httpx.get(f"http://127.0.0.1:{first.port}/readyz")
        assert ready.status_code == 200, ready.text
        assert first.stop(signal.SIGINT) == 0, first.err.read_text()
    finally:
        first.kill()
    out = first.stdout
    keys = keys_printed(out)
    assert len(keys) == 1, out
    assert f"listening on http://127.0.0.1:{first.port}" in out
    assert f"embedded PostgreSQL in {data_dir}" in out
    assert "Traceback" not in first.err.read_text()
    assert postgres_processes(pgdata) == []

    second = Serve(tmp_path, data_dir)
    try:
        second.wait_ready()
        assert second.stop(signal.SIGTERM) == 0, second.err.read_text()
    finally:
        second.kill()
    assert keys_printed(second.stdout) == []
    assert postgres_processes(pgdata) == []

    # The key printed at the first start is a real admin key of that database.
    with EmbeddedPostgres(data_dir) as server:
        assert asyncio.run(key_role(server.url, keys[0])) == "admin"
    assert postgres_processes(pgdata) == []


@pytest.mark.slow
def test_serve_with_an_unreachable_database_says_so_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql://postgres:secret@127.0.0.1:{port_free()}/berth"
    result = berth_run("serve", "--port", "0", cwd=tmp_path, BERTH_DATABASE_URL=url)
    line = assert_one_line(result, "unreachable", "connection refused", "BERTH_DATABASE_URL")
    assert "secret" not in line
    assert not (tmp_path / ".berth").exists()  # nothing embedded was started


@pytest.mark.slow
def test_serve_on_a_database_behind_head_says_run_migrate(
    tmp_path: Path, empty_database_url: str
) -> None:
    result = berth_run(
        "serve", "--port", "0", cwd=tmp_path, BERTH_DATABASE_URL=empty_database_url
    )
    assert_one_line(result, "berth migrate")


@pytest.mark.slow
def test_serve_on_a_busy_port_says_so_in_one_line(tmp_path: Path, database_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = berth_run(
            "serve", "--port", str(port), cwd=tmp_path, BERTH_DATABASE_URL=database_url
        )
    assert_one_line(result, f"cannot listen on 127.0.0.1:{port}", "BERTH_PORT")
