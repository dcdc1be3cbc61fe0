"""A pipeline into a Delta table, epoch after epoch, on the local executor and on the warm Spark runtime
(its tasks stage Arrow batches): each record once as delta-rs reads the table, one table version per
committed epoch that read something, each version the table as of its epoch, and the pipeline's
transaction version at its last epoch."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.engine.runner import run_until
from onceflow.ledger import Ledger
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

pytestmark = pytest.mark.integration

PIPELINE: Pipeline | None = None  # set by the test; `run_until` loads it as this module's attribute


def _produce(bootstrap: str, topic: str, ids: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in ids:
        producer.produce(
            topic, key=str(i), value=json.dumps({"id": i, "page": f"/p{i % 5}"}), partition=i % 2
        )
    producer.flush()


def test_each_record_lands_once_in_one_delta_version_per_epoch(
    settings: Settings, make_topic: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    global PIPELINE
    topic = make_topic("delta", partitions=2)
    name = f"delta_{uuid.uuid4().hex[:8]}"
    table_path = tmp_path / "lake" / "views"
    PIPELINE = Pipeline(
        name=name,
        source=KafkaSource(topics=(topic,)),
        format=JsonFormat(schema={"id": "int", "page": "string"}),
        sinks=(
            SinkSpec(
                "lake",
                "delta",
                {"path": str(table_path), "columns": {"id": "long", "page": "string", "_partition": "int"}},
            ),
        ),
        max_records_per_partition=40,
        max_records_per_task=20,
    )
    run_settings = Settings.from_env(
        {
            **os.environ,
            "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path}/ledger.db",
            "ONCEFLOW_HOME": str(tmp_path),
        }
    )
    with Ledger.connect(run_settings.ledger_url, check=False) as ledger:
        ledger.upgrade()
    path = f"{__name__}:PIPELINE"
    _produce(settings.kafka_bootstrap, topic, range(100))
    run_until(path, run_settings, until_caught_up=True, executor="local")
    _produce(settings.kafka_bootstrap, topic, range(100, 160))
    run_until(path, run_settings, until_caught_up=True, executor="connect")

    table = DeltaTable(str(table_path))
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(160))
    with Ledger.connect(run_settings.ledger_url) as ledger:
        epochs = [e for e in ledger.epochs(name) if e.status.value == "COMMITTED"]
    read = [e for e in epochs if any(not r.is_empty for r in e.ranges)]
    assert table.version() == len(read)  # version 0 made the table; one more per epoch that read
    for version, epoch in enumerate(read, start=1):
        as_of = DeltaTable(str(table_path), version=version).to_pyarrow_table().column("id").to_pylist()
        expected = sum(r.until_offset for r in epoch.ranges)  # offsets read up to and with this epoch
        assert len(as_of) == expected, (version, epoch.number)
    assert table.transaction_version(f"{name}:lake") == read[-1].number
