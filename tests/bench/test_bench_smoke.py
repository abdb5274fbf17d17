"""The e2e benchmark end to end on a tiny dataset: every task leased, the ledger sound."""

from __future__ import annotations

import orjson
import pytest

from app.bench import e2e
from app.bench.chart import chart_write
from app.bench.dataset import dataset_generate
from app.scheduling.spec import TaskSpec

FIELDS = (
    "pools", "tasks", "reconcilers", "placementsPerSec", "p50LeaseMs", "p99LeaseMs", "passes",
    "conflicts", "naivePlacementsPerSec", "naiveTasks", "ratioVsNaive", "peakRssMiB",
)


def test_dataset_is_deterministic_valid_and_fits() -> None:
    first = dataset_generate(pools=20, tasks=300, seed=7)
    again = dataset_generate(pools=20, tasks=300, seed=7)
    assert first.tasks == again.tasks and first.ledgers == again.ledgers
    assert len(first.pools) == 20 and len(first.tasks) == 300
    assert sum(first.kinds.values()) == 300 and first.kinds["simple"] > 150
    demand = [0, 0, 0]
    for row in first.tasks:
        spec = TaskSpec.model_validate(orjson.loads(row[6]))
        members = spec.gang.members if spec.gang else 1
        for d, amount in enumerate(spec.requests.as_tuple()):
            demand[d] += members * amount
    totals = [sum(ledger[1 + d] for ledger in first.ledgers) for d in range(3)]
    assert all(total >= 2 * need for total, need in zip(totals, demand, strict=True))


def test_dataset_refuses_fewer_pools_than_runtime_classes() -> None:
    with pytest.raises(ValueError, match="at least"):
        dataset_generate(pools=2, tasks=10)


def test_sweep_axes_are_parsed_and_bad_ones_refused() -> None:
    assert e2e._sweep_axes(["pools=1000,5000", "reconcilers=1,2"]) == {
        "pools": [1000, 5000], "reconcilers": [1, 2]
    }
    with pytest.raises(SystemExit, match="KEY=V1"):
        e2e._sweep_axes(["nodes=3"])
    with pytest.raises(SystemExit, match="integers"):
        e2e._sweep_axes(["pools=many"])


def test_pass_log_lines_are_summed(tmp_path) -> None:
    lines = [
        {"level": "info", "msg": "reconciler started", "slots_owned": 32},
        {"level": "info", "msg": "pass", "claimed": 5, "leased": 4, "conflicts": 1,
         "claim_ms": 1.5, "snapshot_ms": 2.0, "select_ms": 3.0, "commit_ms": 4.0,
         "duration_ms": 10.5},
        {"level": "error", "msg": "reconcile pass failed; its claims will expire"},
    ]
    (tmp_path / "reconciler-0.log").write_bytes(
        b"\n".join(orjson.dumps(x) for x in lines) + b"\nnot json\n"
    )
    (tmp_path / "reconciler-1.log").write_bytes(orjson.dumps(lines[1]) + b"\n")
    totals = e2e._log_totals(tmp_path, 2)
    assert (totals["passes"], totals["leased"], totals["conflicts"], totals["errors"]) == (
        2, 8, 2, 1
    )
    assert totals["phases"]["commit"] == 8.0
    tail = e2e._LogTail([tmp_path / "reconciler-0.log", tmp_path / "reconciler-1.log"])
    try:
        assert tail.poll() == 8
        with open(tmp_path / "reconciler-1.log", "ab") as f:
            f.write(orjson.dumps({**lines[1], "leased": 3}) + b"\n")
        assert tail.poll() == 11
    finally:
        tail.close()


def test_chart_is_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    results = [
        {"pools": p, "reconcilers": r, "tasks": 200, "placementsPerSec": 100.0 * r,
         "cpuBoundPlacementsPerSec": 150.0 * r}
        for p in (20, 40) for r in (1, 2)
    ]
    path = tmp_path / "img" / "chart.png"
    chart_write(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_tiny_run_leases_every_task_with_a_sound_ledger(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = e2e.main(
        ["--pools", "20", "--tasks", "200", "--reconcilers", "2", "--server-url", server_url,
         "--stall-seconds", "30"]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    result = orjson.loads(lines[0])
    assert status == 0
    assert all(result.get(field) is not None for field in FIELDS), result
    assert (result["pools"], result["tasks"], result["reconcilers"]) == (20, 200, 2)
    assert result["leased"] == 200
    assert result["invariantsOk"], result["invariants"]
    assert result["passes"] >= 1
    assert result["p99LeaseMs"] >= result["p50LeaseMs"] > 0
    assert result["peakRssMiB"] > 0
    assert result["naiveTasks"] == 200 and result["naiveLeased"] == 200
    assert result["naiveInvariantsOk"]
