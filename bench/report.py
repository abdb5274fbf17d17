"""What a benchmark run tells the person who started it.

While it works, a run shows its progress on stderr: the phase, how much of it is done out of
how much, and the rate. On a terminal that is one line redrawn in place, with a bar when the
total is known; elsewhere (a pipe, a log file, CI) it is a line when a phase starts, one every
:data:`LINE_EVERY_SECONDS` while it runs, and one when it ends. When the run is over, stdout
gets a short table of the headline figures, or, with ``--json``, the one JSON line that holds
every figure (for scripts and for docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress", "json_option", "result_print", "table_print"]

#: How often the line on a terminal is redrawn.
REDRAW_SECONDS = 0.2
#: How often a running phase prints a line when stderr is not a terminal.
LINE_EVERY_SECONDS = 10.0
BAR_WIDTH = 24


def json_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` (the one JSON line instead of the table) to a target's parser."""
    parser.add_argument("--json", action="store_true",
                        help="print the one JSON line with every figure instead of the table")


class Progress:
    """A run's phases on stderr, redrawn by a background thread while the run works.

    Use it as a context manager (which starts and stops that thread); :meth:`phase` starts
    a phase, :meth:`update` says how much of it is done, :meth:`end` closes it with its
    final count. Without the context manager nothing is drawn until :meth:`tick` is called.
    """

    def __init__(self, target: str, stream: TextIO | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        #: Shown before the phase's name: which run of several this is (a sweep's point).
        self.context = ""
        self.stream = sys.stderr if stream is None else stream
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._clock = clock
        self._lock = threading.Lock()
        self._name: str | None = None
        self._total: int | None = None
        self._unit = ""
        self._done: int | None = None
        self._rate: float | None = None
        self._started = self._shown = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._redraw, name="bench-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.end()

    def phase(self, name: str, *, total: int | None = None, unit: str = "") -> None:
        """End the current phase, if any, and start ``name`` (of ``total`` ``unit``)."""
        with self._lock:
            self._finish()
            self._name, self._total, self._unit = name, total, unit
            self._done = self._rate = None
            self._started = self._shown = self._clock()
            if not self.live:
                self._write(f"{self.target}: {self.context}{name} ...\n")

    def update(self, done: int) -> None:
        """Say that ``done`` of the current phase's total are done."""
        self._done = done

    def end(self, done: int | None = None, *, rate: float | None = None) -> None:
        """End the current phase and print its last line: ``done`` is its final count and
        ``rate`` its measured rate, when the phase's wall time is not the one to divide by
        (it included setting up)."""
        with self._lock:
            if done is not None:
                self._done = done
            self._rate = rate
            self._finish()

    def tick(self) -> None:
        """Redraw the line on a terminal; elsewhere print one if the last is old enough."""
        with self._lock:
            if self._name is None:
                return
            now = self._clock()
            if self.live:
                self._write("\r" + self._line(now) + "\x1b[K")
            elif now - self._shown >= LINE_EVERY_SECONDS:
                self._write(self._line(now) + "\n")
                self._shown = now

    def _redraw(self) -> None:
        while not self._stop.wait(REDRAW_SECONDS):
            self.tick()

    def _finish(self) -> None:
        if self._name is None:
            return
        line = self._line(self._clock())
        self._write(("\r" + line + "\x1b[K\n") if self.live else line + "\n")
        self._name = None

    def _line(self, now: float) -> str:
        elapsed = max(0.0, now - self._started)
        parts = [f"{self.target}: {self.context}{self._name}"]
        done = self._done
        if done is None:  # nothing counted yet: how long it has been working
            parts.append(f"{elapsed:.1f} s")
            return "  ".join(parts)
        if self._total:
            if self.live:
                filled = round(BAR_WIDTH * min(1.0, done / self._total))
                parts.append("[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]")
            parts.append(f"{done:,}/{self._total:,} {self._unit}".rstrip())
        else:
            parts.append(f"{done:,} {self._unit}".rstrip())
        rate = self._rate if self._rate is not None else (done / elapsed if elapsed > 0 else 0)
        parts += [f"{rate:,.0f}/s", f"{elapsed:.1f} s"]
        return "  ".join(parts)

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def table_print(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """Print ``title`` and ``rows`` (name, value) as two aligned columns on stdout."""
    width = max((len(name) for name, _ in rows), default=0)
    print(title)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    sys.stdout.flush()


def result_print(result: dict[str, Any], *, as_json: bool, title: str,
                 rows: Callable[[dict[str, Any]], Sequence[tuple[str, str]]],
                 dumps: Callable[[dict[str, Any]], str] = json.dumps) -> None:
    """Print ``result`` as its one JSON line (``dumps``), or as ``title`` and its headline
    ``rows``."""
    if as_json:
        print(dumps(result), flush=True)
    else:
        table_print(title, rows(result))
