"""A preemptor waiting for its victims keeps its holds only while its quota admits it.

Tenant a (nominal 4000m, its cohort lending b's unused 4000m) runs four 1000m tasks; its
3000m high-priority task preempts one of them and holds what is free meanwhile. While the
victim stops, the preemptor waits with its holds: judged with its victim stopped, it fits
its quota. Then a's nominal is set to 0: its quota refuses the preemptor (what its cohort
can lend falls short), so the pass that sees it hands it back pending for its quota and
gives back what it held, though its victim is still revoking.
"""

from __future__ import annotations

import uuid

from app.db import Database
from tests.reconciler.holds_world import World


async def held(db: Database, task_id: uuid.UUID) -> tuple[str | None, int, int]:
    """(pending code, hold rows, revoking victims) of a task."""
    async with db.connection() as conn:
        r = await conn.fetchrow(
            "SELECT t.pending_reason ->> 'code', "
            "(SELECT count(*) FROM reservations WHERE task_id = t.id AND hold), "
            "(SELECT count(*) FROM leases WHERE preempted_by = t.id AND state = 'REVOKING') "
            "FROM tasks t WHERE t.id = $1", task_id)
    return r[0], int(r[1]), int(r[2])


async def test_a_waiting_preemptor_its_quota_refuses_gives_back_its_holds(db: Database) -> None:
    world = World(db)
    try:
        await world.build()  # a runs 6 x 1000m (2000m borrowed), c 3 x 1000m
        for _ in range(2):
            await world.end(0, "succeeded")
            await world.tick(5)
        await world.submit("a", 3000, 1, True, None, 1)
        await world.tick(5)
        preemptor = world.tasks[-1]
        assert await held(db, preemptor) == ("preempting", 1, 1)
        # Still waiting for its victim, within its quota once the victim stops.
        await world.tick(5)
        assert await held(db, preemptor) == ("preempting", 1, 1)

        assert await world.quota("a", "c1", 0, None)
        await world.tick(5)
        assert await held(db, preemptor) == ("quota_borrow_unavailable", 0, 1)
    finally:
        await world.rec.close()
