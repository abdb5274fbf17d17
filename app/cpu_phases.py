"""Where a reconciler pass spends its CPU, by phase: cheap per-phase thread-CPU counters.

A pass (:mod:`app.reconciler.passes`) switches its :class:`CpuPhases` from phase to phase
(claim, read, plan, displace, commit, record); code deeper down that builds rows for a
statement marks that work with :func:`cpu_phase` (``commit_build``), which charges it to its
own phase and returns to the phase it interrupted. Each switch reads the thread's CPU clock
once (about a microsecond): a pass switches a few dozen times at most.

Outside a pass (no counter installed, as in the API process) :func:`cpu_phase` does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["CpuPhases", "cpu_phase", "cpu_phases_installed"]


class CpuPhases:
    """Thread CPU seconds charged to each phase, switched by :meth:`switch`."""

    __slots__ = ("seconds", "_phase", "_since")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._phase: str | None = None
        self._since = 0.0

    @property
    def phase(self) -> str | None:
        """Return the phase being charged now (None: none)."""
        return self._phase

    def switch(self, phase: str | None) -> None:
        """Charge the CPU since the last switch to the current phase and start ``phase``."""
        now = time.thread_time()
        if self._phase is not None:
            self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + now - self._since
        self._phase, self._since = phase, now


#: The counter of the pass running in this context (None: no pass).
_CURRENT: ContextVar[CpuPhases | None] = ContextVar("berth_cpu_phases", default=None)


@contextmanager
def cpu_phases_installed(phases: CpuPhases) -> Iterator[CpuPhases]:
    """Make ``phases`` the counter :func:`cpu_phase` charges within the block; stop it after."""
    token = _CURRENT.set(phases)
    try:
        yield phases
    finally:
        phases.switch(None)
        _CURRENT.reset(token)


@contextmanager
def cpu_phase(name: str) -> Iterator[None]:
    """Charge the CPU of the block to phase ``name`` of the pass running (if any)."""
    phases = _CURRENT.get()
    if phases is None:
        yield
        return
    before = phases.phase
    phases.switch(name)
    try:
        yield
    finally:
        phases.switch(before)
