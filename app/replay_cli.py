"""``berth profile show`` and ``berth replay``: the live profile as JSON, and recorded passes
planned again (under that profile changed, with ``--profile FILE``) on the configured
database, as ``POST /v1/replays`` does."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from app.config import get_settings
from app.db import Database
from app.errors import ConfigurationError
from app.keys_cli import database_run
from app.pass_config import ReconcilerConfig
from app.scheduling.plugins.registry import profile
from app.scheduling.profiles import profile_document
from app.services.replays import ReplayWindow, duration_parse, profile_check, replay_run
from app.startup import settings_for

__all__ = ["profile_show", "replay"]


def profile_show() -> int:
    """Print the live profile (from the BERTH_* settings) as JSON."""
    config = ReconcilerConfig.from_settings(get_settings())
    doc = profile_document(profile(config.strategy), config.strategy, config.pass_settings())
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode(), flush=True)
    return 0


def _profile_file(path: str) -> dict[str, Any]:
    """Return the profile document in ``path``; one line saying what is wrong otherwise."""
    try:
        doc = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise ConfigurationError(f"--profile {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigurationError(f"--profile {path}: not JSON ({exc})") from None
    try:
        profile_check(doc)
    except Exception as exc:  # ProfileInvalid: its detail is the one line
        raise ConfigurationError(f"--profile {path}: {getattr(exc, 'detail', exc)}") from None
    return doc


def replay(
    *, since: str | None, pass_ids: Sequence[str], profile_file: str | None, as_json: bool,
    data_dir: str | Path | None = None,
) -> int:
    """Replay the recorded passes of the window and print what differs (exit 1 when a
    decision differs under the recorded profile)."""
    if since is not None and pass_ids:
        raise ConfigurationError("give --since or --pass, not both")
    try:
        span = duration_parse(since or "10m") if not pass_ids else None
    except ValueError as exc:
        raise ConfigurationError(f"--since {exc}") from None
    doc = _profile_file(profile_file) if profile_file is not None else None
    settings = settings_for(get_settings(), data_dir)

    async def work(db: Database) -> dict[str, Any]:
        return await replay_run(db, window=ReplayWindow(since=span, pass_ids=pass_ids or None),
                                profile=doc, now=datetime.now(UTC))

    answer, _ = database_run(settings, work)
    if as_json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode(), flush=True)
    else:
        _print(answer)
    return 1 if doc is None and answer["passes"] != 0 and (
        answer["identical"] != answer["decisions"] or answer["summary"]["defects"]) else 0


def _print(answer: dict[str, Any]) -> None:
    s = answer["summary"]
    print(f"{answer['passes']} passes, {answer['decisions']} decisions: "
          f"{answer['identical']} identical, {s['changedTotal']} changed "
          f"(profile: {s['profile']}; each pass replayed from its own inputs, no cascade)")
    for c in answer["changed"][:20]:
        was, now = c["committed"], c["replayed"]
        print(f"  {c['passId']} {c['taskId']}: {was['poolId'] or was.get('pendingCode')} "
              f"({was['score']}) -> {now['poolId'] or now.get('pendingCode')} ({now['score']})"
              f"  why: {', '.join(c['why'])}")
    if s["changedTotal"] > 20:
        print(f"  ... {s['changedTotal'] - 20} more (--json lists up to 1,000)")
    for d in s["defects"]:
        print(f"  defect in {d['passId']}: "
              + (f"inputs {', '.join(d['inputs'])} do not survive decoding" if d["inputs"]
                 else "this build's planner decides otherwise on the same inputs"))
    for k in s["skipped"]:
        print(f"  skipped {k['passId']}: {k['reason']}")
    if s["profile"] == "given":
        print(f"waits ended {s['waitsEnded']}, begun {s['waitsBegun']}")
        for side in ("committed", "replayed"):
            e = s[side]
            print(f"{side}: placed {e['placedByTenant']}, utilisation spread "
                  f"{e['utilisationSpread']}, cost-weighted load {e['costWeightedLoad']}, "
                  f"failure domains {e['failureDomainsByTenant']}, borrowing "
                  f"{e['borrowingPlacementsByTenant']}")
