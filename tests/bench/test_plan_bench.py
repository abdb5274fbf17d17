"""`berth bench plan`: the passes a tiny e2e run recorded, planned again offline, give the
recorded plans, and a plan that differs fails the run."""

from __future__ import annotations

import orjson
import pytest

from bench import plan


def test_recorded_passes_plan_again_to_their_digests(
    server_url: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "records.json"
    status = plan.main(
        ["--pools", "20", "--tasks", "200", "--reconcilers", "2", "--server-url", server_url,
         "--save", str(saved), "--passes", "100", "--repeat", "2", "--json"]
    )
    result = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 0
    records, pools = plan.records_load(saved)
    assert result["passes"] == len(records) >= 2
    assert result["plansIdentical"] == result["passes"]
    assert result["tasks"] >= 200 and result["cpuUsPerTask"] > 0
    assert {r.pools_digest for r in records} <= set(pools)

    # The same file again, decoding only: the same tasks, nothing planned.
    status = plan.main(["--records", str(saved), "--passes", "100", "--stop-after", "decode",
                        "--json"])
    again = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 0
    assert again["tasks"] == result["tasks"] and "cpuUsPerTask" not in again

    # A recorded digest the plan does not have fails the run.
    doc = orjson.loads(saved.read_bytes())
    doc["records"][0][2] = "0" * 32
    saved.write_bytes(orjson.dumps(doc))
    status = plan.main(["--records", str(saved), "--passes", "100", "--repeat", "1", "--json"])
    changed = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 1 and changed["plansIdentical"] == result["passes"] - 1

