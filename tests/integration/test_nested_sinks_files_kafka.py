"""Nested rows through the files and Kafka sinks on the real stack: the rows a nested JSON format decodes
(empty lists, null structs, maps, a timestamp, a decimal, a date and bytes inside a struct) are staged
once as rows and once as the Arrow batch Spark makes of them, committed, and read back with pyarrow and
with a Kafka consumer: the same values both ways, and for Kafka the very JSON the format reads again."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from onceflow.config import Settings
from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder, row_columns, spark_schema
from onceflow.executor.arrow_rows import arrow_schema, row_batches
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat
from onceflow.schemas import nullable
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.files import FilesCommitter, FilesWriter, read_committed_table
from onceflow.sinks.kafka import KafkaCommitter, KafkaWriter

pytestmark = pytest.mark.integration

FORMAT = JsonFormat(
    schema={
        "id": "int",
        "order": nullable(
            {
                "at": "timestamp",
                "amount": "decimal(10,2)",
                "day": "date",
                "raw": "bytes?",
                "items": [{"sku": "string", "qty": "int"}],
                "attrs": "map<string,int?>",
            }
        ),
        "tags": ["string"],
        "counts": "map<string,int>?",
    }
)
COLUMNS = [name for name in FORMAT.schema]
COUNT = 23


def documents() -> list[dict[str, Any]]:
    docs = []
    for i in range(COUNT):
        order = None
        if i % 4 != 1:
            order = {
                "at": f"2026-03-0{1 + i % 9}T1{i % 10}:00:00.{i:06d}+0{i % 3}:00",
                "amount": f"{i * 37}.{i % 10}5",
                "day": f"2026-02-{1 + i % 28:02d}",
                "raw": None if i % 3 == 0 else "AP8=",
                "items": [{"sku": f"s{i}-{j}", "qty": j * i - 5} for j in range(i % 3)],
                "attrs": {} if i % 5 == 0 else {"a": i, "none": None},
            }
        docs.append(
            {"id": i, "order": order, "tags": ["t"] * (i % 3), "counts": None if i % 6 == 2 else {"k": i}}
        )
    return docs


def decoded_rows() -> list[tuple[Any, ...]]:
    """The documents as the JSON format's row tuples (`row_columns` order, metadata columns included)."""
    decoder = RowDecoder(FORMAT, 1 << 20)
    rows = []
    for i, doc in enumerate(documents()):
        row = decoder.decode(KafkaRecord("in", 0, i, 1_700_000_000_000, None, json.dumps(doc).encode()))
        assert not isinstance(row, DeadLetter), row
        rows.append(row)
    return rows


def stage(
    writer: Any, ctx: TaskContext, feed: str, rows: list[tuple[Any, ...]], keep: list[str]
) -> Committable:
    """One task: ``rows`` as dicts of the ``keep`` columns (the row path), or as the Arrow batch Spark
    converts them to (the executor's `row_batches` over `spark_schema`'s Arrow form), those columns."""
    names = [name for name, _, _ in row_columns(FORMAT)]
    writer.begin(ctx)
    if feed == "rows":
        writer.write([{n: v for n, v in zip(names, row, strict=True) if n in keep} for row in rows])
    else:
        batch = next(row_batches(rows, arrow_schema(spark_schema(FORMAT))))
        writer.write_batch(batch.select(keep))
    return writer.pre_commit()  # type: ignore[no-any-return]


def expected(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    names = [name for name, _, _ in row_columns(FORMAT)]
    return [{n: v for n, v in zip(names, row, strict=True) if n in COLUMNS} for row in rows]


def test_files_sink_stores_nested_rows_and_batches_alike(tmp_path: Path) -> None:
    rows = decoded_rows()
    columns = {name: text for name, text, _ in row_columns(FORMAT) if name in COLUMNS}
    config = {"root": str(tmp_path), "table": "orders", "batch_size": 5, "columns": columns}
    staged = []
    for epoch, feed in ((1, "rows"), (2, "batches")):
        ctx = TaskContext("nested-files", epoch, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, COUNT),))
        committable = stage(FilesWriter(config), ctx, feed, rows, COLUMNS)
        FilesCommitter(config).commit([committable])
        staged.append(committable)
    assert staged[0].checksum == staged[1].checksum  # the same Parquet bytes from rows and from the batch
    table = read_committed_table(tmp_path, "orders")
    assert table.to_pylist(maps_as_pydicts="strict") == expected(rows) * 2
    order = table.schema.field("order").type
    assert order.field("items").type.value_type == pa.struct([("sku", pa.string()), ("qty", pa.int64())])
    assert pa.types.is_map(order.field("attrs").type) and order.field("attrs").type.item_type == pa.int64()
    assert order.field("amount").type == pa.decimal128(10, 2)

    # Without `columns`, Spark's batches keep their nested types: maps stay maps, timestamps keep UTC.
    bare = {"root": str(tmp_path), "table": "bare", "batch_size": 5}
    ctx = TaskContext("nested-files", 1, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, COUNT),))
    FilesCommitter(bare).commit([stage(FilesWriter(bare), ctx, "batches", rows, COLUMNS)])
    table = read_committed_table(tmp_path, "bare")
    assert pa.types.is_map(table.schema.field("counts").type)
    assert table.schema.field("order").type.field("at").type == pa.timestamp("us", "UTC")
    assert table.to_pylist(maps_as_pydicts="strict") == expected(rows)


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes]]:
    """Every committed record of a one-partition topic, in order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    records: list[tuple[bytes | None, bytes]] = []
    try:
        for _ in range(600):  # a guard against a hang, not a timing assertion
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return records
            records.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    raise AssertionError("did not reach the end of the topic")


def test_kafka_sink_publishes_nested_json_that_the_format_reads_back(
    settings: Settings, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    rows = decoded_rows()
    source, out = make_topic("nested-in"), make_topic("nested-out")
    config = {
        "topic": out,
        "partition": 0,
        "staging_root": str(tmp_path),
        "bootstrap": settings.kafka_bootstrap,
        "value_format": "json",
        "key_column": "id",
    }
    pipeline = f"nested-kafka-{uuid.uuid4().hex[:8]}"
    committables = []
    for task, feed in (("s0-t0", "rows"), ("s0-t1", "batches")):
        half = 0 if feed == "rows" else 1
        ctx = TaskContext(
            pipeline, 1, 0, task, "a1", "out", (OffsetRange(source, 0, half * 10, half * 10 + 10),)
        )
        committables.append(stage(KafkaWriter(config), ctx, feed, rows, COLUMNS))
    KafkaCommitter(config).commit(committables)

    records = read_topic(settings.kafka_bootstrap, out)
    assert len(records) == 2 * COUNT
    assert records[:COUNT] == records[COUNT:]  # rows and batch: byte for byte
    assert [key for key, _ in records[:COUNT]] == [str(i).encode() for i in range(COUNT)]
    # The published values are JSON of the row model's values: the format that made them reads them back.
    decoder = RowDecoder(FORMAT, 1 << 20)
    again = [
        decoder.decode_row(KafkaRecord(out, 0, i, None, k, v)) for i, (k, v) in enumerate(records[:COUNT])
    ]
    assert not [d for d in again if isinstance(d, DeadLetter)]
    assert [{n: d[n] for n in COLUMNS} for d in again] == expected(rows)  # type: ignore[index]
    first = json.loads(records[0][1], parse_float=Decimal)
    assert first["order"]["amount"] == Decimal("0.05") and first["order"]["at"].endswith("+00:00")
    assert first["order"]["items"] == [] and first["counts"] == {"k": 0}
    assert dt.datetime.fromisoformat(first["order"]["at"]) == expected(rows)[0]["order"]["at"]
