"""``berth bench api`` end to end with tiny counts: its own server, one JSON line."""

from __future__ import annotations

import json

import pytest

from bench import api


@pytest.mark.slow
def test_tiny_run_prints_one_json_line(server_url, monkeypatch, capsys) -> None:
    # Enough requests that the server's CPU time spans several clock ticks (10 ms each): a
    # read costs ~0.25 ms of CPU, so 40 reads could round down to zero.
    status = api.main(["--server-url", server_url, "--clients", "4", "--count", "300",
                       "--reads", "300", "--warmup", "10", "--seconds", "30", "--pool-size", "2",
                       "--preview-pools", "200", "--previews", "3"])
    assert status == 0
    lines = capsys.readouterr().out.strip().splitlines()
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


def test_bad_arguments_exit_2(capsys) -> None:
    assert api.main(["--clients", "0"]) == 2
    assert api.main(["--preview-pools", "-1"]) == 2
    assert api.main(["--url", "http://127.0.0.1:1"]) == 2
    assert "--key" in capsys.readouterr().err
