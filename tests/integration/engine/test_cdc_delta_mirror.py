"""A source table captured by Debezium on the stack's Kafka Connect, mirrored into a Delta table by a
pipeline with the `delta_changes` sink, epoch after epoch: inserts, updates (of one key in several read
tasks of an epoch), deletes, a delete and re-insert of one key, and a truncate followed by inserts. After
each committed epoch the Delta table, read by delta-rs, is the source table row for row, and holds one
version per epoch."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus
from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from tests.cdc import ChangeReader, register_postgres_connector, require_connect
from tests.cdc import source_table as cdc_source_table
from tests.integration.engine.cdc_helpers import (
    SECOND_EPOCH_EVENTS,
    change_in_second_epoch,
    delete_topic,
    table_rows,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "tests.integration.engine.test_cdc_delta_mirror"
SCHEMA = {"id": "int", "name": "string", "qty": "int?", "price": "decimal(10,2)?", "updated_at": "timestamp"}
DELTA_COLUMNS = {
    "id": "long",
    "name": "string",
    "qty": "long",
    "price": "decimal(10,2)",
    "updated_at": "timestamptz",
}


def _delta_path() -> str:
    return os.path.join(os.environ["ONCEFLOW_TEST_FILES"], "delta", "mirror")


def __getattr__(name: str) -> Pipeline:
    """``PIPELINE``, built when asked for: the test's topic is known only then."""
    if name != "PIPELINE":
        raise AttributeError(name)
    return Pipeline(
        name=f"{os.environ.get('ONCEFLOW_TEST_PIPELINE', 'engine-test')}-cdc-delta",
        source=KafkaSource(topics=(os.environ["ONCEFLOW_TEST_CDC_TOPIC"],)),
        format=JsonFormat(schema=SCHEMA, changes=Debezium(key=("id",))),
        sinks=(
            SinkSpec(
                "lake",
                "delta_changes",
                {"path": _delta_path(), "columns": DELTA_COLUMNS, "key_columns": ["id"]},
            ),
        ),
        max_records_per_task=3,
    )


@pytest.fixture
def source_table(stack, settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with cdc_source_table(settings.pg_dsn, "cdc_delta", "-120") as table:
        yield table


def _delta_rows(epochs: int) -> dict[int, dict[str, Any]]:
    """The Delta mirror as delta-rs reads it, checked to hold one commit per epoch, in order."""
    from deltalake import DeltaTable

    table = DeltaTable(_delta_path())
    history = sorted(table.history(), key=lambda h: h["version"])
    assert [int(h["onceflow.epoch"]) for h in history if "onceflow.epoch" in h] == list(range(1, epochs + 1))
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted(table.schema().to_arrow().names) == sorted(SCHEMA)  # no op nor source position
    mirror = {r["id"]: r for r in rows}
    assert len(mirror) == len(rows)  # one row per key
    return mirror


def test_debezium_changes_mirror_the_source_table_into_delta(  # type: ignore[no-untyped-def]
    stack, settings, source_table, kafka_admin, monkeypatch
) -> None:
    require_connect(settings)
    connector = register_postgres_connector(settings.pg_dsn, [f"public.{source_table}"], "json")
    topic = connector.topic(source_table)
    monkeypatch.setenv("ONCEFLOW_TEST_CDC_TOPIC", topic)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    reader = ChangeReader(settings.kafka_bootstrap, topic, "json")

    def epoch(number: int) -> dict[int, dict[str, Any]]:
        result = run_epoch(f"{MODULE}:PIPELINE", Settings.from_env())
        assert result.epoch.status == EpochStatus.COMMITTED and result.epoch.number == number
        source = table_rows(settings.pg_dsn, source_table)
        assert _delta_rows(epochs=number) == source
        return source

    try:
        connector.wait_running()
        reader.read(2, timeout_s=120)  # the snapshot's two rows
        assert sorted(epoch(1)) == [1, 2]

        change_in_second_epoch(settings.pg_dsn, source_table)
        reader.read(SECOND_EPOCH_EVENTS, timeout_s=120)
        source = epoch(2)
        assert sorted(source) == [1, 3, 4] and source[1]["qty"] == 7

        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {source_table} WHERE id = 3")
            conn.execute(f"INSERT INTO {source_table} (id, name, qty, price) VALUES (3, 'eve 2', 8, 1.50)")
            conn.execute(f"UPDATE {source_table} SET name = 'ana b', qty = NULL WHERE id = 1")
            conn.execute(f"DELETE FROM {source_table} WHERE id = 4")
        reader.read(6, timeout_s=120)  # delete, tombstone, insert, update, delete, tombstone
        source = epoch(3)
        assert sorted(source) == [1, 3] and source[3]["name"] == "eve 2" and source[1]["qty"] is None

        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {source_table} SET qty = 99 WHERE id = 3")
            conn.execute(f"TRUNCATE {source_table}")
            conn.execute(f"INSERT INTO {source_table} (id, name, qty) VALUES (5, 'lee', 1), (6, 'max', 2)")
            conn.execute(f"UPDATE {source_table} SET qty = 3 WHERE id = 6")
        reader.read(5, timeout_s=120)  # update, truncate, two inserts, update
        assert sorted(epoch(4)) == [5, 6]
    finally:
        reader.close()
        connector.delete()
        delete_topic(kafka_admin, topic)
