"""Epochs cut between source transactions: two captured tables written by transactions that each span
both, read by one pipeline through Debezium's transaction metadata into one PostgreSQL mirror, with an
epoch limit smaller than a transaction. After every committed epoch the mirror holds each source
transaction whole or not at all; at the end it is the source, row for row."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus
from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from tests.cdc import ChangeReader, register_postgres_connector, require_connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "tests.integration.engine.test_cdc_transactions"
ROWS = 4  # rows each transaction writes to each table: more than an epoch's limit of 3 per partition
TEXT_SCHEMA = {"id": "int", "batch": "int", "name": "string"}


def __getattr__(name: str) -> Pipeline:
    if name != "PIPELINE":
        raise AttributeError(name)
    topics = tuple(os.environ["ONCEFLOW_TEST_CDC_TOPICS"].split(","))
    return Pipeline(
        name=f"{os.environ.get('ONCEFLOW_TEST_PIPELINE', 'engine-test')}-cdc-txn",
        source=KafkaSource(topics=topics),
        format=JsonFormat(
            schema=TEXT_SCHEMA,
            changes=Debezium(key=("id",), transactions=os.environ["ONCEFLOW_TEST_CDC_TRANSACTIONS"]),
        ),
        sinks=(
            SinkSpec(
                "mirror",
                "postgres_changes",
                {
                    "table": os.environ["ONCEFLOW_TEST_TABLE"],
                    "columns": {"id": "bigint", "batch": "bigint", "name": "text"},
                    "key_columns": ["id"],
                },
            ),
        ),
        max_records_per_partition=3,
        max_records_per_task=2,
    )


@pytest.fixture
def two_tables(stack, settings) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    suffix = uuid.uuid4().hex[:8]
    tables = (f"cdc_txn_a_{suffix}", f"cdc_txn_b_{suffix}")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, batch int NOT NULL, name text NOT NULL)")
    yield tables
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def _rows(dsn: str, *tables: str) -> dict[int, tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            r[0]: (r[1], r[2])
            for table in tables
            for r in conn.execute(f"SELECT id, batch, name FROM {table}").fetchall()
        }


def _whole_transactions_only(mirror: dict[int, tuple[int, str]]) -> None:
    """What the source's transactions leave, seen at any boundary between them (see `_write`)."""
    by_batch: dict[int, list[str]] = {}
    for batch, name in mirror.values():
        by_batch.setdefault(batch, []).append(name)
    for batch, names in by_batch.items():
        # each batch's insert wrote ROWS rows to each table at once; batch 2 was deleted at once
        assert len(names) == 2 * ROWS, f"batch {batch} is half there: {sorted(names)}"
        # batch 1 was renamed in both tables at once
        assert len(set(names)) == 1, f"batch {batch} is half renamed: {sorted(names)}"


def _write(dsn: str, a: str, b: str) -> None:
    """Four source transactions, each over both tables: batches 1 to 3 inserted, then batch 1 renamed
    and batch 2 deleted together."""
    with psycopg.connect(dsn) as conn:
        for batch in (1, 2, 3):
            for k in range(ROWS):
                conn.execute(f"INSERT INTO {a} VALUES (%s, %s, 'new')", (batch * 100 + k, batch))
                conn.execute(f"INSERT INTO {b} VALUES (%s, %s, 'new')", (10_000 + batch * 100 + k, batch))
            conn.commit()
        for table in (a, b):
            conn.execute(f"UPDATE {table} SET name = 'renamed' WHERE batch = 1")
            conn.execute(f"DELETE FROM {table} WHERE batch = 2")
        conn.commit()


def test_a_mirror_never_shows_half_of_a_source_transaction(  # type: ignore[no-untyped-def]
    stack, settings, two_tables, kafka_admin, monkeypatch
) -> None:
    require_connect(settings)
    a, b = two_tables
    connector = register_postgres_connector(
        settings.pg_dsn, [f"public.{a}", f"public.{b}"], "json-schemaless", transaction_metadata=True
    )
    topics = [connector.topic(a), connector.topic(b)]
    monkeypatch.setenv("ONCEFLOW_TEST_CDC_TOPICS", ",".join(topics))
    monkeypatch.setenv("ONCEFLOW_TEST_CDC_TRANSACTIONS", connector.transaction_topic)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    mirror = stack["ONCEFLOW_TEST_TABLE"]
    readers = [ChangeReader(settings.kafka_bootstrap, t, "json-schemaless") for t in topics]
    boundaries = ChangeReader(settings.kafka_bootstrap, connector.transaction_topic, "json-schemaless")
    try:
        connector.wait_running()
        _write(settings.pg_dsn, a, b)
        for reader in readers:  # 3 batches of inserts, ROWS renames, ROWS deletes and their tombstones
            reader.read(3 * ROWS + ROWS + 2 * ROWS, timeout_s=120)
        boundaries.read(2 * 4, timeout_s=60)  # BEGIN and END of the four transactions
        epochs = 0
        while True:
            done = run_epoch(f"{MODULE}:PIPELINE", Settings.from_env())
            assert done.epoch.status == EpochStatus.COMMITTED
            epochs += 1
            seen = _rows(settings.pg_dsn, mirror)
            _whole_transactions_only(seen)
            if seen == _rows(settings.pg_dsn, a, b) or epochs == 12:
                break
        assert seen == _rows(settings.pg_dsn, a, b)
        # an epoch per transaction at most (a transaction is larger than the limit), and more than one
        assert 2 <= epochs <= 5, epochs
        assert sorted({batch for batch, _ in seen.values()}) == [1, 3]
    finally:
        for reader in (*readers, boundaries):
            reader.close()
        connector.delete()
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {mirror}_onceflow_changes")
        existing = set(kafka_admin.list_topics(timeout=10).topics)
        gone = [t for t in (*topics, connector.transaction_topic) if t in existing]
        if gone:
            for future in kafka_admin.delete_topics(gone).values():
                future.result(timeout=30)
