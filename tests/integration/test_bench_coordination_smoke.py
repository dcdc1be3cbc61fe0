"""The coordination bench runs end to end on the stack's PostgreSQL at tiny sizes and writes its section.

The full bench is `make bench-coordination`; its figures are never asserted by tests. What is asserted
here is what the harness must get right whatever the machine: every epoch committed, the rows it counts
per epoch, retention keeping the ledger at the configured number of epochs, and the report's section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_coordination_bench_smoke(settings, tmp_path) -> None:
    report = tmp_path / "report.md"
    report.write_text(
        "# benchmarks\n\n<!-- coordination-bench -->\nstale\n<!-- /coordination-bench -->\n\n"
        "<!-- other -->\nkept\n"
    )
    env = {**os.environ, **settings.as_env()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.coordination",
            "--smoke",
            "--out",
            str(tmp_path),
            "--report",
            str(report),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "coordination.json").read_text())
    # --smoke: 20 partitions, 12 participants, 4 epochs of history, 3 kept, 2 timed epochs.
    assert results["projection"]["rows_per_epoch_total"] == 1 + 20 + 12
    for backend in ("postgresql", "sqlite"):
        wide = results["wide"][backend]
        assert wide["rows_before"] == {
            "epochs": 5,
            "epoch_offsets": 100,
            "participants": 60,
            "dead_letters": 0,
        }
        assert wide["rows_after_epochs"]["epochs"] == 3  # retention after every timed epoch keeps 3
        assert wide["rows_after_epochs"]["epoch_offsets"] == 60
        assert wide["retention_run"]["epochs_deleted"] == 1
        assert wide["rows_after_retention"]["participants"] == 2 * 12
        assert all(t > 0 for t in wide["coordination_s"]) and len(wide["coordination_s"]) == 2
    many = results["many"]
    assert (many["pipelines"], many["epochs_each"]) == (4, 2) and many["epochs_per_s"] > 0
    text = report.read_text()
    assert "stale" not in text and text.count("<!-- coordination-bench -->") == 1
    assert "## Coordination at scale" in text and "no-op committer" in text
    assert "<!-- other -->\nkept" in text
