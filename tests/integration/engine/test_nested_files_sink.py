"""A nested JSON pipeline through whole epochs on the real stack into the files sink: the Parquet table
holds the records' structs, arrays and maps (timestamps, decimals, dates and bytes inside them) with the
types Spark gave them, whether the sink declares its columns as type texts or infers them."""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.decoding.records import row_columns
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus
from onceflow.pipeline import KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import read_committed_table
from tests.integration.test_nested_sinks_files_kafka import COLUMNS, FORMAT, decoded_rows, documents, expected

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "tests.integration.engine.test_nested_files_sink"


def __getattr__(name: str) -> Pipeline:
    """``PIPELINE``, built when asked for: the names of the test's stack are set only then."""
    if name != "PIPELINE":
        raise AttributeError(name)
    root = os.environ.get("ONCEFLOW_TEST_FILES", "/tmp/onceflow-engine-test")
    typed = {n: text for n, text, _ in row_columns(FORMAT) if n in COLUMNS}
    return Pipeline(
        name=f"{os.environ.get('ONCEFLOW_TEST_PIPELINE', 'engine-test')}-nested-files",
        source=KafkaSource(topics=(os.environ.get("ONCEFLOW_TEST_TOPIC", "engine-test"),)),
        format=FORMAT,
        sinks=(
            SinkSpec("inferred", "files", {"root": root, "table": "inferred", "batch_size": 4}),
            SinkSpec("typed", "files", {"root": root, "table": "typed", "columns": typed}),
        ),
        max_records_per_task=7,
    )


@pytest.fixture(autouse=True)
def _fresh_module(stack, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delitem(sys.modules, MODULE, raising=False)


def produce(bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for doc in docs:  # one partition: the table's order is the documents'
        producer.produce(topic, key=str(doc["id"]).encode(), value=json.dumps(doc).encode(), partition=0)
    producer.commit_transaction(30)


def test_nested_records_reach_parquet_as_they_were_decoded(stack, settings) -> None:  # type: ignore[no-untyped-def]
    docs = documents()
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], docs[:15])
    assert run_epoch(f"{MODULE}:PIPELINE", Settings.from_env()).epoch.status == EpochStatus.COMMITTED
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], docs[15:])
    assert run_epoch(f"{MODULE}:PIPELINE", Settings.from_env()).epoch.status == EpochStatus.COMMITTED
    want = sorted(expected(decoded_rows()), key=lambda row: row["id"])
    for table_name in ("inferred", "typed"):
        table = read_committed_table(stack["ONCEFLOW_TEST_FILES"], table_name)
        got = sorted(table.select(COLUMNS).to_pylist(maps_as_pydicts="strict"), key=lambda row: row["id"])
        assert got == want, table_name
        assert pa.types.is_map(table.schema.field("counts").type), table_name
        order = table.schema.field("order").type
        at = order.field("at").type  # the session's time zone, or the declared UTC
        assert pa.types.is_timestamp(at) and at.unit == "us" and at.tz in ("UTC", "Etc/UTC"), table_name
        assert pa.types.is_decimal(order.field("amount").type), table_name
