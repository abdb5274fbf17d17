"""Observing a batch of values gives the histogram ``observe`` one by one would give."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from app.metrics import histogram_observe_many

BUCKETS = (0.005, 0.01, 0.5, 1, 30)
VALUES = [0.0, 0.005, 0.0050001, 0.01, 0.3, 0.5, 1, 1.5, 30, 31, 1e9, 0.007, 0.007]


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("wait_seconds", "x", buckets=BUCKETS, registry=registry)


def test_a_batch_observes_like_one_by_one() -> None:
    one_registry, one = _histogram()
    for value in VALUES:
        one.observe(value)
    many_registry, many = _histogram()
    histogram_observe_many(many, VALUES[:5])
    histogram_observe_many(many, [])
    histogram_observe_many(many, VALUES[5:])
    got, want = _samples(many_registry), _samples(one_registry)
    assert [(name, labels) for name, labels, _ in got] == [(n, la) for n, la, _ in want]
    for (name, _, a), (_, _, b) in zip(got, want, strict=True):
        # The sum is added in one step: equal up to rounding, every count exactly.
        assert a == pytest.approx(b, rel=1e-12) if name.endswith("_sum") else a == b, name


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict, float]]:
    return [
        (s.name, s.labels, s.value) for metric in registry.collect() for s in metric.samples
        if not s.name.endswith("_created")
    ]


class _Observed:
    """A histogram without prometheus_client's internals (as another release might have)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


def test_without_the_internals_values_are_observed_one_by_one() -> None:
    histogram = _Observed()
    histogram_observe_many(histogram, VALUES)  # type: ignore[arg-type]
    assert histogram.values == VALUES
