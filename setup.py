"""Build Berth; compile the scheduling core with mypyc where a C compiler is at hand.

The modules of ``app/compiled.py`` are compiled from their source files into C extensions.
Once they are built, the sha256 of each source file compiled is written beside them, to
``app/compiled.json`` (in the source tree for an editable install, in the wheel otherwise):
at import, the extensions run only if every one is there and every source file is still the
one compiled (``app.compiled``). Set ``BERTH_COMPILE=0`` to install the source files alone.
A build that cannot compile them (no mypyc, no C compiler) says so and installs the source
files alone. An editable install made again keeps the extensions already in the source tree
when they were compiled from its current sources.
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_HERE = Path(__file__).resolve().parent
_COMPILED = runpy.run_path(str(_HERE / "app" / "compiled.py"))
#: The digests of the source files the extensions are compiled from, and of those whose
#: classes they read by layout (taken before mypyc reads them).
_COMPILED_FROM = _COMPILED["digests"](_COMPILED["MODULES"], _HERE, _COMPILED["LAYOUTS"])
#: The commands that build what is installed (metadata and source distributions compile
#: nothing).
_BUILDS = frozenset({"build", "build_ext", "bdist_wheel", "editable_wheel", "develop",
                     "install"})


def _forget() -> None:
    """Remove what an earlier build compiled into the source tree (an editable install puts
    the extensions beside their sources), so that none outlives its source."""
    _COMPILED["BUILT"].unlink(missing_ok=True)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        (_HERE / f"{_COMPILED['GROUP']}__mypyc{suffix}").unlink(missing_ok=True)
        for name in _COMPILED["MODULES"]:
            _COMPILED["source_file"](name, _HERE).with_suffix(suffix).unlink(missing_ok=True)


class _OptionalBuildExt(build_ext):
    """Build the compiled modules and record their sources; when that fails, leave the
    source files to run."""

    def run(self) -> None:
        if not any(ext.sources for ext in self.extensions):
            return  # none, or an editable install's current ones, named but not rebuilt
        # In place (an editable install) the extensions land beside their sources; otherwise
        # in the build directory, which the wheel is made of.
        in_tree = bool(self.inplace)
        if in_tree:
            _forget()
        try:
            super().run()
        except Exception as exc:  # any failure leaves the source files to run
            if in_tree:
                _forget()
            print(f"berth: the scheduling core was not compiled ({exc}); its source files "
                  "run", file=sys.stderr)
            return
        root = _HERE if in_tree else Path(self.build_lib)
        _COMPILED["record"](root / "app" / "compiled.json", _COMPILED_FROM)


#: mypy's options for a second try at the compile. mypy reads the interpreter's own
#: site-packages even inside pip's isolated build, before this install has brought its
#: dependencies: an older package there (say orjson without ``Fragment``) fails the type check.
#: The second try reads the project's sources and mypy's own stubs only; third-party values are
#: then of type Any (a few percent more instructions in the planner than with their types).
_ISOLATED = ("--no-site-packages", "--ignore-missing-imports")


def _extensions() -> list:
    """Return mypyc's extensions of the compiled modules: none when not building, when told
    not to compile or without mypyc (an editable install then drops the extensions an
    earlier one compiled); when an editable install's extensions are current, their names
    without sources (nothing is built)."""
    if not _BUILDS.intersection(sys.argv[1:]):
        return []
    editable = "editable_wheel" in sys.argv[1:]
    wanted = os.environ.get("BERTH_COMPILE", "1") != "0"
    if editable and wanted and not any(
        _COMPILED["stale"](_COMPILED["MODULES"], _HERE, _COMPILED["BUILT"], _COMPILED["LAYOUTS"])
    ):
        print("berth: the scheduling core is compiled from these sources already",
              file=sys.stderr)
        # Named without sources, so not built: the install maps the top-level names of its
        # extensions, and mypyc's shared library is one (without it, a process whose path
        # does not hold the source tree, the console script's, cannot load the compiled
        # modules).
        return [Extension(name, sources=[])
                for name in (f"{_COMPILED['GROUP']}__mypyc", *_COMPILED["MODULES"])]
    why = "BERTH_COMPILE=0"
    if wanted:
        try:
            from mypyc.build import mypycify
        except ImportError:
            why = "mypyc is not installed"
        else:
            paths = [str(_COMPILED["source_file"](name, _HERE).relative_to(_HERE))
                     for name in _COMPILED["MODULES"]]
            for options in ((), _ISOLATED):
                try:
                    return mypycify([*options, *paths], opt_level="3",
                                    group_name=_COMPILED["GROUP"])
                except SystemExit:  # mypyc's type check failed; it printed why
                    why = "mypyc's type check failed (above)"
                    if not options:
                        print("berth: compiling again without the installed packages' types",
                              file=sys.stderr)
    if editable:
        _forget()
    print(f"berth: the scheduling core is not compiled ({why}); its source files run",
          file=sys.stderr)
    return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
