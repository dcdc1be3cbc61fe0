"""The files sink with nested columns: declared type texts become Arrow types, Spark's batches keep
their struct, list and map types, rows and batches stage the same Parquet, and an inferred schema grows
where earlier rows had no type instead of failing the task."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from onceflow.errors import ConfigError
from onceflow.executor.arrow_rows import arrow_schema, row_batches
from onceflow.offsets import OffsetRange
from onceflow.schemas import parse_type
from onceflow.sinks._arrow import as_inferred, merged_type
from onceflow.sinks.base import TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.files import FilesCommitter, FilesConfig, FilesWriter, read_committed_table

UTC = dt.UTC
# Columns as a nested JSON format's rows have them (`row_columns`): name, type text, nullable.
COLUMNS = [
    ("id", "int", False),
    (
        "order",
        "struct<at:timestamp,amount:decimal(10,2),day:date,raw:bytes?,"
        "items:array<struct<sku:string,qty:int>>,attrs:map<string,int?>>?",
        True,
    ),
    ("tags", "array<string>", False),
    ("counts", "map<string,int>?", True),
]


def spark_batch(
    rows: list[tuple[Any, ...]], columns: list[tuple[str, str, bool]] = COLUMNS
) -> pa.RecordBatch:
    """The rows as Spark hands them to a writer: the Arrow schema Spark makes of the rows' Spark types
    (non-null fields, lists of ``element``, maps of ``entries``), built the executor's way."""
    from onceflow.decoding.records import spark_type

    spark = T.StructType(
        [T.StructField(n, spark_type(parse_type(t)), nullable) for n, t, nullable in columns]
    )
    return next(row_batches(rows, arrow_schema(spark), size=len(rows)))


def order_rows(count: int) -> list[tuple[Any, ...]]:
    rows = []
    for i in range(count):
        order = None
        if i % 4 != 1:
            order = {
                "at": dt.datetime(2026, 1, 2, 3, 4, 5, i, tzinfo=UTC),
                "amount": Decimal(f"{i}.{i % 10}5"),
                "day": dt.date(2026, 1, 1 + i % 28),
                "raw": None if i % 3 == 0 else bytes([i % 256, 0xFF]),
                "items": [{"sku": f"s{i}-{j}", "qty": j - i} for j in range(i % 3)],
                "attrs": {} if i % 5 == 0 else {"a": i, "b": None},
            }
        rows.append((i, order, ["x"] * (i % 3), None if i % 6 == 2 else {f"k{i % 4}": i}))
    return rows


def task(name: str = "s0-t0") -> TaskContext:
    return TaskContext("p", 1, 0, name, "a1", "out", (OffsetRange("in", 0, 0, 3),))


def stage(root: Path, feed: str, batches: list[pa.RecordBatch], **config: Any) -> tuple[bytes, pa.Table]:
    """The Parquet file one task stages from ``batches`` fed as ``feed``: "batches", "rows" (the row
    model's form: maps as dicts) or "pairs" (``to_pylist()``'s form: maps as (key, value) pairs)."""
    writer = FilesWriter({"root": str(root), "table": "t", "batch_size": 4, "name": "out", **config})
    writer.begin(task())
    for batch in batches:
        if feed == "batches":
            writer.write_batch(batch)
        elif feed == "rows":
            writer.write(batch.to_pylist(maps_as_pydicts="strict"))
        else:
            writer.write(batch.to_pylist())
    writer.pre_commit()
    data = next(root.glob("_staging/**/part-00000.parquet")).read_bytes()
    return data, pq.read_table(io.BytesIO(data))


def pieces(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """Uneven slices, so that row groups and calls do not line up."""
    return [batch.slice(0, 3), batch.slice(3, 6), batch.slice(9)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "array<struct<sku:string,qty:int>>",
            pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int64())])),
        ),
        ("map<string,int>?", pa.map_(pa.string(), pa.int64())),
        ("struct<at:timestamp,d:date,b:bytes,j:json>", None),
        ("decimal(10,2)", pa.decimal128(10, 2)),
        ("int?", pa.int64()),
        ("float?", pa.float64()),
        ("float", pa.float32()),  # an Arrow alias keeps Arrow's meaning
        ("int64", pa.int64()),
        ("large_string", pa.large_string()),
    ],
)
def test_columns_take_type_texts_and_arrow_aliases(text: str, expected: pa.DataType | None) -> None:
    if expected is None:
        fields = [
            ("at", pa.timestamp("us", "UTC")),
            ("d", pa.date32()),
            ("b", pa.binary()),
            ("j", pa.string()),
        ]
        expected = pa.struct(fields)
    schema = FilesConfig.from_mapping({"root": "/tmp/x", "table": "t", "columns": {"c": text}}).arrow_schema()
    assert schema is not None and schema.field("c").type == expected


def test_an_unknown_column_type_names_both_readings() -> None:
    with pytest.raises(ConfigError, match=r"unknown Arrow type 'array<nope>'.*unknown type 'nope'"):
        FilesConfig.from_mapping({"root": "/tmp/x", "table": "t", "columns": {"c": "array<nope>"}})


@pytest.mark.parametrize("feed", ["rows", "pairs"])
def test_declared_nested_columns_stage_the_batches_file_from_rows(tmp_path: Path, feed: str) -> None:
    batch = spark_batch(order_rows(14))
    columns = {name: text for name, text, _ in COLUMNS}
    from_batches, table = stage(tmp_path / "b", "batches", pieces(batch), columns=columns)
    from_rows, _ = stage(tmp_path / "r", feed, pieces(batch), columns=columns)
    assert from_rows == from_batches
    assert table.to_pylist(maps_as_pydicts="strict") == batch.to_pylist(maps_as_pydicts="strict")
    assert table.schema.field("counts").type == pa.map_(pa.string(), pa.int64())


def test_batches_keep_their_nested_types_without_columns(tmp_path: Path) -> None:
    batch = spark_batch(order_rows(14))
    _, table = stage(tmp_path, "batches", pieces(batch))
    order = table.schema.field("order").type
    assert pa.types.is_map(table.schema.field("counts").type)
    assert order.field("attrs").type == pa.map_(pa.string(), pa.int64())
    assert order.field("amount").type == pa.decimal128(38, 2)  # as rows infer every decimal
    assert order.field("at").type == pa.timestamp("us", "UTC")
    assert table.to_pylist(maps_as_pydicts="strict") == batch.to_pylist(maps_as_pydicts="strict")


def test_inferred_types_of_nested_arrow_types_are_what_their_values_infer() -> None:
    spark_like = pa.array(
        [{"n": 1, "xs": [1, 2], "big": ["a"]}, None],
        pa.struct(
            [
                pa.field("n", pa.int32(), nullable=False),
                pa.field("xs", pa.list_(pa.field("element", pa.int16(), nullable=False))),
                pa.field("big", pa.large_list(pa.large_string())),
            ]
        ),
    )
    inferred = as_inferred(spark_like, "t")
    assert inferred.type == pa.array(spark_like.to_pylist()).type
    assert inferred.to_pylist() == spark_like.to_pylist()


def test_rows_and_batches_stage_one_file_when_values_show_every_type(tmp_path: Path) -> None:
    """No maps, no list that is always empty, no field that is always null: rows infer what batches have."""
    columns = [("id", "int", False), ("o", "struct<at:timestamp,amount:decimal(12,3),xs:array<int>>?", True)]
    rows = [
        (
            i,
            None
            if i % 3 == 0
            else {
                "at": dt.datetime(2026, 5, 1, i, tzinfo=UTC),
                "amount": Decimal(i) / 8,
                "xs": list(range(i % 4)),
            },
        )
        for i in range(13)
    ]
    batch = spark_batch(rows, columns)
    from_rows, _ = stage(tmp_path / "r", "rows", pieces(batch))
    from_batches, table = stage(tmp_path / "b", "batches", pieces(batch))
    assert from_rows == from_batches
    assert table.to_pylist() == batch.to_pylist()


def test_an_inferred_schema_grows_where_earlier_rows_had_no_type(tmp_path: Path) -> None:
    """Two full row groups of empty lists and null structs are written before any value shows their
    types: the file is rewritten in the grown schema, and ends as the batches' file."""
    columns = [
        ("id", "int", False),
        ("items", "array<struct<sku:string,qty:int>>", False),
        ("o", "struct<x:int?,at:timestamp?>?", True),
    ]
    rows = [
        (
            i,
            [] if i < 9 else [{"sku": "a", "qty": i}],
            None if i < 10 else {"x": None if i < 11 else i, "at": dt.datetime(2026, 1, 1, tzinfo=UTC)},
        )
        for i in range(13)
    ]
    batch = spark_batch(rows, columns)
    from_rows, table = stage(tmp_path / "r", "rows", [batch.slice(i, 1) for i in range(13)])
    from_batches, _ = stage(tmp_path / "b", "batches", [batch])
    assert pq.ParquetFile(io.BytesIO(from_rows)).metadata.num_row_groups == 4  # 4 + 4 + 4 + 1 rows
    assert table.to_pylist() == batch.to_pylist()
    assert from_rows == from_batches


def test_a_struct_that_gains_fields_asks_for_columns(tmp_path: Path) -> None:
    writer = FilesWriter({"root": str(tmp_path), "table": "t", "batch_size": 2})
    writer.begin(task())
    writer.write([{"id": 1, "counts": {"a": 1}}, {"id": 2, "counts": {"b": 2}}])
    with pytest.raises(RowError, match=r"rows changed schema.*declare `columns`.*map<string,int>"):
        writer.write([{"id": 3, "counts": {"c": 3}}, {"id": 4, "counts": {}}])
    writer.abort()


def test_rows_with_dicts_fill_a_map_column_a_batch_established(tmp_path: Path) -> None:
    batch = spark_batch(order_rows(6))
    writer = FilesWriter({"root": str(tmp_path), "table": "t", "batch_size": 4})
    writer.begin(task())
    writer.write_batch(batch)
    writer.write([{"id": 99, "order": None, "tags": [], "counts": {"new": 1, "keys": 2}}])
    writer.pre_commit()
    table = pq.read_table(next(tmp_path.glob("_staging/**/part-00000.parquet")))
    assert table.to_pylist(maps_as_pydicts="strict")[-1]["counts"] == {"new": 1, "keys": 2}


def test_merged_type_only_fills_what_had_no_type() -> None:
    item = pa.struct([("sku", pa.string()), ("qty", pa.int64())])
    assert merged_type(pa.list_(pa.null()), pa.list_(item)) == pa.list_(item)
    assert merged_type(pa.list_(item), pa.list_(pa.null())) == pa.list_(item)
    assert merged_type(item, pa.struct([("qty", pa.int64())])) == item  # a missing field is null
    assert merged_type(pa.struct([("qty", pa.null())]), item) is None  # a new field: a map, undeclared
    assert merged_type(pa.float64(), pa.int64()) == pa.float64()
    assert merged_type(pa.int64(), pa.float64()) is None
    utc = pa.timestamp("us", "UTC")
    assert merged_type(utc, pa.timestamp("us", "Etc/UTC")) == utc  # Spark's session zone, the rows' UTC
    assert merged_type(utc, pa.timestamp("us")) is None  # naive times are not instants
    assert merged_type(pa.map_(pa.string(), pa.int64()), pa.struct([("a", pa.int64())])) is not None
    assert merged_type(pa.map_(pa.string(), pa.int64()), pa.struct([("a", pa.string())])) is None


def test_the_committed_table_reads_as_one_where_task_files_differ(tmp_path: Path) -> None:
    """One task saw only empty lists and null structs (list<null>, null), another their values."""
    config = {"root": str(tmp_path), "table": "t"}
    committables = []
    for name, rows in (
        ("s0-t0", [{"id": 1, "items": [], "o": None}]),
        ("s0-t1", [{"id": 2, "items": [{"sku": "a", "qty": 2}], "o": {"x": Decimal("1.5")}}]),
    ):
        writer = FilesWriter(config)
        writer.begin(task(name))
        writer.write(rows)
        committables.append(writer.pre_commit())
    FilesCommitter(config).commit(committables)
    table = read_committed_table(tmp_path, "t")
    assert table.to_pylist() == [
        {"id": 1, "items": [], "o": None},
        {"id": 2, "items": [{"sku": "a", "qty": 2}], "o": {"x": Decimal("1.5")}},
    ]


def test_times_of_one_table_read_as_one_whatever_zone_name_each_writer_gave_them(tmp_path: Path) -> None:
    """The local executor's rows say UTC, a Spark batch Etc/UTC: the same instants, one committed table."""
    config = {"root": str(tmp_path), "table": "t"}
    at = dt.datetime(2026, 11, 28, 6, 0, tzinfo=dt.UTC)
    spark_batch = pa.record_batch(
        [pa.array([2]), pa.array([at], pa.timestamp("us", "Etc/UTC"))], names=["id", "updated_at"]
    )
    committables = []
    for name, feed in (("s0-t0", [{"id": 1, "updated_at": at}]), ("s0-t1", spark_batch)):
        writer = FilesWriter(config)
        writer.begin(task(name))
        writer.write_batch(feed) if isinstance(feed, pa.RecordBatch) else writer.write(feed)
        committables.append(writer.pre_commit())
    FilesCommitter(config).commit(committables)
    table = read_committed_table(tmp_path, "t")
    assert table.schema.field("updated_at").type == pa.timestamp("us", "UTC")
    assert table.to_pylist() == [{"id": 1, "updated_at": at}, {"id": 2, "updated_at": at}]
