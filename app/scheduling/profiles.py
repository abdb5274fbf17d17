"""The profile document: the plugins, weights, strategy, policy, fairness and quota settings
that decide a pass, as JSON a person reads and edits.

``berth profile show`` prints the live one; the same document with changes is a profile
file that a replay plans under (:mod:`app.scheduling.replay`). Records store the plugin part
with each pass (:mod:`app.scheduling.recording`). Reading a document checks every field and
names the first one wrong in one line (:class:`ProfileError`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from app.scheduling.inputs import PassSettings
from app.scheduling.plugins.registry import REGISTRY, STRATEGIES, Profile, Registration, profile

__all__ = [
    "POLICIES",
    "ProfileError",
    "Decides",
    "plugins_document",
    "profile_document",
    "profile_from_plugins",
    "profile_read",
]

POLICIES = ("fifo", "priority", "fair")
#: Settings of a profile document: its JSON name, the :class:`PassSettings` field, the type.
_SETTINGS = (
    ("topK", "top_k", int),
    ("priorityAgingSeconds", "priority_aging_seconds", float),
    ("preemptionGraceSeconds", "preemption_grace_seconds", float),
    ("reclaimMinRuntimeSeconds", "reclaim_min_runtime_seconds", float),
    ("nominationSeconds", "nomination_seconds", float),
    ("parkSweepSeconds", "park_sweep_seconds", float),
    ("taskEventsKept", "task_events_kept", int),
)
_BY_NAME = {r.name: r for r in REGISTRY}


class ProfileError(ValueError):
    """The profile document is not one this build can plan under."""


@dataclasses.dataclass(frozen=True, slots=True)
class Decides:
    """What a profile document decides: the plugins, the strategy and the settings."""

    profile: Profile
    strategy: str
    settings: PassSettings
    #: The plugin part of the document (what a record stores).
    plugins: Mapping[str, Any]


def plugins_document(profile: Profile, strategy: str) -> dict[str, Any]:
    """Return the plugin part of a profile document: the strategy, the filters in order and
    the scores with their weights."""
    return {
        "strategy": strategy,
        "filters": [f.NAME for f in profile.filters],
        "scores": [{"name": s.NAME, "weight": w} for s, w in profile.scores],
    }


def profile_document(profile: Profile, strategy: str, settings: PassSettings) -> dict[str, Any]:
    """Return the whole profile document of ``profile`` run with ``strategy`` and
    ``settings``."""
    return {
        **plugins_document(profile, strategy),
        "policy": settings.policy,
        "settings": {key: getattr(settings, field) for key, field, _ in _SETTINGS},
    }


def _names(doc: Mapping[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ProfileError(f"profile: {key!r} must be a list")
    return value


def profile_from_plugins(doc: Mapping[str, Any], *, name: str | None = None) -> Profile:
    """Return the profile of a document's plugin part (``strategy``, ``filters``,
    ``scores``); raise :class:`ProfileError` naming the first thing wrong."""
    if not isinstance(doc, Mapping):
        raise ProfileError("profile: a JSON object expected")
    strategy = doc.get("strategy")
    if strategy not in STRATEGIES:
        raise ProfileError(f"profile: strategy must be one of {', '.join(STRATEGIES)}")
    chosen: list[Registration] = []
    for f in _names(doc, "filters"):
        r = _BY_NAME.get(f) if isinstance(f, str) else None
        if r is None or not r.is_filter:
            raise ProfileError(f"profile: filters: {f!r} is not a filter of this build")
        chosen.append(r)
    for s in _names(doc, "scores"):
        if not isinstance(s, Mapping) or set(s) != {"name", "weight"}:
            raise ProfileError('profile: scores: each is {"name", "weight"}')
        r = _BY_NAME.get(s["name"]) if isinstance(s["name"], str) else None
        if r is None or r.is_filter:
            raise ProfileError(f"profile: scores: {s['name']!r} is not a score of this build")
        weight = s["weight"]
        if type(weight) is not int or weight <= 0:
            raise ProfileError(f"profile: scores: {s['name']}: weight must be a positive "
                               "integer")
        chosen.append(dataclasses.replace(r, weight=weight, strategies=(strategy,)))
    shipped = profile(strategy)
    if name is None and plugins_document(shipped, strategy) == dict(doc):
        return shipped
    filters = tuple(r.plugin() for r in chosen if r.is_filter)
    scores = tuple((r.plugin(), r.weight) for r in chosen if not r.is_filter)
    return Profile(name or _profile_name(strategy, chosen), filters, scores)  # type: ignore[arg-type]


def _profile_name(strategy: str, chosen: list[Registration]) -> str:
    """Return a name that tells this profile apart from others (snapshots memoize by it)."""
    return strategy + "".join(f":{r.name}={r.weight}" for r in chosen)


def profile_read(doc: Any, *, base: PassSettings) -> Decides:
    """Return what the profile document ``doc`` decides; settings it leaves out keep
    ``base``'s values. Raise :class:`ProfileError` naming the first thing wrong."""
    if not isinstance(doc, Mapping):
        raise ProfileError("profile: a JSON object expected")
    unknown = set(doc) - {"strategy", "filters", "scores", "policy", "settings"}
    if unknown:
        raise ProfileError(f"profile: unknown field {sorted(unknown)[0]!r}")
    decided = profile_from_plugins({k: doc.get(k) for k in ("strategy", "filters", "scores")})
    policy = doc.get("policy", base.policy)
    if policy not in POLICIES:
        raise ProfileError(f"profile: policy must be one of {', '.join(POLICIES)}")
    settings = doc.get("settings", {})
    if not isinstance(settings, Mapping):
        raise ProfileError("profile: 'settings' must be an object")
    known = {key: (field, kind) for key, field, kind in _SETTINGS}
    changes: dict[str, Any] = {"policy": policy}
    for key, value in settings.items():
        if key not in known:
            raise ProfileError(f"profile: settings: unknown setting {key!r}")
        field, kind = known[key]
        ok = type(value) is int or (kind is float and type(value) is float)
        if not ok or value < 0 or (key == "topK" and value < 1):
            raise ProfileError(f"profile: settings: {key} must be a non-negative "
                               f"{'integer' if kind is int else 'number'}"
                               + (" of at least 1" if key == "topK" else ""))
        changes[field] = kind(value)
    plugins = {k: doc[k] for k in ("strategy", "filters", "scores")}
    return Decides(decided, str(doc["strategy"]), dataclasses.replace(base, **changes),
                   plugins)
