"""The fixed start-up cost of a spark-submit, measured with a job that does nothing (`spark_noop`).

Submitted with the same master, settings and environment as `onceflow.engine.runner.submit_slice`, so the
difference between a slice's wall time and this is the slice's processing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from onceflow.config import Settings
from onceflow.engine.submit import spark_environment

NOOP = Path(__file__).resolve().parent / "spark_noop.py"


def spark_startup_s(settings: Settings, *, master: str = "local[2]") -> float:
    command = [
        "spark-submit",
        "--master", master,
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=4",
        str(NOOP),
    ]  # fmt: skip
    env = spark_environment(settings)
    env["PYTHONPATH"] = ":".join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"spark-submit of {NOOP.name} failed: {result.stderr[-2000:]}")
    return elapsed
