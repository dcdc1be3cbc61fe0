"""A pipeline into a Delta table, epoch after epoch, on the local executor and on the warm Spark runtime
(its tasks stage Arrow batches): each record once as delta-rs reads the table, one table version per
committed epoch that read something, each version the table as of its epoch, and the pipeline's
transaction version at its last epoch."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_until
from onceflow.pipeline import Pipeline, SinkSpec
from tests.integration.pipeline_helpers import epochs_that_read, produce_views, views_pipeline

pytestmark = pytest.mark.integration

PIPELINE: Pipeline | None = None  # set by the test; `run_until` loads it as this module's attribute


def test_each_record_lands_once_in_one_delta_version_per_epoch(
    settings: Settings, make_topic: Any, tmp_path: Path, run_settings: Settings
) -> None:
    from deltalake import DeltaTable

    global PIPELINE
    topic = make_topic("delta", partitions=2)
    name = f"delta_{uuid.uuid4().hex[:8]}"
    table_path = tmp_path / "lake" / "views"
    columns = {"id": "long", "page": "string", "_partition": "int"}
    PIPELINE = views_pipeline(
        name, topic, SinkSpec("lake", "delta", {"path": str(table_path), "columns": columns})
    )
    path = f"{__name__}:PIPELINE"
    produce_views(settings.kafka_bootstrap, topic, range(100))
    run_until(path, run_settings, until_caught_up=True, executor="local")
    produce_views(settings.kafka_bootstrap, topic, range(100, 160))
    run_until(path, run_settings, until_caught_up=True, executor="connect")

    table = DeltaTable(str(table_path))
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(160))
    read = epochs_that_read(run_settings, name)
    assert table.version() == len(read)  # version 0 made the table; one more per epoch that read
    for version, epoch in enumerate(read, start=1):
        as_of = DeltaTable(str(table_path), version=version).to_pyarrow_table().column("id").to_pylist()
        expected = sum(r.until_offset for r in epoch.ranges)  # offsets read up to and with this epoch
        assert len(as_of) == expected, (version, epoch.number)
    assert table.transaction_version(f"{name}:lake") == read[-1].number
