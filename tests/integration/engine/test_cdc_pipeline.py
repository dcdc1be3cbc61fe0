"""A source table captured by Debezium on the stack's Kafka Connect, read by a pipeline as change events,
epoch after epoch, in each of Debezium's serializations (JSON with and without schemas, Avro through
the registry): into a change log (the files sink, each row
with its op), which replayed in source order gives the source table, and into a PostgreSQL mirror that
applies them by key, which is the source table after each committed epoch, row for row (from JSON
events, into an Iceberg mirror too: `iceberg_changes`, one snapshot per epoch). Read tasks of three
records put changes of one key into several tasks of an epoch."""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus
from onceflow.pipeline import AvroFormat, Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import read_committed_table
from tests.cdc import ChangeReader, register_postgres_connector, require_connect
from tests.cdc import source_table as cdc_source_table
from tests.integration.engine.cdc_helpers import (
    SECOND_EPOCH_EVENTS,
    change_in_second_epoch,
    delete_topic,
    table_rows,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "tests.integration.engine.test_cdc_pipeline"
MIRROR_COLUMNS = {
    "id": "bigint",
    "name": "text",
    "qty": "bigint",
    "price": "numeric(10,2)",
    "updated_at": "timestamptz",
}
ICEBERG_COLUMNS = {
    "id": "long",
    "name": "string",
    "qty": "long",
    "price": "decimal(10,2)",
    "updated_at": "timestamptz",
}
ICEBERG_TABLE = "cdc.mirror"
# The serializations also mirrored into Iceberg: each costs ~9 s more (pyiceberg in fresh Spark workers).
ICEBERG_MIRRORED = ("json",)
SCHEMA = {"id": "int", "name": "string", "qty": "int?", "price": "decimal(10,2)?", "updated_at": "timestamp"}


def __getattr__(name: str) -> Pipeline:
    """``PIPELINE``, built when asked for: the test's topic is known only then."""
    if name != "PIPELINE":
        raise AttributeError(name)
    topic = os.environ["ONCEFLOW_TEST_CDC_TOPIC"]
    fmt: JsonFormat | AvroFormat = JsonFormat(schema=SCHEMA, changes=Debezium(key=("id",)))
    serialization = os.environ.get("ONCEFLOW_TEST_CDC_SERIALIZATION")
    if serialization == "avro":  # the connector's value subject
        fmt = AvroFormat(subject=f"{topic}-value", changes=Debezium(key=("id",)))
    return Pipeline(
        name=f"{os.environ.get('ONCEFLOW_TEST_PIPELINE', 'engine-test')}-cdc",
        source=KafkaSource(topics=(topic,)),
        format=fmt,
        sinks=(
            SinkSpec("log", "files", {"root": os.environ["ONCEFLOW_TEST_FILES"], "table": "log"}),
            SinkSpec(
                "mirror",
                "postgres_changes",
                {
                    "table": os.environ["ONCEFLOW_TEST_TABLE"],
                    "columns": MIRROR_COLUMNS,
                    "key_columns": ["id"],
                },
            ),
            *(
                [
                    SinkSpec(
                        "lake",
                        "iceberg_changes",
                        {"table": ICEBERG_TABLE, "columns": ICEBERG_COLUMNS, "key_columns": ["id"]},
                    )
                ]
                if serialization in ICEBERG_MIRRORED
                else []
            ),
        ),
        max_records_per_task=3,
    )


@pytest.fixture
def source_table(stack, settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with cdc_source_table(settings.pg_dsn, "cdc_mirror", "-120") as table:
        yield table


def _replayed(root: str) -> dict[int, dict[str, Any]]:
    """The change log applied in source order: the last change of a key wins, a delete removes it."""
    log = sorted(read_committed_table(root, "log").to_pylist(), key=lambda r: (r["_partition"], r["_offset"]))
    mirror: dict[int, dict[str, Any]] = {}
    for row in log:
        if row["_op"] == "d":
            mirror.pop(row["id"], None)
        elif row["_op"] == "t":
            mirror.clear()
        else:
            mirror[row["id"]] = {k: _time(row[k]) for k in SCHEMA}
    return mirror


def _iceberg_rows(epochs: int) -> dict[int, dict[str, Any]]:
    """The Iceberg mirror as pyiceberg reads it, checked to have one snapshot per epoch."""
    from onceflow.sinks.iceberg import default_catalog_properties
    from onceflow.sinks.iceberg import table as tables

    home = Settings.from_env().home
    table = tables.load(tables.catalog("onceflow", default_catalog_properties(home)), ICEBERG_TABLE)
    assert table is not None and len(table.snapshots()) == epochs
    rows = table.scan().to_arrow().to_pylist()
    return {r["id"]: {k: r[k] for k in SCHEMA} for r in rows}


def _time(value: Any) -> Any:
    """Avro rows keep Debezium's zoned timestamps as the ISO text they are."""
    if isinstance(value, str) and value.endswith("Z") and "T" in value:
        return dt.datetime.fromisoformat(value.removesuffix("Z") + "+00:00")
    return value


@pytest.mark.parametrize("serialization", ["json", "json-schemaless", "avro"])
def test_debezium_changes_become_a_change_log_that_replays_to_the_source_table(  # type: ignore[no-untyped-def]
    stack, settings, source_table, kafka_admin, monkeypatch, request, serialization
) -> None:
    require_connect(settings)
    registry = settings.schema_registry_url
    if serialization == "avro":
        request.getfixturevalue("schema_registry")  # skips, saying why, where no registry can run
    connector = register_postgres_connector(
        settings.pg_dsn, [f"public.{source_table}"], serialization, registry_url=registry
    )
    topic, mirror = connector.topic(source_table), stack["ONCEFLOW_TEST_TABLE"]
    monkeypatch.setenv("ONCEFLOW_TEST_CDC_TOPIC", topic)
    monkeypatch.setenv("ONCEFLOW_TEST_CDC_SERIALIZATION", serialization)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    reader = ChangeReader(settings.kafka_bootstrap, topic, serialization, registry)
    try:
        connector.wait_running()
        reader.read(2, timeout_s=120)  # the snapshot's two rows
        first = run_epoch(f"{MODULE}:PIPELINE", Settings.from_env())
        assert first.epoch.status == EpochStatus.COMMITTED
        assert _replayed(stack["ONCEFLOW_TEST_FILES"]) == table_rows(settings.pg_dsn, source_table)
        assert table_rows(settings.pg_dsn, mirror) == table_rows(settings.pg_dsn, source_table)
        if serialization in ICEBERG_MIRRORED:
            assert _iceberg_rows(epochs=1) == table_rows(settings.pg_dsn, source_table)

        change_in_second_epoch(settings.pg_dsn, source_table)
        reader.read(SECOND_EPOCH_EVENTS, timeout_s=120)
        second = run_epoch(f"{MODULE}:PIPELINE", Settings.from_env())
        assert second.epoch.status == EpochStatus.COMMITTED
        replayed = _replayed(stack["ONCEFLOW_TEST_FILES"])
        source = table_rows(settings.pg_dsn, source_table)
        assert replayed == source and sorted(replayed) == [1, 3, 4]
        assert replayed[4]["price"] == Decimal("1234567.89") and replayed[1]["price"] == Decimal("10.25")
        assert isinstance(replayed[1]["updated_at"], dt.datetime)
        assert table_rows(settings.pg_dsn, mirror) == source
        if serialization in ICEBERG_MIRRORED:
            assert _iceberg_rows(epochs=2) == source
        ops = [r["_op"] for r in read_committed_table(stack["ONCEFLOW_TEST_FILES"], "log").to_pylist()]
        assert sorted(ops) == sorted(["r", "r", "c", "u", "u", "u", "u", "d", "d", "c", "u"])
    finally:
        reader.close()
        connector.delete()
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {mirror}_onceflow_changes")
        delete_topic(kafka_admin, topic)
