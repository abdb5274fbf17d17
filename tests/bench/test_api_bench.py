"""``berth bench api`` end to end with tiny counts: its own server, its phases on stderr, then
one JSON line (``--json``) or a table of the headline figures."""

from __future__ import annotations

import json
import re

import pytest

from bench import api


@pytest.mark.slow
def test_tiny_run_prints_one_json_line(server_url, monkeypatch, capsys) -> None:
    # Enough requests that the server's CPU time spans several clock ticks (10 ms each): a
    # read costs ~0.25 ms of CPU, so 40 reads could round down to zero.
    status = api.main(["--server-url", server_url, "--clients", "4", "--count", "300",
                       "--reads", "300", "--warmup", "10", "--seconds", "30", "--pool-size", "2",
                       "--preview-pools", "200", "--previews", "3", "--preview-writes", "50",
                       "--preview-write-pools", "5", "--preview-hold", "--json"])
    assert status == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["clients"] == 4 and result["reconciler"].startswith("disabled")
    for phase, count in (("submissions", 300), ("reads", 300)):
        summary = result[phase]
        assert summary["count"] == count and summary["errors"] == 0
        assert summary["rps"] > 0 and 0 < summary["p50Ms"] <= summary["p99Ms"]
        assert summary["serverCpuMsPerRequest"] > 0
    assert result["submissions"]["statuses"] == {"201": 300}
    previews = result["previews"]
    assert previews["pools"] == 200 and previews["statuses"] == {"200": 3}
    # The default page: 20 candidates with their components, far below the whole ranking.
    assert 2_000 < previews["bytesMax"] < 64 * 1024
    # A writer reserved on the pools meanwhile, with a transaction held open; each preview
    # read the rows written since the previous one, far fewer than the pools.
    assert previews["writer"]["held"] is True and previews["writer"]["passesPerSecond"] > 0
    assert 0 <= previews["rowsReadPerPreview"] < 200
    # Each phase on stderr, as plain lines (stderr is not a terminal here).
    for phase in ("submissions ...", "submissions  300/300 tasks", "reads  300/300 reads",
                  "batches ..."):
        assert f"berth bench api: {phase}" in err, err


@pytest.mark.slow
def test_tiny_run_ends_with_a_table_of_the_headline_figures(server_url, capsys) -> None:
    status = api.main(["--server-url", server_url, "--clients", "2", "--count", "40",
                       "--reads", "40", "--warmup", "0", "--seconds", "30", "--pool-size", "2",
                       "--batch-size", "10", "--batches", "2", "--batch-clients", "1",
                       "--preview-pools", "0"])
    assert status == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("berth bench api: 2 clients; uvicorn, 1 worker")
    assert [line.split("  ")[1] for line in lines[1:]] == [
        "submissions", "reads", "tasks in batches"]
    assert re.fullmatch(r"  submissions +[\d,.]+/s, p50 [\d.]+ ms, p99 [\d.]+ ms, "
                        r"server CPU [\d.]+ ms/request", lines[1]), lines[1]
    assert "/s in batches of 10" in lines[3]


def test_bad_arguments_exit_2(capsys) -> None:
    assert api.main(["--clients", "0"]) == 2
    assert api.main(["--preview-pools", "-1"]) == 2
    assert api.main(["--preview-writes", "-1"]) == 2
    assert api.main(["--url", "http://127.0.0.1:1"]) == 2
    assert "--key" in capsys.readouterr().err
