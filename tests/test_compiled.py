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
    compiled.record(built, compiled.digests(names, tmp_path))
    assert compiled.stale(names, tmp_path, built) == (["pkg.c"], [])
    compiled.source_file("pkg.b", tmp_path).write_bytes(b"B = 20\n")
    assert compiled.stale(names[:2], tmp_path, built) == ([], ["pkg.b"])
    assert compiled.stale(names[:1], tmp_path, built) == ([], [])
    # No record of a build: nothing was compiled.
    assert compiled.stale(names, tmp_path, tmp_path / "none.json") == (names, [])
    # Without mypyc's shared library no extension can load.
    next(tmp_path.glob(f"{compiled.GROUP}__mypyc*")).unlink()
    assert compiled.stale(names[:1], tmp_path, built) == (names[:1], [])


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
