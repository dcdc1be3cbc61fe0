"""A Delta table widened to the columns an epoch writes: new columns and nested fields added nullable in
one commit, rows written before read as null, a change of type refused in one line."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from onceflow.errors import ConfigError
from onceflow.sinks.delta import evolution
from onceflow.sinks.delta.config import declared_schema

BEFORE = (("id", "long"), ("s", "struct<a:string>"), ("l", "array<struct<x:int>>"), ("m", "map<string,int>"))
AFTER = (
    ("id", "long"),
    ("s", "struct<a:string,b:int>"),
    ("l", "array<struct<x:int,y:string>>"),
    ("m", "map<string,int>"),
    ("amount", "decimal(10,2)"),
)


def _schema(path: Path) -> pa.Schema:
    from deltalake import DeltaTable

    return pa.schema(DeltaTable(str(path)).schema().to_arrow())


def test_new_columns_and_nested_fields_arrive_nullable_in_one_commit(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    path = tmp_path / "t"
    before = declared_schema(BEFORE, "t")
    DeltaTable.create(str(path), before)
    rows = [{"id": 1, "s": {"a": "x"}, "l": [{"x": 1}], "m": [("k", 1)]}]
    write_deltalake(str(path), pa.Table.from_pylist(rows, schema=before), mode="append")
    table = DeltaTable(str(path))

    fields = evolution.widenings(_schema(path), declared_schema(AFTER, "t"), "t")
    assert [f.name for f in fields] == ["s", "l", "amount"]
    evolution.widen(table, fields, "t")

    table = DeltaTable(str(path))
    assert table.version() == 2  # one commit for every new column and field
    after = _schema(path)
    assert after.field("s").type.field("b").nullable
    assert after.field("l").type.value_type.field("y").nullable
    assert not after.field("s").type.field("a").nullable  # existing fields keep what they were
    assert table.to_pyarrow_table().to_pylist() == [
        {"id": 1, "s": {"a": "x", "b": None}, "l": [{"x": 1, "y": None}], "m": [("k", 1)], "amount": None}
    ]
    # Nothing left to add, whether the rows carry the new columns or not.
    assert evolution.widenings(after, declared_schema(AFTER, "t"), "t") == []
    assert evolution.widenings(after, declared_schema(BEFORE, "t"), "t") == []


def test_a_change_of_type_is_refused_in_one_line(tmp_path: Path) -> None:
    have = declared_schema(BEFORE, "t")
    for changed in (("id", "string"), ("s", "struct<a:int>"), ("m", "map<string,string>")):
        with pytest.raises(ConfigError) as raised:
            evolution.widenings(have, declared_schema((changed,), "t"), "delta sink lake table t")
        message = str(raised.value)
        assert "\n" not in message
        assert message.startswith("delta sink lake table t: the columns [")
        assert changed[0] in message
