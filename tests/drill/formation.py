"""A pg_auto_failover formation on this machine: a monitor, a primary and its standbys.

Each node is a ``pg_autoctl create … --run`` process (its keeper and its PostgreSQL) in a
temporary directory, on loopback ports, with TLS on (pg_autoctl's self-signed certificates:
its URIs say ``sslmode=require``) and trust authentication. pg_autoctl refuses to run as
root, so under root every node runs as the ``postgres`` user (setpriv), in a directory that
user owns.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import psutil

from tests.test_serve import port_free


def _pg_bin() -> Path:
    """Return the PostgreSQL bin directory that has pg_autoctl (Debian's layout), newest
    first, else PostgreSQL 15's."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_autoctl"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()
DATABASE = "berth"
#: How long a node gets to reach a state (a base backup included) before the drill fails.
STATE_DEADLINE_SECONDS = 180


def pg_autoctl_path() -> str | None:
    """Return pg_autoctl's path, or None when pg_auto_failover is not installed."""
    return shutil.which("pg_autoctl") or (
        str(PG_BIN / "pg_autoctl") if (PG_BIN / "pg_autoctl").exists() else None
    )


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


@dataclass
class Node:
    """One data node: its name, port, data directory and keeper process."""

    name: str
    port: int
    pgdata: Path
    proc: subprocess.Popen | None = None


@dataclass
class Formation:
    """The monitor and two nodes of one drill, in ``root`` (removed by :meth:`destroy`)."""

    root: Path
    monitor_port: int
    nodes: list[Node] = field(default_factory=list)
    monitor: subprocess.Popen | None = None

    @classmethod
    def create(cls, *, nodes: int = 2, keeper: dict[str, str] | None = None) -> Formation:
        """Start a monitor, then a primary, then its standbys one by one; return when every
        node is ready. ``keeper``: pg_autoctl settings of every node (``timeout.…``)."""
        root = Path(tempfile.mkdtemp(prefix="berth-drill-"))
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(root, pg.pw_uid, pg.pw_gid)
        formation = cls(root=root, monitor_port=port_free())
        try:
            formation._monitor_start()
            for index in range(1, nodes + 1):
                node = Node(f"node{index}", port_free(), root / f"node{index}")
                formation.nodes.append(node)
                formation._node_start(node)
                want = {"node1": "single" if index == 1 else "primary"}
                want |= {f"node{i}": "secondary" for i in range(2, index + 1)}
                formation.wait_states(want, nudge=None if index == 1 else "node1")
            for node in formation.nodes:
                for name, value in (keeper or {}).items():
                    formation.autoctl("config", "set", name, value, pgdata=node.pgdata)
                formation.autoctl("reload", pgdata=node.pgdata)
        except BaseException:
            formation.destroy()
            raise
        return formation

    # --- processes ------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "BERTH_"))}
        env["PATH"] = f"{PG_BIN}{os.pathsep}{env.get('PATH', '')}"
        for var, sub in (("HOME", "home"), ("XDG_CONFIG_HOME", "config"),
                         ("XDG_DATA_HOME", "data"), ("XDG_RUNTIME_DIR", "run")):
            env[var] = str(self.root / sub)
        return env

    def _popen(self, args: list[str], log: str) -> subprocess.Popen:
        for sub in ("home", "config", "data", "run"):
            (self.root / sub).mkdir(exist_ok=True)
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", str(self.root)], check=True)
        with (self.root / log).open("a") as out:
            return subprocess.Popen(
                [*_as_postgres(), pg_autoctl_path() or "pg_autoctl", *args],
                cwd=self.root, env=self._env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def autoctl(self, *args: str, timeout: float = 120, pgdata: Path | None = None) -> str:
        """Run a pg_autoctl command against the monitor (or the node of ``pgdata``) and
        return its output."""
        result = subprocess.run(
            [*_as_postgres(), pg_autoctl_path() or "pg_autoctl", *args,
             "--pgdata", str(pgdata or self.root / "monitor")],
            cwd=self.root, env=self._env(), capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_autoctl {' '.join(args)}: {result.stderr or result.stdout}")
        return result.stdout

    def _monitor_start(self) -> None:
        self.monitor = self._popen(
            ["create", "monitor", "--pgdata", str(self.root / "monitor"),
             "--pgport", str(self.monitor_port), "--hostname", "127.0.0.1",
             "--listen", "127.0.0.1", "--auth", "trust", "--ssl-self-signed", "--run"],
            "monitor.log",
        )
        # Wait for the monitor's PostgreSQL before any other pg_autoctl command: two of them
        # creating the state directories of one data directory at once fail (EEXIST).
        deadline = time.monotonic() + STATE_DEADLINE_SECONDS
        while True:
            ready = subprocess.run(
                [str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                 str(self.monitor_port), "-d", "pg_auto_failover"], check=False,
            ).returncode == 0
            if ready:
                try:
                    self.autoctl("show", "state")
                    return
                except RuntimeError:
                    pass
            if self.monitor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.log("monitor.log"))
            time.sleep(0.5)

    def _node_start(self, node: Node) -> None:
        monitor = f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"
        node.proc = self._popen(
            ["create", "postgres", "--pgdata", str(node.pgdata), "--pgport", str(node.port),
             "--pgctl", str(PG_BIN / "pg_ctl"), "--hostname", "127.0.0.1",
             "--listen", "127.0.0.1", "--name", node.name, "--dbname", DATABASE,
             "--monitor", f"{monitor}?sslmode=require", "--auth", "trust", "--ssl-self-signed",
             "--run"],
            f"{node.name}.log",
        )

    def node_restart(self, name: str) -> None:
        """Start a killed node's keeper again (it rejoins as a standby of the new primary)."""
        node = self.node(name)
        node.proc = self._popen(["run", "--pgdata", str(node.pgdata)], f"{node.name}.log")

    def node_kill(self, name: str) -> None:
        """SIGKILL a node's keeper and its PostgreSQL (every process of it at once)."""
        node = self.node(name)
        assert node.proc is not None
        procs = _tree(node.proc.pid) + _postmaster_tree(node.pgdata)
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        node.proc.wait()

    def destroy(self) -> None:
        """Kill every process of the formation and remove its directory."""
        procs: list[psutil.Process] = []
        for proc in [self.monitor, *(n.proc for n in self.nodes)]:
            if proc is not None:
                procs += _tree(proc.pid)
        for pgdata in [self.root / "monitor", *(n.pgdata for n in self.nodes)]:
            procs += _postmaster_tree(pgdata)
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- state ----------------------------------------------------------------------------

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def log(self, name: str) -> str:
        path = self.root / name
        return path.read_text()[-4000:] if path.exists() else ""

    def states(self) -> dict[str, tuple[str, str]]:
        """Return (reported, assigned) state by node name, as the monitor sees them."""
        rows = json.loads(self.autoctl("show", "state", "--json") or "[]")
        return {r["nodename"]: (r["current_group_state"], r["assigned_group_state"])
                for r in rows}

    def wait_states(self, want: dict[str, str], *, nudge: str | None = None) -> None:
        """Wait until every node of ``want`` reports and is assigned its state.

        ``nudge``: a node to CHECKPOINT meanwhile, so a base backup taken from it does not wait
        for a spread checkpoint (pg_basebackup's default).
        """
        deadline = time.monotonic() + STATE_DEADLINE_SECONDS
        states: dict[str, tuple[str, str]] = {}
        while time.monotonic() < deadline:
            states = self.states()
            if all(states.get(name) == (state, state) for name, state in want.items()):
                return
            if nudge is not None:
                asyncio.run(_checkpoint(self.node(nudge).port))
            time.sleep(1)
        logs = "\n".join(self.log(f"{n}.log") for n in want)
        raise AssertionError(f"states {states}, wanted {want}:\n{logs}")

    def url(self) -> str:
        """Return the multi-host URL of the formation's database as pg_autoctl hands it out:
        every node, ``target_session_attrs=read-write&sslmode=require``, and no user (a
        client takes it from PGUSER)."""
        uri = self.autoctl("show", "uri", "--formation", "default").strip()
        assert "sslmode=require" in uri and "target_session_attrs=read-write" in uri, uri
        return uri

    def node_url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.node(name).port}/{DATABASE}"


async def _checkpoint(port: int) -> None:
    try:
        conn = await asyncpg.connect(
            f"postgresql://postgres@127.0.0.1:{port}/postgres", timeout=2
        )
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return
    try:
        await conn.execute("CHECKPOINT")
    except asyncpg.PostgresError:
        pass
    finally:
        await conn.close()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _postmaster_tree(pgdata: Path) -> list[psutil.Process]:
    """Return the postmaster of ``pgdata`` and its backends (if it runs)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return []
    return _tree(pid)
