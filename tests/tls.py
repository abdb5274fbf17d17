"""A throwaway PostgreSQL 15 cluster with TLS on, made for a test run.

``openssl`` makes a CA, a server certificate it signs (for ``localhost`` only, so that
``sslmode=verify-full`` on ``127.0.0.1`` is refused as the wrong host), a client certificate
and a second CA that signed nothing of this server. ``initdb`` makes the cluster in a
temporary directory, on a free loopback port, with ``log_connections`` on: each connection's
log line says its application name and whether it uses TLS. Roles:

- ``postgres``: trust, with or without TLS;
- ``berth_pw``: a password (for ``passfile``), TLS only;
- ``berth_cert``: the client certificate (``sslcert``/``sslkey``), TLS only.

Under root the cluster runs as the ``postgres`` user (PostgreSQL refuses root), in a
directory that user owns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_serve import berth_run, port_free

PG_BIN = Path("/usr/lib/postgresql/15/bin")
DATABASE = "berth"
PASSWORD = "tls-s3cret"


def tls_available() -> str | None:
    """Return why a TLS cluster cannot be made here, or None when it can."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL 15 in {PG_BIN} (Debian: postgresql-15)"
    if shutil.which("openssl") is None:
        return "no openssl"
    return None


#: Skip where no cluster can be made, except under CI, where the tests must run.
tls_required = pytest.mark.skipif(
    tls_available() is not None and os.environ.get("CI", "").lower() not in ("true", "1"),
    reason="a TLS cluster needs PostgreSQL 15's initdb and openssl; .ci/run has both",
)


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificate(cwd: Path, name: str, subject: str, *, ca: str, san: str | None) -> None:
    """Make ``name``.key and ``name``.crt signed by CA ``ca``."""
    _openssl("req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=cwd)
    extra: list[str] = []
    if san is not None:
        (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        extra = ["-extfile", f"{name}.ext"]
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *extra, cwd=cwd)


@dataclass
class TlsPostgres:
    """The cluster: its directory, port and the files a client needs."""

    root: Path
    port: int

    @property
    def ca(self) -> Path:
        """The CA that signed the server's certificate."""
        return self.root / "ca.crt"

    @property
    def wrong_ca(self) -> Path:
        """A CA that signed nothing of this server's."""
        return self.root / "other-ca.crt"

    @property
    def client_cert(self) -> Path:
        return self.root / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.root / "client-local.key"

    @property
    def passfile(self) -> Path:
        return self.root / "pgpass"

    def url(self, *, user: str = "postgres", host: str = "127.0.0.1",
            database: str = DATABASE, query: str = "") -> str:
        """Return a URI for this cluster."""
        return f"postgresql://{user}@{host}:{self.port}/{database}" + (f"?{query}" if query
                                                                       else "")

    def log(self) -> str:
        """Return the server's log so far."""
        return (self.root / "server.log").read_text(errors="replace")

    @classmethod
    def start(cls) -> TlsPostgres:
        """Make the certificates and the cluster, start it and return it."""
        root = Path(tempfile.mkdtemp(prefix="berth-tls-"))
        server = cls(root=root, port=port_free())
        try:
            server._certificates()
            server._cluster()
        except BaseException:
            server.stop()
            raise
        return server

    def _certificates(self) -> None:
        root = self.root
        for ca in ("ca", "other-ca"):
            _openssl("req", "-new", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "2",
                     "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                     "-subj", f"/CN=Berth test {ca}", cwd=root)
        _certificate(root, "server", "/CN=localhost", ca="ca", san="DNS:localhost")
        _certificate(root, "client", "/CN=berth_cert", ca="ca", san=None)
        # The client's key as the test process reads it (libpq wants it private).
        shutil.copy(root / "client.key", self.client_key)
        self.client_key.chmod(0o600)
        self.passfile.write_text(f"127.0.0.1:{self.port}:*:berth_pw:{PASSWORD}\n")
        self.passfile.chmod(0o600)

    def _cluster(self) -> None:
        data = self.root / "data"
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            for path in (self.root, self.root / "server.key", self.root / "server.crt",
                         self.root / "ca.crt"):
                os.chown(path, pg.pw_uid, pg.pw_gid)
        (self.root / "server.key").chmod(0o600)
        subprocess.run([*_as_postgres(), str(PG_BIN / "initdb"), "-D", str(data), "-U",
                        "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True)
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nssl = on\n"
                f"ssl_cert_file = '{self.root / 'server.crt'}'\n"
                f"ssl_key_file = '{self.root / 'server.key'}'\n"
                f"ssl_ca_file = '{self.root / 'ca.crt'}'\n"
                "log_connections = on\nfsync = off\nmax_connections = 200\n"
            )
        (data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all berth_cert 127.0.0.1/32 cert\n"
            "hostssl all berth_pw 127.0.0.1/32 scram-sha-256\n"
            "host all postgres 127.0.0.1/32 trust\n"
        )
        subprocess.run([*_as_postgres(), str(PG_BIN / "pg_ctl"), "-D", str(data), "-l",
                        str(self.root / "server.log"), "-w", "-t", "60", "start"],
                       check=True, capture_output=True)
        self.psql(
            f"CREATE ROLE berth_pw LOGIN SUPERUSER PASSWORD '{PASSWORD}';"
            "CREATE ROLE berth_cert LOGIN SUPERUSER"
        )
        self.psql(f"CREATE DATABASE {DATABASE}")

    def psql(self, sql: str, *, database: str = "postgres") -> str:
        """Run ``sql`` over the cluster's Unix socket and return its output."""
        done = subprocess.run(
            [str(PG_BIN / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", "postgres",
             "-d", database, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql],
            check=True, capture_output=True, text=True,
        )
        return done.stdout

    def stop(self) -> None:
        """Stop the cluster and remove its directory."""
        data = self.root / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run([*_as_postgres(), str(PG_BIN / "pg_ctl"), "-D", str(data), "-m",
                            "immediate", "-w", "stop"], capture_output=True)
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session", name="tls_server")
def tls_server_fixture() -> Iterator[TlsPostgres]:
    """Yield a PostgreSQL with TLS on, migrated, for the whole session (per worker)."""
    server = TlsPostgres.start()
    try:
        migrated = berth_run("migrate", cwd=server.root,
                             BERTH_DATABASE_URL=server.url(query="sslmode=require"))
        assert migrated.returncode == 0, migrated.stderr
        yield server
    finally:
        server.stop()
