"""A source table captured by Debezium on the stack's Kafka Connect, read by a pipeline as change events
into a change log (the files sink, each row with its op), epoch after epoch: replaying the log in source
order gives the source table, row for row, in both of Debezium's JSON serializations."""

from __future__ import annotations

import datetime as dt
import os
import sys
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus
from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import read_committed_table
from tests.cdc import ChangeReader, register_postgres_connector, require_connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "tests.integration.engine.test_cdc_pipeline"
SCHEMA = {"id": "int", "name": "string", "qty": "int?", "price": "decimal(10,2)?", "updated_at": "timestamp"}


def __getattr__(name: str) -> Pipeline:
    """``PIPELINE``, built when asked for: the test's topic is known only then."""
    if name != "PIPELINE":
        raise AttributeError(name)
    return Pipeline(
        name=f"{os.environ.get('ONCEFLOW_TEST_PIPELINE', 'engine-test')}-cdc",
        source=KafkaSource(topics=(os.environ["ONCEFLOW_TEST_CDC_TOPIC"],)),
        format=JsonFormat(schema=SCHEMA, changes=Debezium(key=("id",))),
        sinks=(SinkSpec("log", "files", {"root": os.environ["ONCEFLOW_TEST_FILES"], "table": "log"}),),
        max_records_per_task=3,
    )


@pytest.fixture
def source_table(stack, settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    table = f"cdc_mirror_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id integer PRIMARY KEY, name text NOT NULL, qty integer, "
            "price numeric(10, 2), updated_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        conn.execute(
            f"INSERT INTO {table} (id, name, qty, price) VALUES (1, 'ana', 3, 9.50), (2, 'ben', 1, -120)"
        )
    yield table
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def _source_rows(dsn: str, table: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT id, name, qty, price, updated_at FROM {table}").fetchall()
    return {r[0]: dict(zip(("id", "name", "qty", "price", "updated_at"), r, strict=True)) for r in rows}


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
            mirror[row["id"]] = {k: row[k] for k in SCHEMA}
    return mirror


@pytest.mark.parametrize("serialization", ["json", "json-schemaless"])
def test_debezium_changes_become_a_change_log_that_replays_to_the_source_table(  # type: ignore[no-untyped-def]
    stack, settings, source_table, kafka_admin, monkeypatch, serialization
) -> None:
    require_connect(settings)
    connector = register_postgres_connector(settings.pg_dsn, [f"public.{source_table}"], serialization)
    topic = connector.topic(source_table)
    monkeypatch.setenv("ONCEFLOW_TEST_CDC_TOPIC", topic)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    reader = ChangeReader(settings.kafka_bootstrap, topic, serialization)
    try:
        connector.wait_running()
        reader.read(2, timeout_s=120)  # the snapshot's two rows
        first = run_epoch(f"{MODULE}:PIPELINE", Settings.from_env())
        assert first.epoch.status == EpochStatus.COMMITTED
        assert _replayed(stack["ONCEFLOW_TEST_FILES"]) == _source_rows(settings.pg_dsn, source_table)

        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {source_table} (id, name, qty, price) VALUES (3, 'eve', 7, 0.99)")
            conn.execute(f"UPDATE {source_table} SET qty = 4, price = 10.25, updated_at = now() WHERE id = 1")
            conn.execute(f"DELETE FROM {source_table} WHERE id = 2")
            with conn.transaction():
                conn.execute(f"INSERT INTO {source_table} (id, name, qty) VALUES (4, 'kim', NULL)")
                conn.execute(f"UPDATE {source_table} SET name = 'kim k', price = 1234567.89 WHERE id = 4")
        reader.read(6, timeout_s=120)  # insert, update, delete and its tombstone, the transaction's two
        second = run_epoch(f"{MODULE}:PIPELINE", Settings.from_env())
        assert second.epoch.status == EpochStatus.COMMITTED
        mirror = _replayed(stack["ONCEFLOW_TEST_FILES"])
        source = _source_rows(settings.pg_dsn, source_table)
        assert mirror == source and sorted(mirror) == [1, 3, 4]
        assert mirror[4]["price"] == Decimal("1234567.89") and mirror[1]["price"] == Decimal("10.25")
        assert isinstance(mirror[1]["updated_at"], dt.datetime)
        ops = [r["_op"] for r in read_committed_table(stack["ONCEFLOW_TEST_FILES"], "log").to_pylist()]
        assert sorted(ops) == sorted(["r", "r", "c", "u", "d", "d", "c", "u"])
    finally:
        reader.close()
        connector.delete()
        existing = set(kafka_admin.list_topics(timeout=10).topics)
        if topic in existing:
            for future in kafka_admin.delete_topics([topic]).values():
                future.result(timeout=30)
