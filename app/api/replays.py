"""HTTP API: replays — plan recorded passes again and compare (admin only).

The work runs in a worker thread, one replay at a time per process
(:mod:`app.services.replays`).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ConfigDict, Field, model_validator

from app.api.bodies import StrictRoute
from app.api.common import CamelModel, RequestModel
from app.api.common import problems as problem_responses
from app.api.task_schemas import FastJSONResponse
from app.auth import AdminDep
from app.services.replays import ReplayWindow, duration_parse, replay_run

router = APIRouter(prefix="/v1", tags=["replays"], route_class=StrictRoute)


class ReplayCreate(RequestModel):
    """Which recorded passes to replay (exactly one of ``since``, ``passIds``, ``taskId``),
    and optionally the profile to replay them under (a what-if)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [
            {"since": "10m"},
            {"since": "1h", "profile": {"strategy": "spread", "scores": [
                {"name": "least_loaded", "weight": 3}], "filters": ["capacity"]}},
        ]}
    )

    since: str | None = Field(
        default=None, pattern=r"^[0-9]+(\.[0-9]+)?(s|m|h)$",
        description="The passes recorded in this last span: a number and s, m or h.")
    pass_ids: list[str] | None = Field(
        default=None, min_length=1, max_length=1000,
        description="The passes with these ids (as the reconciler's logs name them).")
    task_id: uuid.UUID | None = Field(
        default=None, strict=False,  # a UUID arrives as a JSON string
        description="The pass that decided this task (its latest).")
    profile: dict[str, Any] | None = Field(
        default=None,
        description="The profile to replay under: the document `berth profile show` prints, "
        "changed. Without it each pass replays under its recorded profile.")

    @model_validator(mode="after")
    def _one_window(self) -> ReplayCreate:
        given = [v for v in (self.since, self.pass_ids, self.task_id) if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of since, passIds and taskId")
        return self


class ReplaySide(CamelModel):
    """A decision as committed or as replayed."""

    model_config = ConfigDict(extra="allow")

    pool_id: str | None = Field(description="Where it was placed (null: handed back).")
    score: float | None


class ReplayChange(CamelModel):
    """A decision that differs on replay, and the components that differ."""

    pass_id: str
    task_id: str
    committed: ReplaySide
    replayed: ReplaySide
    why: list[str] = Field(description="outcome, pool, members, code, score, or the name "
                                       "of a score component whose value differs.")


class Replay(CamelModel):
    """What a replay found."""

    passes: int
    decisions: int
    identical: int
    changed: list[ReplayChange] = Field(description="The differing decisions (at most 1,000; "
                                                    "summary.changedTotal counts them all).")
    summary: dict[str, Any]


@router.post(
    "/replays",
    operation_id="createReplay",
    summary="Replay recorded passes, optionally under another profile",
    response_model=Replay,
    responses=problem_responses(400, 401, 403, 404, 413, 422, 503),
)
async def create_replay(body: ReplayCreate, principal: AdminDep, request: Request) -> Response:
    """Plan the recorded passes of the window again with this build's planner and compare
    each decision with the one committed.

    Without `profile` every decision should be identical: a difference is a defect, and
    `summary.defects` says whether the record's inputs or the planner produced it. With
    `profile` the answer is a what-if: `summary` gives its effects. Each pass replays from
    its own recorded inputs, so a changed decision does not cascade into later passes.
    """
    del principal
    window = ReplayWindow(
        since=duration_parse(body.since) if body.since is not None else None,
        pass_ids=body.pass_ids, task_id=body.task_id)
    answer = await replay_run(request.app.state.db, window=window, profile=body.profile,
                              now=datetime.now(UTC))
    return FastJSONResponse(answer)
