"""What a bench run shows a person: progress on stderr (a redrawn line with a bar on a
terminal, plain lines elsewhere), then a table of its headline figures or its JSON line."""

from __future__ import annotations

import io
import json

import pytest

from bench.report import LINE_EVERY_SECONDS, Progress, result_print


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_on_a_terminal_one_line_is_redrawn_with_a_bar_count_and_rate() -> None:
    stream, clock = Terminal(), Clock()
    progress = Progress("berth bench e2e", stream, clock=clock)
    progress.phase("placing", total=2000, unit="leased")
    assert stream.getvalue() == ""  # nothing until the first redraw
    clock.now += 2.0
    progress.update(500)
    progress.tick()
    assert stream.getvalue() == ("\rberth bench e2e: placing  [######..................]  "
                                 "500/2,000 leased  250/s  2.0 s\x1b[K")
    clock.now += 2.0
    progress.end(2000)
    last = stream.getvalue().rsplit("\r", 1)[1]
    assert last == ("berth bench e2e: placing  [########################]  2,000/2,000 leased  "
                    "500/s  4.0 s\x1b[K\n")


def test_elsewhere_a_line_per_phase_start_every_ten_seconds_and_end() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = Progress("berth bench api", stream, clock=clock)
    progress.context = "[1/2] "
    progress.phase("submissions", total=300, unit="tasks")
    clock.now += 1.0
    progress.update(100)
    progress.tick()  # too soon for a new line
    clock.now += LINE_EVERY_SECONDS
    progress.tick()
    progress.end(300, rate=150.0)
    progress.phase("reads")
    progress.end()
    assert stream.getvalue().splitlines() == [
        "berth bench api: [1/2] submissions ...",
        "berth bench api: [1/2] submissions  100/300 tasks  9/s  11.0 s",
        "berth bench api: [1/2] submissions  300/300 tasks  150/s  11.0 s",
        "berth bench api: [1/2] reads ...",
        "berth bench api: [1/2] reads  0.0 s",
    ]
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_the_redrawing_thread_stops_with_the_run_and_ends_the_phase() -> None:
    stream = io.StringIO()
    with Progress("berth bench hostile", stream) as progress:
        progress.phase("reads alone", unit="reads")
        progress.update(7)
    last = stream.getvalue().splitlines()[-1]
    assert last.startswith("berth bench hostile: reads alone  7 reads")


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_the_result_is_a_table_or_its_json_line(
    as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    result = {"placementsPerSec": 12345.6, "p99LeaseMs": 80.5}
    result_print(result, as_json=as_json, title="berth bench e2e: 3 pools",
                 rows=lambda r: [("placements per second", f"{r['placementsPerSec']:,.1f}"),
                                 ("p99", f"{r['p99LeaseMs']} ms")])
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out) == result and len(out.splitlines()) == 1
    else:
        assert out.splitlines() == ["berth bench e2e: 3 pools",
                                    "  placements per second  12,345.6",
                                    "  p99                    80.5 ms"]
