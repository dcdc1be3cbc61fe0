"""Nested rows into an Iceberg table (catalog in PostgreSQL): structs, lists (empty ones too), maps,
nulls at several depths, a timestamp and a decimal inside a struct, written by a writer's row path and
by its batch path with the Arrow batch Spark makes of the same rows (Spark Connect), over two epochs.

The table comes from the pipeline's decoded columns at plan time; pyiceberg's scan must give back every
value, both paths must stage the same data, and the schema's nested field ids must be unique, the data
files' Parquet field ids the table's, and neither changed by a second epoch.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from onceflow.committables import Committable, TaskContext
from onceflow.decoding.records import spark_schema
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks import iceberg
from onceflow.sinks.errors import RowError
from tests.integration.test_iceberg_pipeline import spark_sql

pytestmark = pytest.mark.integration

REMOTE = os.environ.get("ONCEFLOW_SPARK_REMOTE", "sc://127.0.0.1:15002")
ORDER = (
    "struct<sku:string,qty:int?,at:timestamp,price:decimal(10,2)?,tags:array<string>,"
    "attrs:map<string,int?>?,ship:struct<city:string?,days:array<date?>?>?>"
)
FORMAT = JsonFormat(
    schema={
        "id": "int",
        "order": ORDER + "?",
        "lines": "array<struct<sku:string,qty:int?>>?",
        "counts": "map<string,array<int>?>?",
        "note": "string?",
    }
)
COLUMNS = ("id", "order", "lines", "counts", "note")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _rows(first_id: int) -> list[dict[str, Any]]:
    """Rows as the decoder yields them, with nulls at every depth the types allow and empty lists."""
    at = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
    return [
        {
            "id": first_id,
            "order": {
                "sku": "a-1",
                "qty": 3,
                "at": at,
                "price": Decimal("12345678.90"),
                "tags": ["new", "gift"],
                "attrs": {"x": 1, "y": None},
                "ship": {"city": "Porto", "days": [date(2026, 3, 2), None]},
            },
            "lines": [{"sku": "l1", "qty": 2}, {"sku": "l2", "qty": None}],
            "counts": {"a": [1, 2], "b": None, "c": []},
            "note": "full",
        },
        {
            "id": first_id + 1,
            "order": {
                "sku": "b-2",
                "qty": None,
                "at": at + timedelta(days=400),
                "price": None,
                "tags": [],
                "attrs": None,
                "ship": {"city": None, "days": []},
            },
            "lines": [],
            "counts": {},
            "note": None,
        },
        {
            "id": first_id + 2,
            "order": {
                "sku": "c-3",
                "qty": -7,
                "at": datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                "price": Decimal("-0.01"),
                "tags": ["ü"],
                "attrs": {},
                "ship": None,
            },
            "lines": None,
            "counts": None,
            "note": "",
        },
        {"id": first_id + 3, "order": None, "lines": None, "counts": None, "note": None},
    ]


@pytest.fixture(scope="module")
def spark() -> Any:
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(REMOTE).create()
    yield session
    session.stop()


def _spark_batches(spark: Any, rows: list[dict[str, Any]]) -> list[Any]:
    """The Arrow record batches Spark makes of the rows (as a Spark task's sink receives them)."""
    from pyspark.sql.types import StructType

    schema = StructType([spark_schema(FORMAT)[c] for c in COLUMNS])  # no metadata columns here
    frame = spark.createDataFrame([tuple(r[c] for c in COLUMNS) for r in rows], schema)
    batches = frame.toArrow().to_batches()
    assert batches and sum(b.num_rows for b in batches) == len(rows)
    return list(batches)


def _sink(pg_database: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "name": "lake",
        "table": f"nested.orders_{uuid.uuid4().hex[:8]}",
        "catalog": "onceflow",
        "catalog_properties": {
            "type": "sql",
            "uri": pg_database.replace("postgresql://", "postgresql+psycopg://"),
            "warehouse": f"file://{tmp_path}/warehouse",
        },
        "rows_per_file": 3,
    }


def _stage(sink: dict[str, Any], epoch: int, task: str, write: Any) -> Committable:
    writer = iceberg.IcebergWriter(sink)
    writer.begin(TaskContext("nested_ice", epoch, 0, task, "0", "lake"))
    write(writer)
    return writer.pre_commit()


def _table(sink: dict[str, Any]) -> Any:
    config = iceberg.IcebergConfig.from_mapping(sink)
    return iceberg.tables.load(config.open_catalog(), config.table)


def _ids(field_type: Any, path: str) -> dict[str, int]:
    """Every nested id of a pyiceberg type by its place: ``order.ship.days[]``, ``counts{key}``."""
    from pyiceberg import types as T

    found: dict[str, int] = {}
    if isinstance(field_type, T.StructType):
        for f in field_type.fields:
            found[f"{path}.{f.name}"] = f.field_id
            found.update(_ids(f.field_type, f"{path}.{f.name}"))
    elif isinstance(field_type, T.ListType):
        found[f"{path}[]"] = field_type.element_id
        found.update(_ids(field_type.element_type, f"{path}[]"))
    elif isinstance(field_type, T.MapType):
        found[f"{path}{{key}}"] = field_type.key_id
        found[f"{path}{{}}"] = field_type.value_id
        found.update(_ids(field_type.value_type, f"{path}{{}}"))
    return found


def _schema_ids(schema: Any) -> dict[str, int]:
    found: dict[str, int] = {}
    for f in schema.fields:
        found[f.name] = f.field_id
        found.update(_ids(f.field_type, f.name))
    return found


def _parquet_ids(schema: Any) -> dict[str, int]:
    """The same places' ids in a Parquet file's Arrow schema (``PARQUET:field_id`` metadata)."""
    import pyarrow as pa

    found: dict[str, int] = {}

    def visit(field: Any, path: str) -> None:
        found[path] = int(field.metadata[b"PARQUET:field_id"])
        t = field.type
        if pa.types.is_struct(t):
            for child in t:
                visit(child, f"{path}.{child.name}")
        elif pa.types.is_map(t):
            visit(t.key_field, f"{path}{{key}}")
            visit(t.item_field, f"{path}{{}}")
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            visit(t.value_field, f"{path}[]")

    for field in schema:
        visit(field, field.name)
    return found


def _plain(value: Any) -> Any:
    """A value with its instants in UTC (a scan gives them in the zone ``UTC``, rows in ``datetime.UTC``)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return value


def _scanned(sink: dict[str, Any]) -> dict[int, dict[str, Any]]:
    scan = _table(sink).scan(selected_fields=COLUMNS).to_arrow()
    rows = scan.to_pylist(maps_as_pydicts="strict")  # a map as the dict it was written from
    return {r["id"]: {k: _plain(v) for k, v in r.items()} for r in rows}


def test_nested_rows_and_spark_batches_read_back_with_stable_field_ids(
    pg_database: str, tmp_path: Path, spark: Any
) -> None:
    import pyarrow.parquet as pq
    from pyiceberg import types as T

    sink = _sink(pg_database, tmp_path)
    spec = Pipeline(
        "nested_ice",
        KafkaSource(("orders",)),
        FORMAT,
        (SinkSpec("lake", "iceberg", {k: v for k, v in sink.items() if k != "name"}),),
    )
    iceberg.plan_checks(spec, [sink], 1)
    schema = _table(sink).schema()
    order = schema.find_field("order")
    assert not order.required  # a column is nullable; inside it, the row type's nullability holds
    assert isinstance(order.field_type, T.StructType)
    fields = {f.name: f for f in order.field_type.fields}
    assert {name: f.required for name, f in fields.items()} == {
        "sku": True,
        "qty": False,
        "at": True,
        "price": False,
        "tags": True,
        "attrs": False,
        "ship": False,
    }
    assert fields["at"].field_type == T.TimestamptzType()
    assert fields["price"].field_type == T.DecimalType(10, 2)
    tags = fields["tags"].field_type
    assert isinstance(tags, T.ListType) and tags.element_required
    counts = schema.find_field("counts").field_type
    assert isinstance(counts, T.MapType) and not counts.value_required
    assert isinstance(counts.value_type, T.ListType) and counts.value_type.element_required
    ids = _schema_ids(schema)
    assert len(set(ids.values())) == len(ids) > 20
    assert sorted(ids.values()) == list(range(1, len(ids) + 1))
    assert [f.name for f in schema.fields][: len(COLUMNS)] == list(COLUMNS)

    # Epoch 1: one task writes rows, another the batches Spark makes of the same rows.
    rows, batch_rows = _rows(1), _rows(101)
    batches = _spark_batches(spark, batch_rows)
    by_rows = _stage(sink, 1, "s0-t0", lambda w: w.write(rows))
    by_batches = _stage(sink, 1, "s0-t1", lambda w: [w.write_batch(b) for b in batches])
    # The batch path stages exactly what the row path stages for the batch's own rows.
    as_rows = _stage(sink, 9, "s0-t9", lambda w: [w.write(b.to_pylist()) for b in batches])
    staged = [pq.read_table(f["path"].removeprefix("file://")) for f in by_batches.handle["files"]]
    again = [pq.read_table(f["path"].removeprefix("file://")) for f in as_rows.handle["files"]]
    assert [t.to_pylist() for t in staged] == [t.to_pylist() for t in again]
    assert [t.schema for t in staged] == [t.schema for t in again]
    iceberg.IcebergCommitter(sink).abort([as_rows])
    # At rest, a null list of structs is null and an empty one empty (not as pyiceberg projects it).
    at_rest = {
        r["id"]: r
        for f in by_rows.handle["files"]
        for r in pq.read_table(f["path"].removeprefix("file://")).to_pylist()
    }
    assert (at_rest[2]["lines"], at_rest[3]["lines"], at_rest[4]["lines"]) == ([], None, None)
    assert at_rest[2]["order"]["ship"] == {"city": None, "days": []} and at_rest[3]["order"]["ship"] is None

    iceberg.IcebergCommitter(sink).commit([by_rows, by_batches])
    scanned = _scanned(sink)
    expected = {r["id"]: {k: _plain(v) for k, v in r.items()} for r in rows + batch_rows}
    assert scanned == expected
    assert scanned[2]["order"]["tags"] == [] and scanned[102]["lines"] == []
    assert scanned[3]["order"]["at"] == datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert scanned[103]["order"]["price"] == Decimal("-0.01")

    # Every data file carries the table's ids at every depth (what other engines read by).
    for c in (by_rows, by_batches):
        for f in c.handle["files"]:
            file_ids = _parquet_ids(pq.read_schema(f["path"].removeprefix("file://")))
            assert file_ids == {k: v for k, v in ids.items() if k in file_ids}
            assert set(file_ids) == set(ids)

    # Epoch 2, rows again: the same ids, and a row with a null where a value is required is refused
    # on both paths, naming its place.
    later = _rows(201)
    iceberg.plan_checks(spec, [sink], 1)  # the plan's check of an existing nested table
    second = _stage(sink, 2, "s0-t0", lambda w: w.write(later))
    iceberg.IcebergCommitter(sink).commit([second])
    table = _table(sink)
    assert len(table.snapshots()) == 2
    assert _schema_ids(table.schema()) == ids
    assert table.schema() == schema
    assert len(_scanned(sink)) == 12

    # Spark SQL, through Iceberg's own reader, sees the same nulls, empty lists, decimals and instants.
    (spark_rows,) = spark_sql(
        sink["catalog_properties"],
        "SELECT count(*) AS n, count_if(lines IS NULL) AS null_lines, "
        "count_if(size(lines) = 0) AS empty_lines, "
        "count_if(`order`.ship IS NOT NULL AND `order`.ship.city IS NULL) AS no_city, "
        "sum(`order`.price) AS price, unix_micros(max(`order`.at)) AS last_at, "
        "sum(size(`order`.tags)) AS tags, "
        "count_if(counts['b'] IS NULL AND counts['a'] IS NOT NULL) AS null_value "
        f"FROM onceflow.{sink['table']}",
    )
    everything = rows + batch_rows + later
    orders = [r["order"] for r in everything if r["order"] is not None]
    assert spark_rows == [
        {
            "n": len(everything),
            "null_lines": sum(r["lines"] is None for r in everything),
            "empty_lines": sum(r["lines"] == [] for r in everything),
            "no_city": sum(o["ship"] is not None and o["ship"]["city"] is None for o in orders),
            "price": str(sum(o["price"] for o in orders if o["price"] is not None)),
            "last_at": (max(o["at"] for o in orders) - EPOCH) // timedelta(microseconds=1),
            "tags": sum(len(o["tags"]) for o in orders),
            "null_value": sum(
                r["counts"] is not None and r["counts"].get("a") is not None for r in everything
            ),
        }
    ]

    bad = _rows(301)[:1]
    bad[0]["order"]["ship"]["days"] = None  # allowed: days is nullable
    bad[0]["lines"][1]["sku"] = None  # not allowed: a line's sku is required
    writer = iceberg.IcebergWriter(sink)
    writer.begin(TaskContext("nested_ice", 3, 0, "s0-t0", "0", "lake"))
    with pytest.raises(RowError, match=r"lines\[\]\.sku is null"):
        writer.write(bad)
    import pyarrow as pa

    arrow = table.schema().as_arrow()
    loose = pa.schema([pa.field(f.name, f.type, nullable=True) for f in arrow])
    with pytest.raises(RowError, match=r"lines\[\]\.sku is null"):
        writer.write_batch(pa.RecordBatch.from_pylist(bad, schema=loose))
    writer.abort()
