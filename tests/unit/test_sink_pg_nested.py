"""The values the PostgreSQL sinks store for nested columns, without a server: the JSON of a value, and
a value made to fit an array or composite column (or refused with one line naming its place)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections import namedtuple
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.errors import ConfigError
from onceflow.schemas.types import render
from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import NestedValues, PgTableConfig, PgType, json_text, map_items, pg_value
from onceflow.sinks.errors import RowError

WHERE = "postgres_2pc sink s table t"
BIGINT = PgType("bigint", "N")
BOOL = PgType("boolean", "B")
TEXT = PgType("text", "S")
JSONB = PgType("jsonb", "U")
Item = namedtuple("Item", ["sku", "qty"])
ITEM = PgType("item", "C", fields=(("sku", TEXT), ("qty", BIGINT)), make=Item)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.text().filter(lambda s: "\x00" not in s),
    st.binary(max_size=8),
    st.dates(),
    st.datetimes(
        min_value=dt.datetime(2, 1, 1),
        max_value=dt.datetime(9998, 1, 1),
        timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-3, minutes=-30))]),
    ),
)
keys = st.text(max_size=5).filter(lambda s: "\x00" not in s)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=20,
)


def as_json(value: Any) -> Any:
    """What a value's JSON must parse back to, numbers read exactly."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, dt.datetime):
        u = value.astimezone(dt.UTC)
        fraction = f".{u.microsecond:06d}" if u.microsecond else ""
        day = f"{u.year:04d}-{u.month:02d}-{u.day:02d}"
        return f"{day}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}{fraction}+00:00"
    if isinstance(value, dt.date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float):
        return Decimal(repr(value))
    return value


@given(values)
def test_the_json_of_a_value_parses_back_to_it(value: Any) -> None:
    text = json_text(value, "c", WHERE)
    parsed = json.loads(text, parse_float=Decimal, parse_constant=lambda c: pytest.fail(c))
    assert parsed == as_json(value)
    assert "\n" not in text


def test_scalars_inside_json_have_the_documented_forms() -> None:
    paris_summer = dt.timezone(dt.timedelta(hours=2))
    value = {
        "at": dt.datetime(2024, 6, 1, 12, 0, 0, 5, tzinfo=paris_summer),
        "wall": dt.datetime(2024, 6, 1, 12, 0),
        "day": dt.date(2024, 2, 29),
        "price": Decimal("-12.50"),
        "big": Decimal("1E+40"),
        "raw": b"\x00\xff",
        "ok": True,
        "none": None,
        "list": [1, 2.5, "é\n"],
    }
    assert json_text(value, "c", WHERE) == (
        '{"at":"2024-06-01T10:00:00.000005+00:00","wall":"2024-06-01T12:00:00","day":"2024-02-29",'
        '"price":-12.50,"big":1E+40,"raw":"AP8=","ok":true,"none":null,"list":[1,2.5,"é\\n"]}'
    )


def test_arrow_map_pairs_are_objects_and_an_empty_list_is_an_array() -> None:
    pairs = pa.array([[("a", 1), ("b", None)], []], pa.map_(pa.string(), pa.int64())).to_pylist()
    assert map_items(pairs[0]) == {"a": 1, "b": None}
    assert map_items(pairs[1]) is None
    assert json_text(pairs[0], "c", WHERE) == '{"a":1,"b":null}'
    assert json_text(pairs[1], "c", WHERE) == "[]"
    assert map_items([("a", 1), "b"]) is None  # not every item is a pair: an array


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": [1.0, float("inf")]}, r"column c\.x\[1\]: inf has no JSON number"),
        ({"x y": Decimal("NaN")}, r'column c\["x y"\]: decimal NaN has no JSON number'),
        ([{"s": "a\x00"}], r"column c\[0\]\.s: text with a NUL character"),
        ({1: 2}, r"column c: map key 1 is not a string"),
        ([dt.time(1, 2)], r"column c\[0\]: time datetime.time\(1, 2\) has no JSON form"),
    ],
)
def test_values_json_cannot_hold_are_one_line_naming_their_place(value: Any, message: str) -> None:
    with pytest.raises(RowError, match=f"^{WHERE} {message}") as raised:
        json_text(value, "c", WHERE)
    assert "\n" not in str(raised.value)


def test_arrays_and_composites_take_the_shape_of_their_column() -> None:
    array_of_items = PgType("item[]", "A", element=ITEM)
    matrix = PgType("bigint[]", "A", element=BIGINT)
    json_array = PgType("jsonb[]", "A", element=JSONB)
    lines = [{"sku": "a", "qty": 1}, [("sku", "b"), ("qty", None)]]
    assert pg_value(lines, array_of_items, "c", WHERE) == [Item("a", 1), Item("b", None)]
    assert pg_value([[1, 2], [3, None]], matrix, "c", WHERE) == [[1, 2], [3, None]]
    assert pg_value([[1], {"a": [2]}, None, "x"], json_array, "c", WHERE) == ["[1]", '{"a":[2]}', None, "x"]
    assert pg_value({"a": {"b": []}}, TEXT, "c", WHERE) == '{"a":{"b":[]}}'
    nested = PgType("outer", "C", fields=(("item", ITEM), ("tags", PgType("text[]", "A", element=TEXT))))
    Outer = namedtuple("Outer", ["item", "tags"])
    nested = PgType(nested.name, nested.category, fields=nested.fields, make=Outer)
    assert pg_value({"item": {"sku": "s", "qty": 2}, "tags": ["t"]}, nested, "c", WHERE) == Outer(
        Item("s", 2), ["t"]
    )


@pytest.mark.parametrize(
    ("value", "target", "message"),
    [
        ({"a": 1}, BIGINT, r"column c: a struct or map does not fit a column of type bigint"),
        (
            [1],
            PgType("item", "C", fields=ITEM.fields, make=Item),
            r"column c: an array does not fit a column",
        ),
        (
            [True, 1],
            PgType("boolean[]", "A", element=BOOL),
            r"column c\[1\]: int 1 does not fit type boolean",
        ),
        (
            [1, True],
            PgType("bigint[]", "A", element=BIGINT),
            r"column c\[1\]: bool True does not fit type bigint",
        ),
        ({"sku": "x"}, ITEM, r"column c: the value has missing fields \['qty'\] and unknown fields \[\]"),
        ({"sku": 1, "qty": "2"}, ITEM, r"column c\.qty: str '2' does not fit type bigint"),
    ],
)
def test_values_that_do_not_fit_their_column_are_one_line(value: Any, target: PgType, message: str) -> None:
    with pytest.raises(RowError, match=f"^{WHERE} {message}") as raised:
        pg_value(value, target, "c", WHERE)
    assert "\n" not in str(raised.value)


def test_rows_without_nested_values_are_left_as_they_are() -> None:
    nested = NestedValues(
        ("id", "doc", "tags"), {"id": BIGINT, "tags": PgType("text[]", "A", element=TEXT)}, WHERE
    )
    flat = (1, "{}", None)
    assert nested.row(flat) is flat
    assert nested.row((1, {"k": [1]}, ["a", None])) == (1, '{"k":[1]}', ["a", None])  # doc: unknown, so JSON
    assert nested.column("doc", [None, [("k", 1)]]) == [None, '{"k":1}']
    assert nested.type_name("tags") == "text[]" and nested.type_name("doc") == ""


def test_columns_may_be_declared_by_their_row_type_text() -> None:
    config = PgTableConfig.read(
        ConfigReader(
            "plain",
            {
                "dsn": "postgresql://u@h/db",
                "table": "t",
                "columns": {
                    "id": "bigint",
                    "items": "array < struct<sku:string,doc:json?> >?",
                    "m": "map<string,int>",
                },
            },
        )
    )
    assert config.columns == (("id", "bigint"), ("items", "jsonb"), ("m", "jsonb"))
    assert [(n, render(t)) for n, t in config.row_types] == [
        ("items", "array<struct<sku:string,doc:json?>>?"),
        ("m", "map<string,int>"),
    ]
    items = dict(config.row_types)["items"]
    assert (
        json_text([{"sku": "a", "doc": '{"k": [1]}'}], "items", WHERE, items)
        == '[{"sku":"a","doc":{"k": [1]}}]'
    )
    assert (
        json_text([{"sku": '{"k": 1}', "doc": None}], "items", WHERE, items)
        == '[{"sku":"{\\"k\\": 1}","doc":null}]'
    )
    assert json_text([], "m", WHERE, dict(config.row_types)["m"]) == "{}"  # Arrow's empty map
    assert json_text([], "m", WHERE) == "[]"  # without the row type: an empty array
    with pytest.raises(RowError, match=r"column items\[0\]\.doc: a json field holds text that is not JSON"):
        json_text([{"sku": "a", "doc": "NaN"}], "items", WHERE, items)
    with pytest.raises(ConfigError, match=r"plain sink config columns\['x'\]=.*unknown type 'strin'"):
        PgTableConfig.read(
            ConfigReader(
                "plain", {"dsn": "postgresql://u@h/db", "table": "t", "columns": {"x": "struct<a:strin>"}}
            )
        )
