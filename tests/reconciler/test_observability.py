"""Metrics and configuration: fixed label sets, counts that follow a pass, settings mapping."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import REGISTRY, generate_latest

from app.config import SHARD_SLOTS, Settings
from app.db import Database
from app.ledger.wakeups import WakeSource
from app.reconciler import Reconciler, ReconcilerConfig
from app.reconciler.passes import REASON_PLUGIN
from app.scheduling.reasons import Reason
from tests.factories import NOW, heartbeat_add, pool_add, spec_make, tasks_add

ALL = frozenset(range(SHARD_SLOTS))


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_pass_counts_outcomes_rejections_and_queue_wait(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(1000, 1000, 0))
        await heartbeat_add(conn, "rt-p1", at=NOW)
        await pool_add(conn, "p2", tenants=["t1"], runtime_class="gpu")
        await heartbeat_add(conn, "rt-p2", at=NOW)
        await tasks_add(conn, tenant="t1", count=3, spec=spec_make(cpu=400))
    before = {
        "leased": _value("berth_placements_total", outcome="leased"),
        "pending": _value("berth_placements_total", outcome="pending"),
        "claimed": _value("berth_tasks_claimed_total"),
        "class": _value(
            "berth_filter_rejections_total", plugin="runtime_class", reason="runtime_class_mismatch"
        ),
        "cpu": _value(
            "berth_filter_rejections_total", plugin="capacity", reason="insufficient_cpu"
        ),
        "waits": _value("berth_queue_wait_seconds_count"),
        "passes": _value("berth_pass_duration_seconds_count"),
    }
    await Reconciler(db, ReconcilerConfig(), owner_id="m", slots=ALL).run_once(now=NOW)
    assert _value("berth_placements_total", outcome="leased") - before["leased"] == 2
    assert _value("berth_placements_total", outcome="pending") - before["pending"] == 1
    assert _value("berth_tasks_claimed_total") - before["claimed"] == 3
    # Every evaluated task saw the gpu pool rejected; the third also saw p1 full.
    assert (
        _value(
            "berth_filter_rejections_total", plugin="runtime_class", reason="runtime_class_mismatch"
        )
        - before["class"]
        == 3
    )
    assert (
        _value("berth_filter_rejections_total", plugin="capacity", reason="insufficient_cpu")
        - before["cpu"]
        == 1
    )
    assert _value("berth_queue_wait_seconds_count") - before["waits"] == 2
    assert _value("berth_pass_duration_seconds_count") - before["passes"] == 1


async def test_scheduler_metrics_never_carry_tenant_pool_task_or_label_values(
    db: Database,
) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "pool-secret-x", tenants=["tenant-secret-y"], capacity=(500, 500, 0))
        await heartbeat_add(conn, "rt-pool-secret-x", at=NOW)
        ids = await tasks_add(
            conn, tenant="tenant-secret-y", count=2, spec=spec_make(cpu=400, labels={"team": "zz9"})
        )
    await Reconciler(db, ReconcilerConfig(), owner_id="secret-owner", slots=ALL).run_once(now=NOW)

    exposed = generate_latest(REGISTRY).decode()

    assert "berth_placements_total" in exposed
    for value in ("pool-secret-x", "tenant-secret-y", "zz9", "secret-owner", *map(str, ids)):
        assert value not in exposed


def test_every_reason_code_maps_to_a_plugin_label() -> None:
    assert set(REASON_PLUGIN) == {str(r) for r in Reason}
    assert REASON_PLUGIN["insufficient_llm_slots"] == "capacity"
    assert REASON_PLUGIN["runtime_unhealthy"] == "health"


async def test_wakeups_are_counted_by_source(db: Database) -> None:
    reconciler = Reconciler(db, ReconcilerConfig(), owner_id="w", slots=ALL)
    before = _value("berth_pending_wakeups_total", source="ledger_raised")
    reconciler.wakeup(WakeSource.LEDGER_RAISED)
    assert _value("berth_pending_wakeups_total", source="ledger_raised") == before + 1


def test_config_reads_the_settings() -> None:
    settings = Settings(
        batch_size=99,
        retry_base_delay_ms=50,
        policy="fair",
        reservation_walk_limit=1,
        commit_rounds_max=2,
        tick_seconds=9,
    )
    config = ReconcilerConfig.from_settings(settings, rebalance_seconds=0.5)
    assert (config.batch_size, config.retry_base_delay_seconds, config.policy) == (99, 0.05, "fair")
    assert (config.reservation_walk_limit, config.tick_seconds) == (1, 9)
    assert config.commit_rounds_max == 2
    assert ReconcilerConfig().commit_rounds_max == Settings().commit_rounds_max == 4
    assert config.rebalance_seconds == 0.5


def test_reconcile_refuses_a_bad_shard_with_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "reconcile", "--shard", "3/2"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "BERTH_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "shard '3/2'" in proc.stderr


async def test_the_capacity_gauges_sum_the_ledgers_by_pool_status(db: Database) -> None:
    async with db.transaction() as conn:
        await pool_add(conn, "p1", tenants=["t1"], capacity=(4000, 8192, 2), reserved=(1000, 0, 1))
        await pool_add(conn, "p2", tenants=["t2"], capacity=(2000, 1024, 0), reserved=(500, 512, 0))
        await pool_add(conn, "p3", tenants=["t1"], capacity=(8000, 100, 8), status="DRAINING",
                       reserved=(0, 100, 8))
        await pool_add(conn, "p4", tenants=["t1"], capacity=None)
    reconciler = Reconciler(db, ReconcilerConfig(), owner_id="gauges", slots=ALL)

    await reconciler.queue_gauges_refresh()

    def gauge(name: str, resource: str, status: str) -> float:
        return _value(name, resource=resource, status=status)

    assert [gauge("berth_pool_capacity", r, "ACTIVE")
            for r in ("cpu_millis", "memory_mib", "llm_slots")] == [6000, 9216, 2]
    assert [gauge("berth_pool_reserved", r, "ACTIVE")
            for r in ("cpu_millis", "memory_mib", "llm_slots")] == [1500, 512, 1]
    assert gauge("berth_pool_capacity", "llm_slots", "DRAINING") == 8
    assert gauge("berth_pool_reserved", "memory_mib", "DRAINING") == 100
    assert gauge("berth_pool_capacity", "cpu_millis", "CORDONED") == 0
    # Fixed labels only: no pool id anywhere in the family.
    text = generate_latest(REGISTRY).decode()
    lines = [line for line in text.splitlines() if line.startswith("berth_pool_")]
    assert len(lines) == 18 and not any(p in line for line in lines for p in ("p1", "p2", "p3"))
