"""A pipeline into an Iceberg table in a PostgreSQL-backed catalog, read back by two engines onceflow does
not write with: pyiceberg's scan and Spark SQL (Iceberg's Spark runtime, through its JdbcCatalog).

Epochs run through the coordinator (local executor); one of them is rolled back after its tasks staged
their data files, and a zombie attempt stages files after its epoch committed. Each engine must then see
every record exactly once, one snapshot per committed non-empty epoch naming its pipeline and epoch, and
no data file that no snapshot references may be left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from onceflow.committables import TaskContext
from onceflow.config import Settings
from onceflow.engine.local_slice import run_slice_local
from onceflow.engine.runner import run_until
from onceflow.ledger import Ledger
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.protocol.coordinator import Coordinator
from onceflow.sinks import iceberg
from onceflow.sinks.iceberg import IcebergCommitter, IcebergConfig, IcebergWriter
from tests.faults.invariants import iceberg_leftovers
from tests.integration.pipeline_helpers import (
    epochs_that_read,
    produce_views,
    settings_with_own_ledger,
    views_pipeline,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PIPELINE: Pipeline | None = None  # set by the test; `run_until` loads it as this module's attribute
RECORDS = 240


def spark_sql(properties: dict[str, str], *queries: str) -> list[list[dict[str, Any]]]:
    """Each query's rows, as a local Spark with Iceberg's runtime reads them (its own process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_REMOTE", "SPARK_CONNECT"))}
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.iceberg_spark_sql", json.dumps(properties), *queries],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[list[dict[str, Any]]] = []
    for line in done.stdout.splitlines():
        if line.startswith("-- query "):
            results.append([])
        elif line.startswith("{"):
            results[-1].append(json.loads(line))
    return results


def test_two_outside_engines_read_each_record_once(
    settings: Settings, make_topic: Any, pg_database: str, tmp_path: Path
) -> None:
    global PIPELINE
    topic = make_topic("ice", partitions=2)
    warehouse = f"file://{tmp_path}/warehouse"
    sink_config = {
        "table": "web.views",
        "catalog": "onceflow",
        "catalog_properties": {
            "type": "sql",
            "uri": pg_database.replace("postgresql://", "postgresql+psycopg://"),
            "warehouse": warehouse,
        },
        "columns": {"id": "long", "page": "string", "_partition": "int", "_offset": "long"},
        "partition_by": {"_partition": "identity"},
    }
    name = f"ice_{uuid.uuid4().hex[:8]}"
    PIPELINE = views_pipeline(
        name, topic, SinkSpec("lake", "iceberg", sink_config), max_records_per_partition=50
    )
    run_settings = settings_with_own_ledger(tmp_path, home=tmp_path / "home")
    produce_views(settings.kafka_bootstrap, topic, range(RECORDS), pages=7)

    path = f"{__name__}:PIPELINE"
    run_until(path, run_settings, until_caught_up=False, executor="local")  # epoch 1 commits
    # Epoch 2 stages its data files, then its owner gives up: the abort must delete them.
    with Ledger.connect(run_settings.ledger_url) as ledger:
        coordinator = Coordinator.for_pipeline(PIPELINE, ledger, run_settings)
        planned = coordinator.plan(run_id="manual-2")
        assert planned.epoch is not None and planned.attempt_token is not None
        for number in planned.slices_with_tasks:
            run_slice_local(PIPELINE, planned.epoch, number, planned.attempt_token, run_settings)
        staged = IcebergCommitter({**sink_config, "name": "lake"}).orphans(name)
        assert staged and all(c.epoch == planned.epoch for c in staged)
        epoch = ledger.epoch(name, planned.epoch)
        coordinator.abort(number=epoch.number, reason="test: owner gave up after staging")
    # A zombie attempt of epoch 1 stages files after the commit: recover's sweep must delete them.
    zombie = IcebergWriter({**sink_config, "name": "lake"})
    zombie.begin(TaskContext(name, 1, 0, "s0-t0", "zombie", "lake"))
    zombie.write([{"id": -1, "page": "/zombie", "_partition": 0, "_offset": 0}])
    zombie.pre_commit()
    run_until(path, run_settings, until_caught_up=True, executor="local")

    config = IcebergConfig.from_mapping({**sink_config, "name": "lake"})
    table = iceberg.tables.load(config.open_catalog(), config.table)
    assert table is not None
    scanned = table.scan().to_arrow()
    assert sorted(scanned.column("id").to_pylist()) == list(range(RECORDS))
    committed = [e.number for e in epochs_that_read(run_settings, name)]
    summaries = [s.summary for s in table.snapshots()]
    assert [int(s[iceberg.SUMMARY_EPOCH]) for s in summaries] == committed
    assert {s[iceberg.SUMMARY_PIPELINE] for s in summaries} == {name}
    assert iceberg_leftovers(PIPELINE, tmp_path / "home") == []
    assert IcebergCommitter({**sink_config, "name": "lake"}).orphans(name) == []

    counts, history = spark_sql(
        sink_config["catalog_properties"],
        "SELECT count(*) AS n, count(DISTINCT id) AS ids, min(id) AS lo, max(id) AS hi "
        "FROM onceflow.web.views",
        "SELECT summary['onceflow.epoch'] AS epoch FROM onceflow.web.views.snapshots ORDER BY committed_at",
    )
    assert counts == [{"n": RECORDS, "ids": RECORDS, "lo": 0, "hi": RECORDS - 1}]
    assert [int(r["epoch"]) for r in history] == committed
