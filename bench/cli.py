"""``berth bench TARGET [OPTIONS]``: choose a benchmark and run it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

__all__ = ["TARGETS", "build_parser", "main", "target_parser"]

#: Each target: its module under ``bench`` and what it measures.
TARGETS = {
    "e2e": "reconcilers placing a generated dataset on a fresh database, with the naive "
           "baseline, the two SQL floors and the peer queue in the same run",
    "api": "HTTP throughput of task submission and reads over loopback",
    "hostile": "an authenticated client's latency under a flood of invalid keys and under "
               "slow bodies without a key, against berth serve",
    "plan": "the planner alone, planning again the passes an e2e run recorded: CPU and "
            "instructions per task",
    "watch": "the watch feed: submit-to-lease latency seen by runtime watchers, delivery "
             "rate, server CPU per event and memory per idle watcher",
}


def build_parser() -> argparse.ArgumentParser:
    """Build the parser of ``berth bench``: a target and that target's options."""
    p = argparse.ArgumentParser(
        prog="berth bench",
        description="Run a benchmark: its phases show on stderr as it runs (a progress bar on "
        "a terminal), then a short table of its headline figures, or with --json one JSON "
        "line of every figure, goes to stdout. Each runs on the PostgreSQL "
        "server of its --server-url option (default BERTH_DATABASE_URL); without either, on an "
        "embedded PostgreSQL started in a temporary directory for the run. 'berth bench TARGET "
        "--help' lists a target's options; docs/benchmarks.md gives the figures and how to "
        "reproduce them.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="targets:\n" + "\n".join(f"  {k:<7} {v}" for k, v in TARGETS.items()),
    )
    p.add_argument("target", choices=list(TARGETS), help="what to measure")
    p.add_argument("args", nargs=argparse.REMAINDER, help="options of that target")
    return p


def target_parser(target: str) -> argparse.ArgumentParser:
    """Return the argument parser of one target."""
    module = import_module(f"bench.{target}")
    build: Callable[[], argparse.ArgumentParser] = module.build_parser
    return build()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``berth bench`` with ``argv`` and return the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    module = import_module(f"bench.{args.target}")
    return int(module.main(args.args) or 0)
