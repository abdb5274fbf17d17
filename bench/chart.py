"""The e2e benchmark chart: placements/s against pool count and against reconciler count."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["chart_write"]

#: Published rates of other schedulers drawn as reference lines (caveats: docs/benchmarks.md).
REFERENCES = (
    (810.0, "Kubernetes scheduler_perf, 5,000 nodes: 810 pods/s"),
    (1500.0, "Nomad C1M (low end): 1,500 containers/s"),
)


def _series(
    results: Iterable[Mapping[str, Any]], key: str, line: str, value: str = "placementsPerSec"
) -> dict[int, list]:
    """Group (x, value) points by the ``line`` field, x being the ``key`` field."""
    out: dict[int, list] = {}
    for r in results:
        if r.get(value) is not None:
            out.setdefault(int(r[line]), []).append((int(r[key]), float(r[value])))
    return {k: sorted(v) for k, v in sorted(out.items())}


def chart_write(results: list[Mapping[str, Any]], path: Path) -> None:
    """Draw placements/s vs pools (a line per reconciler count) and vs reconcilers into PNG.

    Solid lines are measured; dashed lines are the CPU-bound rate (cores / CPU per placement
    of reconcilers + PostgreSQL), which other work on a shared machine does not depress.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    bound = "cpuBoundPlacementsPerSec"
    for ax, key, line, marker, name in (
        (left, "pools", "reconcilers", "o", "{:,} reconciler(s)"),
        (right, "reconcilers", "pools", "s", "{:,} pools"),
    ):
        measured = _series(results, key, line)
        ceiling = _series(results, key, line, bound)
        for i, (group, points) in enumerate(measured.items()):
            color = f"C{i}"
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=marker, color=color, label=name.format(group))
            if group in ceiling:
                cx, cy = zip(*ceiling[group], strict=True)
                ax.plot(cx, cy, linestyle="--", marker=marker, markerfacecolor="none",
                        color=color, alpha=0.6, label=f"{name.format(group)}: CPU-bound")
    tasks = sorted({int(r["tasks"]) for r in results})
    for ax in (left, right):
        for y, label in REFERENCES:
            ax.axhline(y, linestyle=":", linewidth=1, color="grey")
            ax.annotate(label, xy=(0.01, y), xycoords=("axes fraction", "data"),
                        fontsize=7, color="grey", va="bottom")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    left.set_xlabel("pools")
    left.set_ylabel("placements / s (admission to last lease)")
    left.set_xscale("log")
    pool_ticks = sorted({int(r["pools"]) for r in results})
    left.set_xticks(pool_ticks, [f"{p:,}" for p in pool_ticks])
    left.minorticks_off()
    right.set_xlabel("reconciler processes")
    right.set_xticks(sorted({int(r["reconcilers"]) for r in results}))
    fig.suptitle(
        "berth bench e2e: durable placements/s, 2-core machine, PostgreSQL on the same machine, "
        f"tasks = {', '.join(f'{t:,}' for t in tasks)}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
