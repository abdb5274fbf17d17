"""Task batches: many submissions in one request, each with the answer it would get alone.

Every valid item is stored by one statement (:func:`app.ledger.batches.task_batch_insert`)
on an autocommit connection, so the batch is committed when :func:`task_batch_submit`
returns. Each item gets the status its own ``createTask`` would have got had the items been
sent one after another in request order:

* **201** stored; **200** its ``idempotencyKey`` (the same key space as the Idempotency-Key
  header of ``createTask``, per tenant) already names a task with the same spec: that task;
* **409** the key names a task with another spec;
* **429** the tenant's queued tasks reached ``BERTH_MAX_QUEUED_TASKS_PER_TENANT``: the first
  items of the batch fill the room that is left, the rest are refused;
* **422** a spec PostgreSQL cannot store (a NUL character).

A key repeated inside one batch is settled in the same order: its first valid occurrence
is submitted, and each later one replays that task (200) with the same spec, is 409 with
another, or is 429 when the first was refused for the cap.

A batch without keys costs one serialization per spec (the text stored and answered) and
nothing else per item: it needs no request hash, no key lookup and no decoded copy of the
spec (the answer embeds the stored text, :attr:`Admitted.spec_json`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

from app.auth import Principal
from app.db import Database
from app.errors import BerthError
from app.ledger import batches as ledger
from app.ledger.idempotency import IdempotencyKeyReused
from app.ledger.tasks import (
    QUEUE_FULL_RETRY_AFTER_SECONDS,
    SpecHasNul,
    TaskRow,
    TenantQueueFull,
)
from app.scheduling.spec import TaskSpec
from app.services.idempotency import request_hash
from app.services.tenancy import tenant_acting
from app.shards import shard_of

__all__ = ["Admitted", "BatchEntry", "BatchOutcome", "task_batch_submit", "tasks_store_unkeyed"]

#: An escaped NUL in JSON text (``\u0000`` not itself escaped); checked only when the
#: cheap substring test finds one.
_NUL_ESCAPE = "\\u0000"


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """A valid item of a batch: its position in the request, its spec and key."""

    index: int
    spec: TaskSpec
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A task this batch stored: everything else about it is a new task's default."""

    id: str
    tenant_id: str
    #: The validated spec as stored: its JSON text (camelCase, every default spelled out).
    spec_json: str
    priority: int
    max_attempts: int
    created_at: datetime
    #: Its position in admission order (known for a task stored by a batch without keys).
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """One item's answer: its status and the task (stored now, or found by its key), or
    the error it would have got alone."""

    status: int
    admitted: Admitted | None = None
    row: TaskRow | None = None
    error: BerthError | None = None


@dataclass(slots=True)
class _Prepared:
    entry: BatchEntry
    spec_json: str
    digest: str | None


#: The spec's JSON text, as ``model_dump_json(by_alias=True)`` writes it (without its
#: Python wrapper).
_spec_json = TaskSpec.__pydantic_serializer__.to_json


def _storable(
    entries: Sequence[BatchEntry], outcomes: dict[int, BatchOutcome]
) -> tuple[list[tuple[BatchEntry, str]], str]:
    """Return each entry with its spec's JSON text, and those texts one per line (compact
    JSON holds no newline); a spec PostgreSQL cannot store (NUL) gets its 422 in
    ``outcomes`` instead. The usual batch, without any escaped NUL, is searched once."""
    texts = [_spec_json(entry.spec, by_alias=True).decode() for entry in entries]
    lines = "\n".join(texts)
    if _NUL_ESCAPE not in lines:
        return list(zip(entries, texts, strict=True)), lines
    out = []
    for entry, spec_json in zip(entries, texts, strict=True):
        if _NUL_ESCAPE in spec_json and _has_nul(spec_json):
            outcomes[entry.index] = BatchOutcome(422, error=SpecHasNul())
        else:
            out.append((entry, spec_json))
    return out, "\n".join(spec_json for _, spec_json in out)


def _admitted(entry: BatchEntry, task_id: str, tenant_id: str, spec_json: str,
              now: datetime, seq: int | None = None) -> Admitted:
    return Admitted(task_id, tenant_id, spec_json, entry.spec.priority,
                    entry.spec.max_attempts, now, seq)


def _key_reused() -> IdempotencyKeyReused:
    return IdempotencyKeyReused(
        "this idempotencyKey was already used with a different request body; "
        "use a new key for a new task"
    )


def _key_busy() -> IdempotencyKeyReused:
    return IdempotencyKeyReused("the idempotencyKey is in use by a concurrent request; retry")


def _queue_full(tenant_id: str, max_queued: int) -> TenantQueueFull:
    return TenantQueueFull(
        f"tenant {tenant_id!r} has {max_queued} queued tasks, the most "
        f"BERTH_MAX_QUEUED_TASKS_PER_TENANT allows; retry when some have started",
        extra={"maxQueuedTasks": max_queued, "retryAfter": QUEUE_FULL_RETRY_AFTER_SECONDS},
    )


def _has_nul(spec_json: str) -> bool:
    if _NUL_ESCAPE not in spec_json:
        return False
    # Count the backslashes before each match: an even number (none included) means the
    # escape is real, an odd one that its backslash is itself escaped text.
    at = spec_json.find(_NUL_ESCAPE)
    while at >= 0:
        slashes = 0
        while at - slashes - 1 >= 0 and spec_json[at - slashes - 1] == "\\":
            slashes += 1
        if slashes % 2 == 0:
            return True
        at = spec_json.find(_NUL_ESCAPE, at + 1)
    return False


async def task_batch_submit(
    db: Database,
    *,
    principal: Principal,
    tenant: str | None,
    entries: Sequence[BatchEntry],
    max_queued: int = 0,
) -> dict[int, BatchOutcome]:
    """Store the valid items of a batch for the tenant the key acts for; return each one's
    outcome by index (see the module docstring for the statuses)."""
    tenant_id = tenant_acting(principal, tenant)
    if all(entry.idempotency_key is None for entry in entries):
        return await tasks_store_unkeyed(db, tenant_id=tenant_id, entries=entries,
                                         max_queued=max_queued)
    outcomes: dict[int, BatchOutcome] = {}
    owners: dict[str, _Prepared] = {}  # key -> its first valid occurrence
    repeats: list[_Prepared] = []
    submitted: list[_Prepared] = []
    for entry, spec_json in _storable(entries, outcomes)[0]:
        key = entry.idempotency_key
        digest = (request_hash({"tenantId": tenant_id, "spec": orjson.loads(spec_json)})
                  if key else None)
        prepared = _Prepared(entry, spec_json, digest)
        if key is None:
            submitted.append(prepared)
        elif key in owners:
            repeats.append(prepared)
        else:
            owners[key] = prepared
            submitted.append(prepared)

    now = datetime.now(UTC)
    by_key: dict[str, tuple[TaskRow | Admitted, str | None]] = {}
    async with db.connection() as conn:
        results = []
        if submitted:
            keyed = bool(owners)
            results = await ledger.task_batch_insert(
                conn,
                tenant_id=tenant_id,
                shard=shard_of(tenant_id),
                specs=[p.spec_json for p in submitted],
                keys=[p.entry.idempotency_key for p in submitted] if keyed else [],
                hashes=[p.digest for p in submitted] if keyed else [],
                now=now,
                max_queued=max_queued,
            )
        considered = {r.position: r for r in results}
        unsettled: list[str] = []
        for position, prepared in enumerate(submitted):
            index = prepared.entry.index
            result = considered.get(position)
            key = prepared.entry.idempotency_key
            if result is not None and result.seq is not None:
                admitted = _admitted(prepared.entry, result.id, tenant_id, prepared.spec_json,
                                     now)
                outcomes[index] = BatchOutcome(201, admitted)
                if key is not None:
                    by_key[key] = (admitted, prepared.digest)
            elif result is not None and result.refused:
                outcomes[index] = BatchOutcome(429, error=_queue_full(tenant_id, max_queued))
            else:  # the key names an earlier task, or one committed while we waited
                assert key is not None
                unsettled.append(key)
        if unsettled:
            by_key.update(await ledger.tasks_by_key(conn, tenant_id=tenant_id, keys=unsettled))

    _keys_settle([owners[k] for k in unsettled] + repeats, owners, by_key, outcomes)
    return outcomes


def _keys_settle(
    settling: list[_Prepared], owners: dict[str, _Prepared],
    by_key: dict[str, tuple[TaskRow | Admitted, str | None]],
    outcomes: dict[int, BatchOutcome],
) -> None:
    """Answer the keyed items the insert did not store (their key names a task already, or
    they repeat an earlier item's key) from the task each key names, into ``outcomes``."""
    for prepared in settling:
        index = prepared.entry.index
        key = prepared.entry.idempotency_key
        assert key is not None
        stored = by_key.get(key)
        if stored is None:
            # The owner was refused for the cap, and so is its repeat; or the task that took
            # the key is gone again (deleted since), which only a retry can settle.
            owner = outcomes.get(owners[key].entry.index)
            outcomes[index] = owner if owner is not None else BatchOutcome(409, error=_key_busy())
        elif stored[1] == prepared.digest:
            task = stored[0]
            outcomes[index] = (BatchOutcome(200, admitted=task) if isinstance(task, Admitted)
                               else BatchOutcome(200, row=task))
        else:
            outcomes[index] = BatchOutcome(409, error=_key_reused())


async def tasks_store_unkeyed(
    db: Database,
    *,
    tenant_id: str,
    entries: Sequence[BatchEntry],
    max_queued: int,
    wake: bool = True,
) -> dict[int, BatchOutcome]:
    """Store items none of which has a key for ``tenant_id``, in one statement; return each
    one's outcome by index (201, 429 past the cap, 422 for a NUL). Without ``wake`` the
    statement does not notify the reconcilers: the caller wakes them after the commit."""
    outcomes: dict[int, BatchOutcome] = {}
    kept, lines = _storable(entries, outcomes)
    if not kept:
        return outcomes
    now = datetime.now(UTC)
    async with db.connection() as conn:
        ids, seqs = await ledger.task_batch_insert_unkeyed(
            conn, tenant_id=tenant_id, shard=shard_of(tenant_id), specs=lines, now=now,
            max_queued=max_queued, wake=wake,
        )
    assert len(ids) == len(kept)  # one line per spec
    stored = len(seqs)
    for (entry, spec_json), task_id, seq in zip(kept[:stored], ids, seqs, strict=False):
        outcomes[entry.index] = BatchOutcome(
            201, _admitted(entry, task_id, tenant_id, spec_json, now, seq))
    if stored < len(kept):
        refused = BatchOutcome(429, error=_queue_full(tenant_id, max_queued))
        for entry, _ in kept[stored:]:
            outcomes[entry.index] = refused
    return outcomes
