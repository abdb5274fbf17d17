"""A pass reports its reconciler's CPU by phase, and its log line carries it."""

from __future__ import annotations

from app.config import SHARD_SLOTS
from app.cpu_phases import CpuPhases, cpu_phase, cpu_phases_installed
from app.db import Database
from app.reconciler import Reconciler, ReconcilerConfig
from tests.factories import NOW, heartbeat_add, pool_add, spec_make, tasks_add

ALL = frozenset(range(SHARD_SLOTS))


def _spin() -> None:
    sum(i * i for i in range(20_000))


def test_a_marked_block_is_charged_to_its_phase_and_the_interrupted_one_resumes() -> None:
    phases = CpuPhases()
    with cpu_phases_installed(phases):
        phases.switch("commit")
        _spin()
        with cpu_phase("commit_build"):
            _spin()
        assert phases.phase == "commit"
        _spin()
    assert phases.phase is None
    assert set(phases.seconds) == {"commit", "commit_build"}
    assert phases.seconds["commit"] > 0 and phases.seconds["commit_build"] > 0


def test_outside_a_pass_a_marked_block_charges_nothing() -> None:
    phases = CpuPhases()
    with cpu_phase("commit_build"):
        _spin()
    assert phases.seconds == {}


async def test_a_pass_reports_cpu_by_phase(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        await tasks_add(conn, tenant="t1", count=3, spec=spec_make(cpu=100))
    result = await Reconciler(db, ReconcilerConfig(), owner_id="test", slots=ALL).run_once(
        now=NOW)
    assert result.leased == 3
    assert {"claim", "read", "plan", "commit_build", "commit"} <= set(result.cpu)
    assert all(v >= 0 for v in result.cpu.values())
    logged = result.to_log()
    assert logged["cpu_plan_ms"] == round(result.cpu["plan"] * 1000, 3)
