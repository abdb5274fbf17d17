"""Replays: plan recorded passes again and compare (``POST /v1/replays``, ``berth replay``).

Records are read a page at a time (:mod:`app.ledger.pass_records`) and planned again in a
worker thread (:class:`app.scheduling.replay.Replaying`), so the event loop only waits; at
most :data:`REPLAYS_AT_ONCE` replays run in a process at once, and another one is answered
503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app.db import Database
from app.errors import BerthError, NotFound, Unprocessable
from app.ledger.pass_records import pass_record_pools_read, pass_records_read
from app.scheduling.inputs import PassSettings
from app.scheduling.profiles import Decides, ProfileError, profile_read
from app.scheduling.replay import Record, Replaying

__all__ = ["REPLAYS_AT_ONCE", "ProfileInvalid", "ReplayBusy", "ReplayWindow", "duration_parse",
           "profile_check", "replay_run"]

#: Replays one process runs at once.
REPLAYS_AT_ONCE = 1
#: Records read and replayed per step.
PAGE = 50
_running = 0


class ReplayBusy(BerthError):
    """Another replay is running in this process; retry when it is done."""

    status = 503
    title = "Service Unavailable"
    type_slug = "replay-busy"


class ProfileInvalid(Unprocessable):
    """The profile is not one this build can plan under."""

    type_slug = "profile-invalid"


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    """Which records to replay: those of the last ``since``, those of ``pass_ids``, or the
    pass that decided ``task_id``."""

    since: timedelta | None = None
    pass_ids: Collection[str] | None = None
    task_id: uuid.UUID | None = None


_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration_parse(text: str) -> timedelta:
    """Return the span ``text`` names (a number and s, m or h: ``90s``, ``10m``, ``1.5h``);
    raise ValueError naming the expected form."""
    unit = _UNITS.get(text[-1:])
    try:
        amount = float(text[:-1]) if unit is not None else -1.0
    except ValueError:
        amount = -1.0
    if unit is None or not amount >= 0:
        raise ValueError(f"{text!r} is not a duration: a number and s, m or h (10m)")
    return timedelta(seconds=amount * unit)


def profile_check(doc: Mapping[str, Any] | None) -> None:
    """Raise :class:`ProfileInvalid` when ``doc`` is not a profile this build plans under."""
    if doc is None:
        return
    try:
        profile_read(doc, base=PassSettings(4, "fifo", 0, 0, 0, 0, 0, 0))
    except ProfileError as exc:
        raise ProfileInvalid(str(exc)) from None


async def replay_run(
    db: Database, *, window: ReplayWindow, profile: Mapping[str, Any] | None, now: datetime,
) -> dict[str, Any]:
    """Replay the recorded passes of ``window`` (under ``profile`` when given) and return the
    answer (:meth:`app.scheduling.replay.Replaying.document`)."""
    global _running
    profile_check(profile)
    if _running >= REPLAYS_AT_ONCE:
        raise ReplayBusy(extra={"headers": {"Retry-After": "5"}})
    _running += 1
    try:
        replaying = Replaying(_decides(profile) if profile is not None else None)
        await _replay_pages(db, replaying, window=window, now=now)
    finally:
        _running -= 1
    if window.task_id is not None and replaying.passes == 0 and not replaying.skipped:
        raise NotFound("no recorded pass decided this task (records are kept "
                       "BERTH_PASS_RECORDS_SECONDS)")
    return replaying.document()


def _decides(profile: Mapping[str, Any]) -> Any:
    def decides(base: PassSettings) -> Decides:
        return profile_read(profile, base=base)
    return decides


async def _replay_pages(
    db: Database, replaying: Replaying, *, window: ReplayWindow, now: datetime
) -> None:
    """Read the window's records a page at a time and replay each page in a worker."""
    since = now - window.since if window.since is not None else None
    after = 0
    known: dict[str, bytes] = {}
    while True:
        async with db.connection() as conn:
            rows = await pass_records_read(conn, after_id=after, limit=PAGE, since=since,
                                           pass_ids=window.pass_ids, task_id=window.task_id)
            missing = {r.pools_digest for r in rows} - set(known)
            if missing:
                known.update(await pass_record_pools_read(conn, digests=missing))
        if not rows:
            return
        records = [Record(r.pass_id, r.pools_digest, r.plan_digest, r.inputs, r.decisions)
                   for r in rows]
        await asyncio.to_thread(replaying.add, records, dict(known))
        if window.task_id is not None:
            return
        after = rows[-1].id
