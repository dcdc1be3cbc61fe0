"""The benchmark harness runs end to end on the real stack and writes a well-formed report.

Only the parts without Spark (commit cost, also of the files sink in the stack's bucket, the sinks'
protocol cost and the machine's limit beside one Python consumer, at tiny sizes):
the full benchmark is `make bench`, whose figures are never asserted by tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench.dataset import kept

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_writes_report(settings, tmp_path) -> None:
    env = {**os.environ, **settings.as_env()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "report.json").read_text())
    in_bucket = {"files_s3"} if settings.s3 is not None else set()  # the files sink in the stack's bucket
    assert set(results["commit_cost"]) == {"postgres_2pc", "files", "kafka", "delta", *in_bucket}
    round_ = results["throughput"]["2000"][0]
    for figure in ("limit", "jvm_consumer", "native_decode_write", "machine_limit"):
        assert round_[figure]["records_per_s"] > 0, figure
    assert round_["native_decode_write"]["kept"] == kept(2_000)  # the bench's filter and no other
    machine_s = round_["machine_limit"]["read_s"] + round_["machine_limit"]["decode_write_s"]
    assert round_["machine_limit"]["records_per_s"] == pytest.approx(2_000 / machine_s)
    assert set(results["sink_protocol"]["1000"][0]) == {"plain_s", "postgres_2pc_s"}
    report = (tmp_path / "report.md").read_text()
    headings = (
        "# onceflow benchmarks",
        "## Targets",
        "## Commit time",
        "## Exactly-once against at-least-once",
    )
    for heading in headings:
        assert heading in report
    assert "| postgres_2pc |" in report
    assert "| delta |" in report  # the Delta commit, staged and committed through delta-rs
