"""One URL, every command: each command (serve, reconcile, migrate, keys, tenants, bench) runs
on a PostgreSQL with TLS on with each form and parameter of libpq's URLs that Berth supports,
and the server's log shows every command's connections with the URL's application name and
TLS as the URL asked; a parameter Berth does not support is one line naming it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_serve import Serve, assert_one_line, berth_command, berth_env, berth_run, port_free
from tests.tls import DATABASE, TlsPostgres, tls_required, tls_server_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, tls_required]


#: How each cell of the matrix writes its URL: (URL, extra environment) for a server and an
#: application name.
Cell = Callable[[TlsPostgres, str], tuple[str, dict[str, str]]]


def _query(**params: str) -> Cell:
    def cell(server: TlsPostgres, app: str) -> tuple[str, dict[str, str]]:
        host = "localhost" if params.get("sslmode") == "verify-full" else "127.0.0.1"
        query = "&".join(f"{k}={v}" for k, v in {**params, "application_name": app}.items())
        return server.url(host=host, query=query.replace("CA", str(server.ca))), {}
    return cell


def _client_certificate(server: TlsPostgres, app: str) -> tuple[str, dict[str, str]]:
    return server.url(user="berth_cert", host="localhost", query=(
        f"sslmode=verify-full&sslrootcert={server.ca}&sslcert={server.client_cert}"
        f"&sslkey={server.client_key}&application_name={app}")), {}


def _passfile(server: TlsPostgres, app: str) -> tuple[str, dict[str, str]]:
    return server.url(user="berth_pw", query=(
        f"sslmode=require&passfile={server.passfile}&application_name={app}")), {}


def _multi_host(server: TlsPostgres, app: str) -> tuple[str, dict[str, str]]:
    return (f"postgresql://postgres@127.0.0.1:{port_free()},localhost:{server.port}/{DATABASE}"
            f"?target_session_attrs=read-write&sslmode=verify-full&sslrootcert={server.ca}"
            f"&application_name={app}"), {}


def _key_value(server: TlsPostgres, app: str) -> tuple[str, dict[str, str]]:
    return (f"host=localhost port={server.port} user=postgres dbname={DATABASE} "
            f"sslmode=verify-full sslrootcert='{server.ca}' application_name={app} "
            "options='-c statement_timeout=60s'"), {}


def _environment(server: TlsPostgres, app: str) -> tuple[str, dict[str, str]]:
    return "postgresql://", {
        "PGHOST": "localhost", "PGPORT": str(server.port), "PGUSER": "postgres",
        "PGDATABASE": DATABASE, "PGSSLMODE": "verify-full", "PGSSLROOTCERT": str(server.ca),
        "PGAPPNAME": app, "PGCONNECT_TIMEOUT": "10", "PGTARGETSESSIONATTRS": "read-write",
        "PGOPTIONS": "-c statement_timeout=60s",
    }


#: Each cell with whether its connections use TLS.
CELLS: dict[str, tuple[Cell, bool | None]] = {
    "sslmode-disable": (_query(sslmode="disable"), False),
    "sslmode-allow": (_query(sslmode="allow"), None),
    "sslmode-prefer": (_query(sslmode="prefer"), True),
    "sslmode-require": (_query(sslmode="require"), True),
    "sslmode-verify-ca": (_query(sslmode="verify-ca", sslrootcert="CA"), True),
    "sslmode-verify-full": (_query(sslmode="verify-full", sslrootcert="CA"), True),
    "sslcert-sslkey": (_client_certificate, True),
    "passfile": (_passfile, True),
    "connect_timeout": (_query(sslmode="require", connect_timeout="10"), True),
    "options": (_query(sslmode="require", options="-c%20statement_timeout%3D60s"), True),
    "multi-host-target_session_attrs": (_multi_host, True),
    "key-value-form": (_key_value, True),
    "PG-environment": (_environment, True),
}


def _wait_connected(server: TlsPostgres, app: str, proc: subprocess.Popen, err: Path) -> None:
    """Wait until a process has two connections named ``app`` open (then it is running)."""
    deadline = time.monotonic() + 60
    sql = f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'"
    while int(server.psql(sql).strip() or 0) < 2:
        assert proc.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{app} never connected"
        time.sleep(0.2)


def _run(command: str, url: str, env: dict[str, str], server: TlsPostgres, app: str,
         tmp_path: Path) -> None:
    """Run ``command`` on ``url`` until it has done its work on the database."""
    settings = {"BERTH_DATABASE_URL": url, **env}
    if command == "serve":
        serve = Serve(tmp_path, tmp_path / "unused", BERTH_RECONCILER_ENABLED="false",
                      **settings)
        try:
            serve.wait_ready()
        finally:
            serve.kill()
        return
    if command == "reconcile":
        err = tmp_path / "reconcile.err"
        with err.open("w") as out:
            proc = subprocess.Popen([*berth_command(), "reconcile"], cwd=tmp_path,
                                    env=berth_env(**settings), stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL)
        try:
            _wait_connected(server, app, proc, err)
        finally:
            proc.kill()
            proc.wait()
        return
    # The bench's --server-url defaults to BERTH_DATABASE_URL.
    result = berth_run(*COMMANDS[command], cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]


COMMANDS: dict[str, list[str]] = {
    "serve": [],
    "reconcile": [],
    "migrate": ["migrate"],
    "keys": ["keys", "list"],
    "tenants": ["tenants", "list"],
    "bench": ["bench", "e2e", "--pools", "8", "--tasks", "16", "--reconcilers", "1",
              "--skip-naive", "--skip-floor", "--skip-peer"],
}


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_takes_every_url(
    command: str, cell: str, tls_server: TlsPostgres, tmp_path: Path
) -> None:
    app = f"m-{command}-{cell}"[:60]
    write, tls = CELLS[cell]
    url, env = write(tls_server, app)
    _run(command, url, env, tls_server, app, tmp_path)
    lines = [line for line in tls_server.log().splitlines()
             if "connection authorized: user=" in line and f"application_name={app}" in line]
    assert lines, f"no connection named {app} in the server's log"
    if tls is not None:
        assert all(("SSL enabled" in line) == tls for line in lines), lines


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unsupported_parameter_is_one_line_naming_it(command: str, tmp_path: Path) -> None:
    argv = {"serve": ["serve", "--port", "0"], "reconcile": ["reconcile"]}.get(
        command, COMMANDS[command])
    url = "postgresql://berth:hunter2@127.0.0.1:5432/berth?sslmode=require&keepalives=1"
    result = berth_run(*argv, cwd=tmp_path, BERTH_DATABASE_URL=url)
    line = assert_one_line(result, "'keepalives'", "not supported")
    assert "hunter2" not in line
