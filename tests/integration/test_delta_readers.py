"""A Delta table written by a pipeline, read as of every committed epoch by delta-spark (on the warm Spark
Connect runtime) and by delta-rs, each at the version `history` finds for the epoch in the log.

The pipeline writes nested columns (struct, array, map), a timestamp, a decimal and a partition
column over several epochs, on the local executor and then on the warm Spark runtime. As of each
epoch both readers must see exactly the records the ledger says were read up to it, with the values
the records were produced with, and the same values as each other; each epoch that read something is
one table version. delta-spark also travels to an epoch by its commit's time.

`history` itself is checked on a table that another writer appends to between epochs and whose
epochs are not all writing.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable, write_deltalake

from onceflow.config import Settings
from onceflow.engine.runner import run_until
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.delta import DeltaCommitter, DeltaWriter
from onceflow.sinks.delta.history import (
    epoch_commits,
    epoch_versions,
    version_as_of_epoch,
    version_of_epoch,
)
from tests.integration.pipeline_helpers import committed_epochs

pytestmark = pytest.mark.integration

REMOTE = os.environ.get("ONCEFLOW_SPARK_REMOTE", "sc://127.0.0.1:15002")
PIPELINE: Pipeline | None = None  # set by the test; `run_until` loads it as this module's attribute
REGIONS = ("eu", "us", "ap")
FORMAT = JsonFormat(
    schema={
        "id": "int",
        "region": "string",
        "at": "timestamp?",
        "amount": "decimal(12,2)",
        # Fields nullable: a null struct with a non-nullable field fails the Spark path
        # (test_a_null_struct_with_a_required_field_stages_from_arrow).
        "order": "struct<sku:string?,qty:int?,tags:array<string>?,attrs:map<string,int?>?>?",
        "lines": "array<struct<sku:string,qty:int?>>",
        "counts": "map<string,int>?",
    }
)
BASE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _record(i: int) -> dict[str, Any]:
    """Record ``i``: nulls, empty lists and maps, negative amounts among them."""
    return {
        "id": i,
        "region": REGIONS[i % len(REGIONS)],
        "at": None if i % 11 == 10 else (BASE + timedelta(hours=i, microseconds=i)).isoformat(),
        "amount": f"{'-' if i % 7 == 3 else ''}{i * 13}.{i % 100:02d}",
        "order": None
        if i % 10 == 9
        else {
            "sku": f"s{i}",
            "qty": None if i % 4 == 0 else i % 4,
            "tags": [f"t{k}" for k in range(i % 3)],
            "attrs": None if i % 5 == 4 else {"a": i, "b": None},
        },
        "lines": [{"sku": f"l{i}-{k}", "qty": None if k == 1 else k} for k in range(i % 3)],
        "counts": None if i % 6 == 5 else {f"k{k}": i * k for k in range(i % 4)},
    }


def _produce(bootstrap: str, topic: str, ids: range) -> dict[tuple[int, int], int]:
    """Records ``ids`` over the topic's 2 partitions; (partition, offset) → id, as Kafka acknowledged."""
    placed: dict[tuple[int, int], int] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        placed[(message.partition(), message.offset())] = json.loads(message.value())["id"]

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in ids:
        producer.produce(topic, value=json.dumps(_record(i)), partition=i % 2, on_delivery=delivered)
    producer.flush()
    assert len(placed) == len(ids)
    return placed


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A session on the warm Spark Connect runtime, which has delta-spark on its classpath."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(REMOTE).create()
    yield session
    session.stop()


def _plain(value: Any, kind: pa.DataType) -> Any:
    """A value of an Arrow column of type ``kind`` as both readers can be compared: instants in UTC,
    maps as dicts."""
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {k: _plain(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _plain(value[f.name], f.type) for f in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_plain(v, kind.value_type) for v in value]
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return value


def _by_id(table: pa.Table, columns: list[str]) -> dict[int, dict[str, Any]]:
    types = {name: table.schema.field(name).type for name in columns}
    rows = table.select(columns).to_pylist()
    found = {row["id"]: {k: _plain(v, types[k]) for k, v in row.items()} for row in rows}
    assert len(found) == len(rows), "an id read twice"
    return found


def _spark_read(spark: Any, path: str, **options: str) -> pa.Table:
    reader = spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path).toArrow()


def _expected(record: dict[str, Any]) -> dict[str, Any]:
    """Record values as the table must give them back."""
    at = record["at"]
    order = record["order"]
    return {
        "region": record["region"],
        "at": None if at is None else datetime.fromisoformat(at),
        "amount": Decimal(record["amount"]),
        "order": None
        if order is None
        else {**order, "attrs": order["attrs"] if order["attrs"] is None else dict(order["attrs"])},
        "lines": record["lines"],
        "counts": record["counts"],
    }


@pytest.mark.slow  # about 80 s: two runs of the pipeline, two readers at each epoch
def test_both_readers_see_each_epoch_as_committed(
    settings: Settings, make_topic: Any, tmp_path: Path, spark: Any, run_settings: Settings
) -> None:
    global PIPELINE
    topic = make_topic("delta-readers", partitions=2)
    name = f"delta_readers_{uuid.uuid4().hex[:8]}"
    table_path = str(tmp_path / "lake" / "orders")
    PIPELINE = Pipeline(
        name=name,
        source=KafkaSource(topics=(topic,)),
        format=FORMAT,
        sinks=(SinkSpec("lake", "delta", {"path": table_path, "partition_by": {"region": "identity"}}),),
        max_records_per_partition=12,
        max_records_per_task=8,
    )
    path = f"{__name__}:PIPELINE"
    placed = _produce(settings.kafka_bootstrap, topic, range(60))
    run_until(path, run_settings, until_caught_up=True, executor="local")
    placed |= _produce(settings.kafka_bootstrap, topic, range(60, 100))
    run_until(path, run_settings, until_caught_up=True, executor="connect")

    epochs = committed_epochs(run_settings, name)
    wrote = [e.number for e in epochs if any(not r.is_empty for r in e.ranges)]
    assert len(wrote) >= 5, wrote  # 5 epochs at least: 60 then 40 records, 12 per partition each

    versions = epoch_versions(table_path, name, "lake")
    assert sorted(versions) == wrote  # each epoch that read something, and no other, made a commit
    assert sorted(versions.values()) == list(range(1, len(wrote) + 1))  # version 0 made the table
    assert DeltaTable(table_path).version() == len(wrote)

    columns = ["id", "region", "at", "amount", "order", "lines", "counts"]
    records = {i: _expected(_record(i)) for i in range(100)}
    until: dict[int, int] = {}
    for epoch in epochs:
        for r in epoch.ranges:
            until[r.partition] = r.until_offset
        ids = {i for (p, offset), i in placed.items() if offset < until.get(p, 0)}
        version = version_as_of_epoch(table_path, name, "lake", epoch.number)
        if epoch.number in versions:
            assert version == version_of_epoch(table_path, name, "lake", epoch.number)
        else:
            with pytest.raises(LookupError):
                version_of_epoch(table_path, name, "lake", epoch.number)
        if version is None:
            assert not ids, epoch.number
            continue
        by_rs = _by_id(DeltaTable(table_path, version=version).to_pyarrow_table(), columns)
        by_spark = _by_id(_spark_read(spark, table_path, versionAsOf=str(version)), columns)
        assert set(by_rs) == ids, (epoch.number, version)
        assert set(by_spark) == ids, (epoch.number, version)
        assert by_spark == by_rs, (epoch.number, version)
        for i in sorted(ids)[:: max(1, len(ids) // 7)]:
            assert {k: v for k, v in by_rs[i].items() if k != "id"} == records[i], i

    latest_rs = DeltaTable(table_path).to_pyarrow_table()
    latest_spark = _spark_read(spark, table_path)
    assert sorted(latest_rs.column("id").to_pylist()) == list(range(100))
    assert sorted(latest_spark.column("id").to_pylist()) == list(range(100))
    for latest in (latest_rs, latest_spark):  # the values compared above kept their types
        assert latest.schema.field("amount").type == pa.decimal128(12, 2)
        assert latest.schema.field("at").type.unit == "us" and latest.schema.field("at").type.tz
        assert pa.types.is_map(latest.schema.field("counts").type)

    # Time travel by time: to a moment after the middle epoch's commit and before the next one's. (Not the
    # commit's own millisecond: delta-spark times a commit by its log file's modification, which may
    # come a millisecond or two after the commitInfo's time delta-rs wrote in it.)
    commits = epoch_commits(table_path, name, "lake")
    middle, after = commits[len(commits) // 2 - 1], commits[len(commits) // 2]
    assert after.timestamp_ms - middle.timestamp_ms > 20
    at = datetime.fromtimestamp((middle.timestamp_ms + after.timestamp_ms) // 2 / 1000, UTC)
    by_time = _spark_read(spark, table_path, timestampAsOf=at.isoformat(timespec="milliseconds"))
    by_version = _by_id(DeltaTable(table_path, version=middle.version).to_pyarrow_table(), columns)
    assert _by_id(by_time, columns) == by_version
    assert 0 < len(by_version) < 100


def _commit_epoch(
    config: dict[str, Any], pipeline: str, epoch: int, rows: list[dict[str, Any]]
) -> Committable:
    """One epoch of one task through the sink's writer and committer."""
    writer = DeltaWriter(config)
    writer.begin(TaskContext(pipeline, epoch, 0, "s0-t0", "a0", config["name"]))
    writer.write(rows)
    committable = writer.pre_commit()
    DeltaCommitter(config).commit([committable])
    return committable


def test_history_skips_other_writers_and_epochs_that_wrote_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "lake" / "events")
    config = {"path": path, "columns": {"id": "long", "kind": "string"}, "name": "lake"}
    other = {"path": path, "columns": {"id": "long", "kind": "string"}, "name": "mirror"}
    foreign = pa.table({"id": pa.array([-1], pa.int64()), "kind": ["foreign"]})

    _commit_epoch(config, "p", 1, [{"id": 1, "kind": "p"}])  # version 1 (0 made the table)
    write_deltalake(path, foreign, mode="append")  # version 2: another writer
    _commit_epoch(config, "p", 2, [])  # read nothing: no commit
    _commit_epoch(other, "p", 2, [{"id": 2, "kind": "mirror"}])  # version 3: the pipeline's other sink
    _commit_epoch(config, "q", 3, [{"id": 3, "kind": "q"}])  # version 4: another pipeline
    third = _commit_epoch(config, "p", 3, [{"id": 4, "kind": "p"}])  # version 5
    DeltaCommitter(config).commit([third])  # repeated: the log's txn says it is there, nothing added

    assert DeltaTable(path).version() == 5
    assert epoch_versions(path, "p", "lake") == {1: 1, 3: 5}
    assert epoch_versions(path, "p", "mirror") == {2: 3}
    assert epoch_versions(DeltaTable(path), "q", "lake") == {3: 4}
    assert epoch_versions(path, "r", "lake") == {}
    assert version_of_epoch(path, "p", "lake", 3) == 5
    with pytest.raises(LookupError, match="epoch 2 of p:lake"):
        version_of_epoch(path, "p", "lake", 2)
    assert version_as_of_epoch(path, "p", "lake", 2) == 1
    assert version_as_of_epoch(path, "p", "lake", 9) == 5
    assert version_as_of_epoch(path, "p", "lake", 0) is None
    [one, three] = epoch_commits(path, "p", "lake")
    assert (one.epoch, one.version, three.epoch, three.version) == (1, 1, 3, 5)
    assert one.participants == three.participants == 1
    assert 0 < one.timestamp_ms <= three.timestamp_ms
    as_of_two = DeltaTable(path, version=version_as_of_epoch(path, "p", "lake", 2))
    assert sorted(as_of_two.to_pyarrow_table().column("id").to_pylist()) == [1]


def test_a_null_struct_with_a_required_field_stages_from_arrow(tmp_path: Path) -> None:
    """A batch as Spark's Arrow writer makes it (seen in a pipeline's Spark tasks): under a null struct,
    its fields are null too, the non-nullable ones included; the struct's type is the table's."""
    tags = pa.list_(pa.field("element", pa.string(), False))
    fields = [pa.field("sku", pa.string(), False), pa.field("tags", tags, False)]
    null_second = pa.array([False, True])
    order = pa.StructArray.from_arrays(
        [
            pa.array(["a", None]),
            pa.ListArray.from_arrays(
                pa.array([0, 1, 1], pa.int32()), pa.array(["x"]), tags, mask=null_second
            ),
        ],
        fields=fields,
        mask=null_second,
    )
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2], pa.int64()), order], names=["id", "order"])
    path = str(tmp_path / "t")
    config = {
        "path": path,
        "columns": {"id": "long", "order": "struct<sku:string,tags:array<string>>"},
        "name": "lake",
    }
    writer = DeltaWriter(config)
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a0", "lake"))
    writer.write_batch(batch)
    DeltaCommitter(config).commit([writer.pre_commit()])
    read = DeltaTable(path).to_pyarrow_table().sort_by("id").column("order").to_pylist()
    assert read == [{"sku": "a", "tags": ["x"]}, None]
