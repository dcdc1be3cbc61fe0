"""The Avro orders example as its docstring runs it: orders of schema version 1, an epoch, the producer
moves to version 2, another epoch; the table holds every order once, v1 orders read with v2's defaults."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus, Ledger

pytestmark = pytest.mark.integration


def test_orders_before_and_after_the_producers_schema_change_land_once(
    make_topic: Any, pg_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.avro_orders import pipeline, produce

    topic = make_topic("avro-orders")
    monkeypatch.setenv("ONCEFLOW_AVRO_ORDERS_SUFFIX", topic.removeprefix("avro-orders"))
    monkeypatch.setenv("ONCEFLOW_AVRO_ORDERS_PG_DSN", pg_database)
    importlib.reload(pipeline)
    importlib.reload(produce)
    assert topic == pipeline.INPUT_TOPIC
    try:
        check_the_example(pipeline, produce, topic, pg_database, tmp_path)
    finally:  # later importers see the example's own names again
        monkeypatch.undo()
        importlib.reload(pipeline)
        importlib.reload(produce)


def check_the_example(pipeline: Any, produce: Any, topic: str, pg_database: str, tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            **os.environ,
            "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path}/ledger.db",
            "ONCEFLOW_HOME": str(tmp_path),
            "ONCEFLOW_SCHEMA_REGISTRY_URL": f"file://{pipeline.SCHEMAS}",
        }
    )
    with Ledger.connect(settings.ledger_url, check=False) as ledger:
        ledger.upgrade()

    produce.produce(settings, version=1, start=0, count=30, topic=topic)
    first = run_epoch("examples.avro_orders.pipeline:AVRO_ORDERS", settings, executor="local")
    produce.produce(settings, version=2, start=30, count=30, topic=topic)
    second = run_epoch("examples.avro_orders.pipeline:AVRO_ORDERS", settings, executor="local")
    assert (first.epoch.status, second.epoch.status) == (EpochStatus.COMMITTED, EpochStatus.COMMITTED)

    with psycopg.connect(pg_database) as conn:
        stored = conn.execute(
            f"SELECT id, customer, amount, placed_at, channel, order_key FROM {pipeline.TABLE} ORDER BY id"
        ).fetchall()
    expected = []
    for i in range(60):
        o = produce.order(i, 1 if i < 30 else 2)
        expected.append((i, o["customer"], o["amount"], o["placed_at"], o.get("channel"), f"order-{i}"))
    assert stored == expected
    with Ledger.connect(settings.ledger_url) as ledger:
        assert ledger.dead_letters(pipeline.NAME) == []
