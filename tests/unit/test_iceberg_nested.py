"""Nested types in the Iceberg sink (SQLite catalog, local warehouse): the table's schema from declared
texts, decoded columns or the first rows; the checks both write paths share; plan-time comparison of a
nested column regardless of field ids."""

from __future__ import annotations

import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from onceflow.committables import Committable, TaskContext
from onceflow.errors import ConfigError
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks import iceberg
from onceflow.sinks.errors import RowError
from onceflow.sinks.iceberg import table as tables

PIPELINE = "nested_unit"
ORDER = "struct<sku:string,qty:int?,at:timestamp,price:decimal(10,2)?,tags:array<string?>>"


@pytest.fixture()
def config(tmp_path: Path) -> dict[str, Any]:
    return {
        "name": "lake",
        "table": "web.orders",
        "catalog": f"test_{tmp_path.name}",
        "catalog_properties": iceberg.default_catalog_properties(tmp_path),
        "columns": {"id": "long", "order": ORDER, "counts": "map<string,int?>"},
    }


def _spec(config: dict[str, Any], fmt: JsonFormat | None = None) -> Pipeline:
    return Pipeline(
        name=PIPELINE,
        source=KafkaSource(topics=("t",)),
        format=fmt or JsonFormat(schema={"id": "int"}),
        sinks=(SinkSpec("lake", "iceberg", {k: v for k, v in config.items() if k != "name"}),),
    )


def _table(config: dict[str, Any]) -> Any:
    parsed = iceberg.IcebergConfig.from_mapping(config)
    return tables.load(parsed.open_catalog(), parsed.table)


def _writer(config: dict[str, Any], task: str = "s0-t0", epoch: int = 1) -> iceberg.IcebergWriter:
    writer = iceberg.IcebergWriter(config)
    writer.begin(TaskContext(PIPELINE, epoch, 0, task, "0", "lake"))
    return writer


def _staged(committable: Committable) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return [
        row
        for f in committable.handle["files"]
        for row in pq.read_table(f["path"].removeprefix("file://")).to_pylist()
    ]


def _all_ids(schema: Any) -> list[int]:
    from pyiceberg.schema import index_by_id

    return sorted(index_by_id(schema))


def test_declared_texts_keep_todays_names_and_read_nested_ones_as_row_types() -> None:
    from pyiceberg import types as T

    assert tables.iceberg_type("int", "w") == T.IntegerType()  # an Iceberg name, as always
    assert tables.iceberg_type("timestamp", "w") == T.TimestampType()
    assert tables.iceberg_type("bytes", "w") == T.BinaryType()
    assert tables.iceberg_type("json", "w") == T.StringType()
    nested = tables.iceberg_type("struct<n:int,f:float?,at:timestamp,ms:timestamp_ms?,day:date>", "w")
    assert [(f.name, f.field_type, f.required) for f in nested.fields] == [
        ("n", T.LongType(), True),  # inside a text, the row model's: int is 64-bit
        ("f", T.DoubleType(), False),
        ("at", T.TimestamptzType(), True),
        ("ms", T.TimestamptzType(), False),
        ("day", T.DateType(), True),
    ]
    schema = tables.schema_of(
        [("a", "long"), ("b", "array<map<string,struct<x:decimal(5,1)?>>?>"), ("c", "map<string,int>")],
        "w",
    )
    assert _all_ids(schema) == list(range(1, 10))  # 3 columns, then b's 4 nested ids, then c's 2
    assert [f.field_id for f in schema.fields] == [1, 2, 3]
    b = schema.find_field("b").field_type
    assert not b.element_required and b.element_type.value_required
    assert not schema.find_field("b").required  # a column itself is always nullable
    with pytest.raises(ConfigError, match=r"unknown type 'long'") as refused:
        tables.iceberg_type("struct<a:long>", "w")
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="map keys must be 'string'"):
        tables.iceberg_type("map<int,string>", "w")
    with pytest.raises(ConfigError, match="unknown column type 'varchar'"):
        tables.iceberg_type("varchar", "w")


def test_decoded_nested_columns_make_the_table_at_plan_time(config: dict[str, Any]) -> None:
    from pyiceberg import types as T

    assert tables.row_type("array<struct<sku:string,qty:int>>") == "array<struct<sku:string,qty:int>>"
    assert tables.row_type("map<string,int>?") == "map<string,int>"
    assert (tables.row_type("json"), tables.row_type("int"), tables.row_type("float?")) == (
        "string",
        "long",
        "double",
    )
    undeclared = {k: v for k, v in config.items() if k != "columns"}
    fmt = JsonFormat(schema={"id": "int", "order": ORDER + "?", "raw": "json?", "blob": "bytes?"})
    iceberg.plan_checks(_spec(undeclared, fmt), [undeclared], 1)
    schema = _table(undeclared).schema()
    assert tables.holds(schema.find_field("order").field_type, tables.iceberg_type(ORDER, "w"))
    fields = {f.name: f for f in schema.find_field("order").field_type.fields}
    assert fields["at"].field_type == T.TimestamptzType() and fields["at"].required
    assert fields["price"].field_type == T.DecimalType(10, 2) and not fields["price"].required
    assert not fields["tags"].field_type.element_required
    assert (schema.find_field("raw").field_type, schema.find_field("blob").field_type) == (
        T.StringType(),
        T.BinaryType(),
    )
    assert len(_all_ids(schema)) == len(set(_all_ids(schema)))


def test_an_existing_nested_column_is_compared_without_its_ids(config: dict[str, Any]) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    before = _table(config).schema()
    # Declared again, in another column order: different ids for the same types, nothing changes.
    reordered = {**config, "columns": {"counts": "map<string,int?>", "id": "long", "order": ORDER}}
    iceberg.plan_checks(_spec(reordered), [reordered], 1)
    assert _table(config).schema() == before
    changed = ORDER.replace("qty:int?", "qty:string?")
    with pytest.raises(ConfigError, match=r"order\.qty is long in the table, string here") as refused:
        iceberg.plan_checks(
            _spec(config), [{**config, "columns": {**config["columns"], "order": changed}}], 1
        )
    assert "\n" not in str(refused.value)
    loosened = ORDER.replace("sku:string", "sku:string?")  # the table requires sku: rows may not omit it
    with pytest.raises(ConfigError, match="the table's schema does not match"):
        iceberg.plan_checks(
            _spec(config), [{**config, "columns": {**config["columns"], "order": loosened}}], 1
        )
    stricter = {**config, "columns": {**config["columns"], "counts": "map<string,int>"}}
    iceberg.plan_checks(_spec(stricter), [stricter], 1)  # never-null values fit a nullable one
    # A new nested column gets fresh ids after every existing one.
    wider = {**config, "columns": {**config["columns"], "extra": "array<struct<a:int,b:map<string,date>>>"}}
    iceberg.plan_checks(_spec(wider), [wider], 1)
    after = _table(config).schema()
    assert _all_ids(after)[: len(_all_ids(before))] == _all_ids(before)
    assert len(_all_ids(after)) == len(set(_all_ids(after))) == len(_all_ids(before)) + 6


def test_both_paths_refuse_unknown_keys_and_nulls_where_values_are_required(config: dict[str, Any]) -> None:
    import pyarrow as pa

    iceberg.plan_checks(_spec(config), [config], 1)
    arrow = _table(config).schema().as_arrow()
    at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    good = {"sku": "a", "qty": 1, "at": at, "price": None, "tags": ["x", None]}
    writer = _writer(config)
    with pytest.raises(RowError, match=r"order\.colour is not a field of the table's column 'order'"):
        writer.write([{"id": 1, "order": {**good, "colour": "red"}}])
    loose_order = pa.struct([*arrow.field("order").type, pa.field("colour", pa.string())])
    with pytest.raises(RowError, match=r"order\.colour is not a field"):
        writer.write_batch(pa.record_batch({"order": pa.array([{**good, "colour": "red"}], loose_order)}))
    with pytest.raises(RowError, match=r"order\.at is null, and the table requires a value there"):
        writer.write([{"id": 2, "order": {**good, "at": None}}])
    nullable_at = pa.struct([pa.field(f.name, f.type) for f in arrow.field("order").type])
    with pytest.raises(RowError, match=r"order\.at is null"):
        writer.write_batch(pa.record_batch({"order": pa.array([{**good, "at": None}], nullable_at)}))
    with pytest.raises(RowError, match=r"order\.tags is null"):
        writer.write([{"id": 3, "order": {**good, "tags": None}}])
    writer.write([{"id": 4, "order": good, "counts": {"a": None}}])  # nullable at every level here
    assert [r["counts"] for r in _staged(writer.pre_commit())] == [[("a", None)]]


def test_a_spark_shaped_batch_stages_what_its_rows_stage(config: dict[str, Any]) -> None:
    """Spark's Arrow: list items named ``element``, other string and timestamp types, a zone other than
    UTC, child values under a null struct; the batch path must give its rows' Parquet data."""
    import pyarrow as pa

    iceberg.plan_checks(_spec(config), [config], 1)
    spark_order = pa.struct(
        [
            pa.field("sku", pa.string(), nullable=False),
            pa.field("qty", pa.int32()),
            pa.field("at", pa.timestamp("us", tz="Europe/Lisbon"), nullable=False),
            pa.field("price", pa.decimal128(10, 2)),
            pa.field("tags", pa.list_(pa.field("element", pa.string())), nullable=False),
        ]
    )
    at = datetime.datetime(2026, 7, 1, 10, 0, tzinfo=datetime.UTC)
    orders = [
        {"sku": "a", "qty": 2, "at": at, "price": Decimal("1.10"), "tags": []},
        None,
        {"sku": "b", "qty": None, "at": at, "price": None, "tags": [None, "t"]},
    ]
    # As Spark converts a null struct: its children keep (here null) values under the null.
    children = [pa.array([o[f.name] if o else None for o in orders], f.type) for f in spark_order]
    order = pa.StructArray.from_arrays(
        children, fields=list(spark_order), mask=pa.array([False, True, False])
    )
    counts = pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64()))
    batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int32()), "order": order, "counts": counts})
    cast_only = pa.record_batch({"id": [4], "order": order.slice(0, 1), "counts": counts.slice(0, 1)})

    by_batch = _writer(config, "s0-t0")
    by_batch.write_batch(batch)
    by_batch.write_batch(cast_only)
    by_rows = _writer(config, "s0-t1")
    by_rows.write(batch.to_pylist())
    by_rows.write(cast_only.to_pylist())
    staged_batch, staged_rows = _staged(by_batch.pre_commit()), _staged(by_rows.pre_commit())
    assert staged_batch == staged_rows
    assert [r["order"] and r["order"]["at"] for r in staged_batch] == [at, None, at, at]
    assert staged_batch[1]["order"] is None and staged_batch[2]["order"]["tags"] == [None, "t"]


def test_without_columns_nested_first_rows_make_optional_nested_columns(config: dict[str, Any]) -> None:
    import pyarrow as pa
    from pyiceberg import types as T

    undeclared = {k: v for k, v in config.items() if k != "columns"}
    writer = _writer(undeclared)
    writer.write([{"id": 1, "o": {"a": [1, 2], "b": {"c": "x"}}, "l": [[1.5]]}])
    schema = _table(undeclared).schema()
    o = schema.find_field("o").field_type
    assert isinstance(o, T.StructType) and not any(f.required for f in o.fields)
    assert o.fields[0].field_type == T.ListType(o.fields[0].field_type.element_id, T.LongType(), False)
    assert schema.find_field("l").field_type.element_type.element_type == T.DoubleType()
    writer.pre_commit()

    from_batch = {**undeclared, "table": "web.from_batch"}
    writer = _writer(from_batch)
    writer.write_batch(
        pa.record_batch({"m": pa.array([[("k", [1])]], pa.map_(pa.string(), pa.list_(pa.int64())))})
    )
    m = _table(from_batch).schema().find_field("m").field_type
    assert isinstance(m, T.MapType) and not m.value_required and m.value_type.element_type == T.LongType()
    with pytest.raises(RowError, match=r"column 'e' element is null \(or empty\) in every row"):
        _writer({**undeclared, "table": "web.empty"}).write([{"e": []}])
    with pytest.raises(RowError, match=r"column 's' is an empty struct"):
        _writer({**undeclared, "table": "web.empty_struct"}).write([{"s": {}}])


def test_a_null_list_of_structs_stays_null_in_the_data_file(config: dict[str, Any]) -> None:
    columns = {"id": "long", "lines": "array<struct<sku:string,qty:int?>>"}
    declared = {**config, "columns": columns}
    iceberg.plan_checks(_spec(declared), [declared], 1)
    writer = _writer(declared)
    writer.write(
        [{"id": 1, "lines": None}, {"id": 2, "lines": []}, {"id": 3, "lines": [{"sku": "s", "qty": None}]}]
    )
    committable = writer.pre_commit()
    assert [r["lines"] for r in _staged(committable)] == [None, [], [{"sku": "s", "qty": None}]]
    iceberg.IcebergCommitter(declared).commit([committable])
    scanned = sorted(_table(declared).scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["lines"] for r in scanned] == [None, [], [{"sku": "s", "qty": None}]]
