"""The floors of app/: api -> services -> scheduling and ledger, never climbing back.

A request's route goes down: app/api and app/services import nothing from app/reconciler
(what both need, the pass configuration and the planner, is below them), and app/scheduling
does no I/O: it imports no database, web or event-loop library, nothing of app/ outside
itself, and reads no clock (time comes in as ``now``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"

#: Libraries whose import means I/O or a clock.
IO_LIBRARIES = {"asyncpg", "sqlalchemy", "fastapi", "starlette", "asyncio", "httpx", "time",
                "socket", "subprocess", "threading", "os", "alembic"}
#: Calls that read a clock.
CLOCK_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"),
               ("date", "today"), ("time", "time"), ("time", "monotonic"),
               ("time", "perf_counter")}


def _modules(folder: str) -> list[Path]:
    return sorted((APP / folder).rglob("*.py"))


def _imported(path: Path) -> set[str]:
    """Return every module ``path`` imports, function-local imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", _modules("services") + _modules("api"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_services_and_api_import_nothing_from_the_reconciler(path: Path) -> None:
    climbing = sorted(m for m in _imported(path)
                      if m == "app.reconciler" or m.startswith("app.reconciler."))
    assert climbing == []


@pytest.mark.parametrize("path", _modules("scheduling"), ids=lambda p: str(p.relative_to(ROOT)))
def test_scheduling_does_no_io(path: Path) -> None:
    imported = _imported(path)
    io = sorted(m for m in imported if m.split(".")[0] in IO_LIBRARIES)
    outside = sorted(m for m in imported
                     if m.startswith("app") and not m.startswith("app.scheduling"))
    clocks = sorted(
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and (node.func.value.id, node.func.attr) in CLOCK_CALLS
    )
    assert (io, outside, clocks) == ([], [], [])


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """A module that imports the reconciler, asyncpg and reads the clock is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncpg\nfrom app.reconciler.passes import pass_run\n"
                   "from datetime import datetime\nx = datetime.now()\n")
    assert "app.reconciler.passes" in _imported(bad)
    assert "asyncpg" in _imported(bad)
