"""The scheduling core, compiled: the same source, built by mypyc into C extensions.

``pip install`` compiles the modules of :data:`MODULES` with mypyc (``setup.py``) when it
can: each module's source file then has an extension module beside it, which Python imports
instead, and the compiled modules call one another natively. Nothing else changes: the
compiled modules are built from these source files and decide exactly what they decide.

The compiled modules are used as one, all or none. :func:`install` (run by
``app/__init__.py``, so before any of them is imported) puts a finder first in
``sys.meta_path``; when the first of them is imported it decides, once per process, and makes
Python import every one of them from its source file instead when

* ``BERTH_COMPILED=0`` is set, or
* one of them has no extension module (the build could not compile them, or was told not to
  with ``BERTH_COMPILE=0``), or
* a source file is not the one its extension module was built from, or the source file of
  a module of :data:`LAYOUTS` is not the one the build read (then a warning says so:
  ``pip install -e .`` compiles them again).

:func:`active` tells which one a process runs.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

__all__ = [
    "BUILT", "GROUP", "LAYOUTS", "MODULES", "active", "digest", "digests", "install", "record",
    "source_file", "stale",
]

#: The modules mypyc compiles: the pass's planner, the pipeline and its plugins, the
#: displacement planners and the pass record, by dotted name.
MODULES: tuple[str, ...] = tuple(
    f"app.scheduling.{name}"
    for name in (
        "assumed", "cycle", "eta", "fairshare", "framework", "inputs", "nomination", "parking",
        "planner", "policies", "positions", "preemption", "prefilter", "profiles", "reasons",
        "recording", "records", "replay", "results", "shares", "stages", "unsatisfiable",
        "displacement.fairshare", "displacement.nominate", "displacement.preempt",
        "plugins.artifact_locality", "plugins.base", "plugins.capacity", "plugins.cost",
        "plugins.data_residency", "plugins.failure_domain_spread", "plugins.health",
        "plugins.least_loaded", "plugins.names", "plugins.pool_selector",
        "plugins.pool_status", "plugins.preferred_affinity", "plugins.quota",
        "plugins.region", "plugins.registry", "plugins.required_affinity",
        "plugins.runtime_class", "plugins.tenant_access",
    )
)

#: Modules that are not compiled but whose classes the compiled code reads by layout: mypyc
#: reads a ``NamedTuple``'s fields by position (``CompiledSpec``), so a build is only as
#: current as these source files too, and :func:`stale` names them when they changed.
LAYOUTS: tuple[str, ...] = ("app.scheduling.spec",)

#: mypyc's shared library of the compiled modules (``<GROUP>__mypyc``, beside ``app/``): the
#: extension of each module only loads its part of it.
GROUP = "berth_scheduling"
#: Set ``BERTH_COMPILED=0`` to run the source files even where compiled modules exist.
ENV = "BERTH_COMPILED"
#: What the build compiled: ``{"sources": {module: sha256 of its source file}}``, written
#: beside this file by ``setup.py`` (:func:`record`) once it compiled them.
BUILT = Path(__file__).resolve().with_name("compiled.json")

_ROOT = Path(__file__).resolve().parent.parent
_log = logging.getLogger("berth.compiled")
_state: dict[str, bool] = {}


def source_file(name: str, root: Path = _ROOT) -> Path:
    """Return the source file of the module ``name`` under ``root``."""
    return root.joinpath(*name.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    """Return the sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extension(source: Path) -> Path | None:
    """Return the extension module of ``source`` (the same path with an extension's suffix),
    or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = source.with_suffix(suffix)
        if path.exists():
            return path
    return None


def digests(modules: Sequence[str] = MODULES, root: Path = _ROOT,
            layouts: Sequence[str] = LAYOUTS) -> dict[str, str]:
    """Return the digest of each of the ``modules``' and ``layouts``' source files under
    ``root``."""
    return {name: digest(source_file(name, root)) for name in (*modules, *layouts)}


def record(built_file: Path, sources: Mapping[str, str]) -> None:
    """Write to ``built_file`` the digests of the source files compiled (:func:`digests`),
    which :func:`stale` compares the source files with."""
    built_file.write_text(json.dumps({"sources": dict(sources)}, indent=1, sort_keys=True)
                          + "\n")


def stale(modules: Sequence[str] = MODULES, root: Path = _ROOT, built_file: Path = BUILT,
          layouts: Sequence[str] = LAYOUTS) -> tuple[list[str], list[str]]:
    """Return the ``modules`` (under ``root``) that the build (``built_file``) did not
    compile, all of them when it compiled none (or mypyc's shared library is missing), and
    those whose source file changed since, with the ``layouts`` whose source file is not the
    one the build read."""
    try:
        built = json.loads(built_file.read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return list(modules), []
    if _extension(root / f"{GROUP}__mypyc") is None:
        return list(modules), []
    missing, changed = [], []
    for name in modules:
        source = source_file(name, root)
        if name not in built or _extension(source) is None:
            missing.append(name)
        elif digest(source) != built[name]:
            changed.append(name)
    changed.extend(name for name in layouts
                   if built.get(name) != digest(source_file(name, root)))
    return missing, changed


class _Finder:
    """Import the compiled modules' source files instead of their extensions when the
    compiled modules do not run (decided when the first of them is imported)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name not in _SOURCES or active():
            return None
        return importlib.util.spec_from_file_location(name, source_file(name))


_SOURCES = frozenset(MODULES)


def install() -> None:
    """Put the finder of the compiled modules first in ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def active() -> bool:
    """Return whether this process runs the compiled modules (decided on the first call)."""
    compiled = _state.get("active")
    if compiled is None:
        wanted = os.environ.get(ENV, "1") != "0"
        missing, changed = stale() if wanted else ([], [])
        compiled = _state["active"] = wanted and not missing and not changed
        if wanted and changed and not missing:
            _log.warning(
                "%s changed after it was compiled: the scheduler runs its source files "
                "(pip install -e . compiles them again)", source_file(changed[0]))
    return compiled
