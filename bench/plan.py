"""``berth bench plan``: the planner alone, over the passes a ``berth bench e2e`` run recorded.

The plan phase of a pass is :func:`~app.scheduling.planner.plan_pass` on the pass's inputs.
This benchmark plans recorded passes again offline, as the reconcilers planned them:

1. the passes come from ``--records FILE`` (written by ``berth bench e2e --records-out FILE``
   or by ``--save FILE`` here), or, without it, from a ``berth bench e2e`` run made first
   with the options below (no baselines), on ``--server-url`` or an embedded PostgreSQL;
2. the first ``--passes`` records (in the order they were committed) are decoded in turn,
   each onto the snapshot of the previous pass of the reconciler that recorded it, once that
   pass was planned: the placement classes' states it built carry over, as in a reconciler;
3. each pass is planned (the collector off, as in a reconciler's pass), the first time its
   plan digest compared with the recorded one (every decision must be the same), and the
   thread CPU per task reported (each pass's best of ``--repeat`` runs from the start);
4. with ``--callgrind`` (valgrind installed), the same passes are decoded, and decoded and
   planned, in two processes under ``valgrind --tool=callgrind`` with ``PYTHONHASHSEED=0``:
   the instructions per task of the planning are the difference of the two, divided by the
   passes' tasks. Unlike CPU time, the count does not depend on other work on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from app.ledger.pass_records import pass_record_pools_read, pass_records_read
from app.scheduling.inputs import PassInputs
from app.scheduling.planner import PassPlan, plan_pass
from app.scheduling.recording import inputs_decode, plan_digest, pools_decode
from app.scheduling.snapshot import Snapshot
from app.scheduling.spec import StoredSpecs
from bench.database import SERVER_HELP, bench_connect, env_server_url, postgres_server
from bench.report import Progress, json_option, result_print
from bench.workers import REPO_ROOT, python_env

__all__ = ["RecordedPass", "main", "passes_plan", "records_load", "records_save"]

#: Records read per query.
_PAGE = 200


@dataclass(frozen=True, slots=True)
class RecordedPass:
    """One recorded pass as stored: its id, its static pools' digest, its plan's digest and
    its compressed inputs."""

    pass_id: str
    pools_digest: str
    plan_digest: str
    inputs: bytes

    @property
    def reconciler(self) -> str:
        """Return the reconciler run that planned the pass (its id less the pass number)."""
        return self.pass_id.rsplit("/", 1)[0]


async def records_save(url: str, path: Path) -> int:
    """Write every pass recorded in the database ``url`` to ``path`` (with the static pools
    they name) and return how many there are."""
    conn = await bench_connect(url)
    try:
        rows, after = [], 0
        while page := await pass_records_read(conn, after_id=after, limit=_PAGE):
            rows.extend(page)
            after = page[-1].id
        pools = await pass_record_pools_read(conn, digests={r.pools_digest for r in rows})
    finally:
        await conn.close()
    b64 = base64.b64encode
    doc = {
        "records": [[r.pass_id, r.pools_digest, r.plan_digest, b64(r.inputs).decode()]
                    for r in rows],
        "pools": {k: b64(v).decode() for k, v in pools.items()},
    }
    await asyncio.to_thread(path.write_bytes, orjson.dumps(doc))
    return len(rows)


def records_load(path: Path) -> tuple[list[RecordedPass], dict[str, bytes]]:
    """Return the passes of a file :func:`records_save` wrote, in commit order, and the
    static pools by digest."""
    doc = orjson.loads(path.read_bytes())
    b64 = base64.b64decode
    records = [RecordedPass(p, d, g, b64(blob)) for p, d, g, blob in doc["records"]]
    return records, {k: b64(v) for k, v in doc["pools"].items()}


def passes_plan(records: list[RecordedPass], pools: dict[str, bytes], *, plan: bool = True,
                check: bool = True) -> tuple[int, list[float], int]:
    """Decode each of ``records`` onto the previous snapshot of the reconciler that recorded
    it, once that one was planned (the first of each onto its pools' fresh snapshot), and
    with ``plan`` plan it with the collector off. Return the passes' tasks, the thread CPU
    seconds each plan took and, with ``check``, how many plans have the recorded digest."""
    specs = StoredSpecs(4096)
    last: dict[str, tuple[str, Snapshot]] = {}
    tasks, seconds, identical = 0, [], 0
    for r in records:
        kept = last.get(r.reconciler)

        def base(strategy: str, r: RecordedPass = r,
                 kept: tuple[str, Snapshot] | None = kept) -> Snapshot:
            if kept is not None and kept[0] == r.pools_digest and kept[1].strategy == strategy:
                return kept[1]
            return Snapshot.build(pools_decode(pools[r.pools_digest]), strategy=strategy)

        inputs = inputs_decode(r.inputs, (), specs=specs, base=base).inputs
        last[r.reconciler] = (r.pools_digest, inputs.snapshot)
        tasks += len(inputs.tasks)
        if not plan:
            continue
        planned, took = _planned(inputs)
        seconds.append(took)
        if check:
            identical += plan_digest(planned) == r.plan_digest
    return tasks, seconds, identical


def _planned(inputs: PassInputs) -> tuple[PassPlan, float]:
    """Plan ``inputs`` with the collector off (as in a reconciler's pass); return the plan
    and the thread CPU seconds it took."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        began = time.thread_time()
        plan = plan_pass(inputs)
        return plan, time.thread_time() - began
    finally:
        if enabled:
            gc.enable()


def _instructions(out: Path) -> int:
    """Return the instructions a callgrind output file counts in all."""
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{out}: no totals")


def _callgrind(records_file: Path, passes: int, stop: str, tmp: Path) -> int:
    """Return the instructions of this benchmark decoding (``stop="decode"``), or decoding
    and planning, the first ``passes`` records of ``records_file`` under callgrind."""
    out = tmp / f"callgrind.{stop}.out"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           sys.executable, "-m", "bench", "plan", "--records", str(records_file),
           "--passes", str(passes), "--repeat", "1", "--stop-after", stop, "--json"]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env={**python_env(), "PYTHONHASHSEED": "0"},
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"callgrind run failed: {done.stderr[-2000:]}")
    return _instructions(out)


def _record(args: argparse.Namespace, progress: Progress) -> Path:
    """Run ``berth bench e2e`` with this run's options and return the file of its records."""
    from bench.e2e import E2EConfig, e2e_run

    path = Path(args.save) if args.save else Path(tempfile.mkdtemp(prefix="berth-plan-")) / (
        "records.json")
    with postgres_server(args.server_url) as (server_url, _):
        cfg = E2EConfig(pools=args.pools, tasks=args.tasks, reconcilers=args.reconcilers,
                        server_url=server_url, seed=args.seed, skip_naive=True,
                        skip_floor=True, skip_peer=True, quotas=int(args.quotas),
                        records_out=str(path))
        asyncio.run(e2e_run(cfg, progress))
    return path


def plan_run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Return the figures of one ``berth bench plan`` run."""
    path = Path(args.records) if args.records else _record(args, progress)
    records, pools = records_load(path)
    records = records[:args.passes]
    out: dict[str, Any] = {"records": str(path), "passes": len(records)}
    if args.stop_after == "decode":
        out["tasks"] = passes_plan(records, pools, plan=False)[0]
        return out
    progress.phase(f"planning {len(records)} passes", total=args.repeat, unit="repeats")
    best: list[float] | None = None
    for n in range(args.repeat):
        tasks, seconds, identical = passes_plan(records, pools,
                                                check=n == 0 and args.stop_after is None)
        best = seconds if best is None else [min(a, b) for a, b in zip(best, seconds,
                                                                           strict=True)]
        if n == 0 and args.stop_after is None:
            out["plansIdentical"] = identical
        progress.update(n + 1)
    assert best is not None
    out["tasks"] = tasks
    out["cpuUsPerTask"] = round(1e6 * sum(best) / tasks, 2) if tasks else None
    if args.callgrind:
        progress.phase("counting instructions under callgrind (minutes)")
        with tempfile.TemporaryDirectory(prefix="berth-plan-") as tmp:
            decode = _callgrind(path, args.passes, "decode", Path(tmp))
            planned = _callgrind(path, args.passes, "plan", Path(tmp))
        out["instructionsDecode"] = decode
        out["instructionsPlan"] = planned - decode
        out["instructionsPerTask"] = round((planned - decode) / tasks) if tasks else None
    return out


def build_parser() -> argparse.ArgumentParser:
    """Build the parser of ``berth bench plan``."""
    p = argparse.ArgumentParser(
        prog="berth bench plan",
        description="Plan the passes a berth bench e2e run recorded again, offline, as its "
        "reconcilers planned them, and report the planner's CPU and, with --callgrind, its "
        "instructions per task; every plan must have the recorded digest. Without --records, "
        "first makes such a run (no baselines) on the PostgreSQL server of --server-url "
        "(default BERTH_DATABASE_URL), or without either on an embedded PostgreSQL started "
        "for the run.",
    )
    p.add_argument("--records", metavar="FILE",
                   help="the recorded passes (berth bench e2e --records-out FILE); without it, "
                   "a run is made first")
    p.add_argument("--save", metavar="FILE",
                   help="without --records: keep the recorded passes of the run in FILE")
    p.add_argument("--pools", type=int, default=1000, help="pools of the run (default 1000)")
    p.add_argument("--tasks", type=int, default=20000, help="tasks of the run (default 20000)")
    p.add_argument("--reconcilers", type=int, default=2,
                   help="reconcilers of the run (default 2)")
    p.add_argument("--seed", type=int, default=1, help="dataset seed of the run (default 1)")
    p.add_argument("--quotas", action="store_true",
                   help="give every tenant of the run a quota (as berth bench e2e --quotas)")
    p.add_argument("--server-url", default=env_server_url(), help=SERVER_HELP)
    p.add_argument("--passes", type=int, default=4,
                   help="plan the first N recorded passes (default 4)")
    p.add_argument("--repeat", type=int, default=3,
                   help="plan them N times, each pass's best CPU time counts (default 3)")
    p.add_argument("--callgrind", action="store_true",
                   help="also count the planner's instructions per task under valgrind's "
                   "callgrind (minutes)")
    p.add_argument("--stop-after", choices=("decode", "plan"),
                   help="stop after decoding the passes, or after planning them without "
                   "checking digests (what --callgrind runs under valgrind)")
    json_option(p)
    return p


def _rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("passes, tasks", f"{r['passes']}, {r['tasks']:,}")]
    if "cpuUsPerTask" in r:
        rows.append(("plan CPU per task", f"{r['cpuUsPerTask']} µs (best of the repeats)"))
    if "plansIdentical" in r:
        rows.append(("plans with the recorded digest", f"{r['plansIdentical']} of "
                                                       f"{r['passes']}"))
    if "instructionsPerTask" in r:
        rows.append(("instructions per task", f"{r['instructionsPerTask']:,}"))
    return rows


def main(argv: list[str]) -> int:
    """Run ``berth bench plan`` with ``argv`` and print its figures."""
    args = build_parser().parse_args(argv)
    if args.passes < 1 or args.repeat < 1:
        raise SystemExit("berth bench plan: --passes and --repeat must be at least 1")
    with Progress("berth bench plan") as progress:
        result = plan_run(args, progress)
    result_print(result, as_json=args.json, title="berth bench plan", rows=_rows,
                 dumps=lambda r: orjson.dumps(r).decode())
    if "plansIdentical" in result and result["plansIdentical"] != result["passes"]:
        print("berth bench plan: some plans differ from the recorded ones", file=sys.stderr)
        return 1
    return 0
