"""``berth bench watch`` end to end with tiny counts: its own server and reconciler, a few
watchers, then one JSON line with the latency, the delivery and the CPU of each process."""

from __future__ import annotations

import json

import pytest

from bench import watch


@pytest.mark.slow
def test_tiny_run_prints_one_json_line_with_the_cpu_of_each_process(server_url, capsys) -> None:
    status = watch.main(["--server-url", server_url, "--idle", "3", "--pools", "2",
                         "--rate", "50", "--seconds", "2"])
    assert status == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["idleWatchers"] == 3 and result["runtimeWatchers"] == 2
    assert result["submitted"] + result["errors"] == 100
    # Every lease of every accepted task reaches its runtime's stream.
    assert result["submitted"] > 0 and result["seenByRuntime"] == result["submitted"]
    assert 0 < result["p50Ms"] <= result["p99Ms"]
    cpu = result["cpuMsPerSubmission"]
    assert set(cpu) == {"api", "reconciler", "database", "clients"}
    # PostgreSQL runs on this machine in the tests, so its processes are counted too.
    assert all(ms is not None and ms > 0 for ms in cpu.values()), cpu
    assert result["serverCpuMsPerEvent"] > 0
