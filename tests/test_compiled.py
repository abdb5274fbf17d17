"""The compiled scheduling core (app/compiled.py): the same source, the same decisions, all
modules or none."""

from __future__ import annotations

import gc
import importlib.machinery
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from app import compiled
from app.scheduling.assumed import Assumed
from app.scheduling.framework import select
from app.scheduling.inputs import PassInputs
from app.scheduling.planner import plan_pass
from tests.scheduling.test_recording import pass_inputs

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Plans the passes hypothesis draws (derandomized: the same ones in every process) and
#: prints whether the core ran compiled, then the plans' digests.
_PLANS = textwrap.dedent("""
    import sys
    from hypothesis import HealthCheck, given, settings

    from app.compiled import active
    from app.scheduling.planner import plan_pass
    from app.scheduling.recording import plan_digest
    from tests.scheduling.test_recording import pass_inputs

    digests = []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(pass_inputs())
    def plans(inputs):
        digests.append(plan_digest(plan_pass(inputs)))

    plans()
    print(active(), len(digests), " ".join(digests))
""")


def _run(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
        env={**os.environ, **env}, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _require_compiled() -> None:
    """Skip where the build compiled nothing; under CI (``CI=true``) the build must have."""
    if compiled.active():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI runs an uncompiled scheduling core: {compiled.stale()}")
    pytest.skip("the scheduling core is not compiled here (pip install -e . compiles it)")


def test_ci_installs_the_compiled_core() -> None:
    _require_compiled()
    import app.scheduling.framework as framework

    assert Path(framework.__file__).suffix != ".py"


def test_the_installed_core_imports_from_any_directory(tmp_path: Path) -> None:
    # As the console script `berth` runs: neither the checkout nor PYTHONPATH on sys.path,
    # only what the install maps, which must include mypyc's shared library (an editable
    # install made again, its extensions current, once left it out).
    _require_compiled()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-P", "-c",
         "import app.scheduling.planner, app.compiled; print(app.compiled.active())"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True"]


def test_the_compiled_core_plans_as_its_source_does() -> None:
    _require_compiled()
    source = _run(_PLANS, BERTH_COMPILED="0").split()
    built = _run(_PLANS).split()
    assert source[0] == "False" and built[0] == "True"
    assert int(source[1]) >= 30
    assert built == ["True", *source[1:]]


def test_berth_compiled_0_runs_every_module_from_its_source() -> None:
    out = _run(textwrap.dedent("""
        import importlib
        from app.compiled import MODULES, active
        files = {importlib.import_module(m).__file__.rsplit(".", 1)[-1] for m in MODULES}
        print(active(), sorted(files))
    """), BERTH_COMPILED="0")
    assert out.split() == ["False", "['py']"]


def _tree(tmp_path: Path, modules: dict[str, bytes], extensions: list[str]) -> None:
    """Write the ``modules``' source files under ``tmp_path``, an (empty) extension beside
    those of ``extensions``, and mypyc's shared library."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name, text in modules.items():
        source = compiled.source_file(name, tmp_path)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(text)
        if name in extensions:
            source.with_suffix(suffix).write_bytes(b"")
    (tmp_path / f"{compiled.GROUP}__mypyc{suffix}").write_bytes(b"")


def test_a_source_changed_since_its_build_or_a_missing_extension_is_named(
    tmp_path: Path,
) -> None:
    sources = {"pkg.a": b"A = 1\n", "pkg.b": b"B = 2\n", "pkg.c": b"C = 3\n"}
    names = list(sources)
    _tree(tmp_path, sources, ["pkg.a", "pkg.b"])
    built = tmp_path / "compiled.json"
    compiled.record(built, compiled.digests(names, tmp_path, ()))
    assert compiled.stale(names, tmp_path, built, ()) == (["pkg.c"], [])
    compiled.source_file("pkg.b", tmp_path).write_bytes(b"B = 20\n")
    assert compiled.stale(names[:2], tmp_path, built, ()) == ([], ["pkg.b"])
    assert compiled.stale(names[:1], tmp_path, built, ()) == ([], [])
    # No record of a build: nothing was compiled.
    assert compiled.stale(names, tmp_path, tmp_path / "none.json", ()) == (names, [])
    # Without mypyc's shared library no extension can load.
    next(tmp_path.glob(f"{compiled.GROUP}__mypyc*")).unlink()
    assert compiled.stale(names[:1], tmp_path, built, ()) == (names[:1], [])


def test_a_module_read_by_layout_changed_since_the_build_is_named(tmp_path: Path) -> None:
    """The compiled code reads a NamedTuple of a module it does not compile by position: a
    build made before that module changed (or before it was recorded) is stale."""
    sources = {"pkg.a": b"A = 1\n", "pkg.shapes": b"class T(NamedTuple): x: int\n"}
    _tree(tmp_path, sources, ["pkg.a"])
    built = tmp_path / "compiled.json"
    compiled.record(built, compiled.digests(["pkg.a"], tmp_path, ["pkg.shapes"]))
    assert compiled.stale(["pkg.a"], tmp_path, built, ["pkg.shapes"]) == ([], [])
    compiled.source_file("pkg.shapes", tmp_path).write_bytes(
        b"class T(NamedTuple): y: str; x: int\n")
    assert compiled.stale(["pkg.a"], tmp_path, built, ["pkg.shapes"]) == ([], ["pkg.shapes"])
    # A build that did not record the module read it as it was then, unknown now.
    compiled.record(built, compiled.digests(["pkg.a"], tmp_path, []))
    assert compiled.stale(["pkg.a"], tmp_path, built, ["pkg.shapes"]) == ([], ["pkg.shapes"])


def test_the_compiled_core_reads_the_spec_by_layout() -> None:
    """``CompiledSpec`` is a NamedTuple whose fields mypyc reads by position, so the module
    defining it is one whose change makes the build stale."""
    from app.scheduling.spec import CompiledSpec

    assert issubclass(CompiledSpec, tuple)
    assert CompiledSpec.__module__ in compiled.LAYOUTS


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(inputs=pass_inputs())
def test_a_pass_and_its_explanations_leave_no_cycles_for_the_collector(
    inputs: PassInputs,
) -> None:
    """A reconciler pauses the collector during a pass and freezes what the pass left alive
    (app/gc_tuning.py): a pass must leave nothing in reference cycles, or it would stay
    frozen with everything it holds (the pass's snapshot and overlay) until a full
    collection. Compiled, a nested function and its environment hold each other, so the
    core defines none."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        plan = plan_pass(inputs)
        assumed = Assumed(inputs.snapshot)
        for _, spec in inputs.tasks:
            select(spec, inputs.snapshot, assumed=assumed, explain=True)
        del plan, assumed
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def _extensions_built(
    monkeypatch: pytest.MonkeyPatch, outcomes: list[object]
) -> tuple[object, list[list[str]]]:
    """Run setup.py for ``build_ext`` with mypyc's ``mypycify`` answering ``outcomes`` in turn
    (an exception is raised); return the extensions it gave setup() and each call's
    arguments. Nothing is compiled."""
    import runpy
    import types

    import setuptools

    calls: list[list[str]] = []

    def mypycify(paths: list[str], **_: object) -> object:
        calls.append(paths)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    given: dict[str, object] = {}
    fake = types.ModuleType("mypyc.build")
    fake.mypycify = mypycify  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mypyc.build", fake)
    monkeypatch.setattr(setuptools, "setup", lambda **kw: given.update(kw))
    monkeypatch.setattr(sys, "argv", ["setup.py", "build_ext"])
    monkeypatch.delenv("BERTH_COMPILE", raising=False)
    runpy.run_path(str(REPO_ROOT / "setup.py"))
    return given["ext_modules"], calls


def test_the_build_compiles_with_the_installed_packages_types_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built, calls = _extensions_built(monkeypatch, [["ext"]])
    assert built == ["ext"]
    assert len(calls) == 1
    assert not [a for a in calls[0] if a.startswith("--")]
    assert "app/scheduling/planner.py" in calls[0]
    assert "berth:" not in capsys.readouterr().err


def test_a_failed_type_check_compiles_again_without_the_installed_packages(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An older package in the interpreter's site-packages fails mypyc's type check (mypycify
    # exits); the second try reads no site-packages.
    built, calls = _extensions_built(monkeypatch, [SystemExit(1), ["ext"]])
    assert built == ["ext"]
    assert calls[1][:2] == ["--no-site-packages", "--ignore-missing-imports"]
    assert calls[1][2:] == calls[0]
    assert "compiling again without the installed packages' types" in capsys.readouterr().err


def test_a_build_whose_type_checks_both_fail_installs_the_source_files(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built, calls = _extensions_built(monkeypatch, [SystemExit(1), SystemExit(1)])
    assert built == []
    assert len(calls) == 2
    err = capsys.readouterr().err
    assert "not compiled (mypyc's type check failed (above)); its source files run" in err
