"""The page views example into Iceberg, end to end as a user runs it: `onceflow run` on Spark (the warm
runtime when ONCEFLOW_SPARK_REMOTE is set, else spark-submit) for two epochs, then the example's query
with pyiceberg and with Spark SQL, both giving the exact counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from examples.orders.data import produce

from onceflow.engine.submit import CONNECT_MODE_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MINUTE = 60_000


def _views(now_ms: int, count: int, seed: int) -> list[dict[str, Any]]:
    return [
        {"page": f"/p{(seed + i) % 3}", "user": f"u{i}", "ts": now_ms - (i * 7_000) % 50_000}
        for i in range(count)
    ]


def _run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [*args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{args}: {done.stderr[-3000:]}"
    return done.stdout


def test_views_per_minute_land_in_iceberg_and_read_the_same_in_two_engines(
    make_topic: Any, tmp_path: Path, settings: Any
) -> None:
    topic = make_topic("pageviews")
    suffix = topic.removeprefix("pageviews")
    # What a user's shell has: not the Spark Connect mode that pyspark sets in this process's environment
    # once an earlier test opened a Connect session (the query's Spark SQL is a classic local session).
    env = {
        **{k: v for k, v in os.environ.items() if k not in CONNECT_MODE_ENV},
        "ONCEFLOW_PAGEVIEWS_SUFFIX": suffix,
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
        "ONCEFLOW_HOME": str(tmp_path / "home"),
        "ONCEFLOW_PIPELINES": "examples.pageviews_iceberg.pipeline:PAGEVIEWS_ICEBERG",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(REPO), *sys.path])),
    }
    onceflow = str(Path(sys.executable).parent / "onceflow")
    _run(env, onceflow, "db", "upgrade")
    sent: list[dict[str, Any]] = []
    for run in range(2):
        batch = _views(int(time.time() * 1000), 20, seed=run)
        sent += batch
        produce(settings.kafka_bootstrap, topic, [(None, json.dumps(v).encode()) for v in batch])
        _run(env, onceflow, "run", f"pageviews_iceberg{suffix}", "--executor", "spark")

    expected = Counter((int(v["ts"]) // MINUTE * MINUTE, str(v["page"])) for v in sent)
    for engine in ([], ["--spark"]):
        out = _run(env, sys.executable, "-m", "examples.pageviews_iceberg.query", *engine)
        seen: dict[tuple[int, str], int] = {}
        for line in out.splitlines():
            minute, page, views = line.split("  ")
            from datetime import datetime

            ms = int(datetime.fromisoformat(minute).timestamp() * 1000)
            seen[(ms, page)] = int(views)
        assert seen == dict(expected), engine
