"""Build Berth; compile the scheduling core with mypyc where a C compiler is at hand.

The modules of ``app/compiled.py`` are compiled from their source files into C
extensions, and the sha256 of each source file compiled is written to
``app/compiled.json``: at import, the extensions run only if every one is there
and every source file is still the one compiled (``app.compiled``). Set
``BERTH_COMPILE=0`` to install the source files alone. A build that cannot compile them (no
mypyc, no C compiler) says so and installs the source files alone. An editable install made
again keeps the extensions already in the source tree when they were compiled from its
current sources.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

_HERE = Path(__file__).resolve().parent
_COMPILED = runpy.run_path(str(_HERE / "app" / "compiled.py"))
#: The name of mypyc's shared library of the compiled modules (``<group>__mypyc``).
_GROUP = "berth_scheduling"
#: The commands that build what is installed (metadata and source distributions compile
#: nothing).
_BUILDS = frozenset({"build", "build_ext", "bdist_wheel", "editable_wheel", "develop",
                     "install"})


def _forget() -> None:
    """Remove what an earlier build compiled into the source tree (an editable install puts
    the extensions beside their sources), so that none outlives its source."""
    _COMPILED["BUILT"].unlink(missing_ok=True)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        (_HERE / f"{_GROUP}__mypyc{suffix}").unlink(missing_ok=True)
        for name in _COMPILED["MODULES"]:
            _COMPILED["source_file"](name, _HERE).with_suffix(suffix).unlink(missing_ok=True)


def _compiled_in_place() -> bool:
    """Return whether the source tree holds extensions compiled from its current sources,
    for this Python (an editable install, installed again, keeps them)."""
    if os.environ.get("BERTH_COMPILE", "1") == "0":
        return False
    missing, changed = _COMPILED["stale"](_COMPILED["MODULES"], _HERE, _COMPILED["BUILT"])
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    group = any((_HERE / f"{_GROUP}__mypyc{suffix}").exists() for suffix in suffixes)
    return not missing and not changed and group


class _OptionalBuildExt(build_ext):
    """Build the compiled modules; when that fails, leave the source files to run."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any failure leaves the source files to run
            _forget()
            print(f"berth: the scheduling core was not compiled ({exc}); its source files "
                  "run", file=sys.stderr)


def _extensions() -> list:
    """Return mypyc's extensions of the compiled modules, having written their sources'
    digests; none when told not to compile or without mypyc."""
    if not _BUILDS.intersection(sys.argv[1:]):
        return []
    if "editable_wheel" in sys.argv[1:] and _compiled_in_place():
        print("berth: the scheduling core is compiled from these sources already",
              file=sys.stderr)
        return []
    _forget()
    if os.environ.get("BERTH_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("berth: mypyc is not installed; the scheduling core's source files run",
              file=sys.stderr)
        return []
    modules = _COMPILED["MODULES"]
    sources = {name: _COMPILED["source_file"](name, _HERE) for name in modules}
    _COMPILED["BUILT"].write_text(json.dumps(
        {"sources": {name: _COMPILED["digest"](path) for name, path in sources.items()}},
        indent=1, sort_keys=True) + "\n")
    paths = [str(path.relative_to(_HERE)) for path in sources.values()]
    return mypycify(paths, opt_level="3", group_name=_GROUP)


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
