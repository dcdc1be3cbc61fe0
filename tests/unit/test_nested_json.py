"""Nested JSON records on the exact decoder: structs, arrays and maps become dicts and lists of the
declared fields only, time, decimals, bytes and json sub-documents their Python values, and every
record that cannot become a row is one dead letter naming the value at fault by its path."""

from __future__ import annotations

import datetime as dt
import json
import struct
import time
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import types as T
from pyspark.sql.types import _make_type_verifier

from onceflow.decoding.records import (
    DEAD_LETTER_CODES,
    DeadLetter,
    KafkaRecord,
    RowDecoder,
    decode_record,
    row_columns,
    spark_schema,
)
from onceflow.pipeline import JsonFormat, nullable

FMT = JsonFormat(
    {
        "id": "int",
        "items": [{"sku": "string", "qty": "int", "price": "decimal(10,2)?"}],
        "ctx": nullable({"ip": "string?", "tags": ["string"]}),
        "attrs": "map<string,int>",
        "seen": "array<int?>?",
    }
)
ITEM = "struct<sku:string,qty:int,price:decimal(10,2)?>"
CTX = "struct<ip:string?,tags:array<string>>"


def rec(value: bytes | None, offset: int = 3) -> KafkaRecord:
    return KafkaRecord("orders", 1, offset, 1_700_000_000_000, None, value, ())


def doc(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 1,
        "items": [{"sku": "a", "qty": 2, "price": "9.5", "extra": {"deep": [1]}}],
        "ctx": {"ip": "10.0.0.1", "tags": ["x", "y"], "other": True},
        "attrs": {"colour": 3},
        "undeclared": [{"a": 1}],
    }
    base.update(overrides)
    return base


def decode(value: bytes | dict[str, Any], fmt: JsonFormat = FMT) -> Any:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return decode_record(rec(raw), fmt, 10**8)


def reason(value: bytes | dict[str, Any], fmt: JsonFormat = FMT) -> str:
    decoded = decode(value, fmt)
    assert isinstance(decoded, DeadLetter), decoded
    assert decoded.code in DEAD_LETTER_CODES
    return decoded.reason


def test_a_nested_record_becomes_dicts_and_lists_of_the_declared_fields_in_schema_order() -> None:
    row = decode(doc(seen=[1, None, 3]))
    assert isinstance(row, dict)
    assert row["items"] == [{"sku": "a", "qty": 2, "price": Decimal("9.50")}]
    assert list(row["items"][0]) == ["sku", "qty", "price"]  # "extra" dropped
    assert row["ctx"] == {"ip": "10.0.0.1", "tags": ["x", "y"]}
    assert row["attrs"] == {"colour": 3} and row["seen"] == [1, None, 3]
    assert "undeclared" not in row
    # Fields in the struct come in the schema's order, whatever the document's.
    again = decode(doc(ctx={"tags": [], "ip": None}))
    assert isinstance(again, dict) and list(again["ctx"].items()) == [("ip", None), ("tags", [])]
    # A nullable struct may be absent or null; a nullable field inside it too.
    absent = decode({k: v for k, v in doc().items() if k != "ctx"})
    assert isinstance(absent, dict) and absent["ctx"] is None and absent["seen"] is None
    assert decode(doc(ctx={"tags": ["t"]}))["ctx"] == {"ip": None, "tags": ["t"]}


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            doc(items=[{"sku": "a", "qty": 1}] * 3 + [{"sku": "b", "qty": "2"}]),
            "wrong_type: field 'items[3].qty': expected int, found string",
        ),
        (doc(items=[{"sku": "a"}]), "missing_field: field 'items[0].qty' (int) is missing"),
        (doc(ctx={"ip": "x"}), "missing_field: field 'ctx.tags' (array<string>) is missing"),
        (
            doc(items=[{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}, None]),
            f"wrong_type: field 'items[2]': expected {ITEM}, found null",
        ),
        (
            doc(items=[{"sku": None, "qty": 1}]),
            "wrong_type: field 'items[0].sku': expected string, found null",
        ),
        (
            doc(attrs={"size": 1, "colour": "red"}),
            "wrong_type: field 'attrs[\"colour\"]': expected int, found string",
        ),
        (doc(attrs={"colour": None}), "wrong_type: field 'attrs[\"colour\"]': expected int, found null"),
        (doc(attrs={"a b": 1.5}), "wrong_type: field 'attrs[\"a b\"]': expected int, found float"),
        (doc(attrs=[1]), "wrong_type: field 'attrs': expected map<string,int>, found array"),
        (doc(items={"sku": "a"}), f"wrong_type: field 'items': expected array<{ITEM}>, found object"),
        (doc(ctx=["10.0.0.1"]), f"wrong_type: field 'ctx': expected {CTX}, found array"),
        (doc(ctx={"tags": ["a", 1]}), "wrong_type: field 'ctx.tags[1]': expected string, found int"),
        (doc(ctx={"tags": "a"}), "wrong_type: field 'ctx.tags': expected array<string>, found string"),
        (doc(seen=[1, None, "x"]), "wrong_type: field 'seen[2]': expected int, found string"),
        (doc(seen=[True]), "wrong_type: field 'seen[0]': expected int, found bool"),
        (
            doc(items=[{"sku": "a", "qty": 2**63}]),
            f"wrong_type: field 'items[0].qty': expected int, found {2**63} beyond 64 bits",
        ),
        (
            doc(items=[{"sku": "a", "qty": 1, "price": 1.234}]),
            "wrong_type: field 'items[0].price': expected decimal(10,2), "
            "found a number with 3 digits after the point",
        ),
        (doc(items=None), f"wrong_type: field 'items': expected array<{ITEM}>, found null"),
        ({"items": [], "attrs": {}}, "missing_field: field 'id' (int) is missing"),
        (
            {"id": 1, "attrs": {}},
            f"missing_field: field 'items' (array<{ITEM}>) is missing",
        ),
    ],
)
def test_a_nested_value_at_fault_is_named_by_its_path(document: dict[str, Any], expected: str) -> None:
    assert reason(document) == expected


def test_duplicate_keys_inside_a_nested_object_keep_the_last_as_at_the_top() -> None:
    top = decode(b'{"id":1,"id":2,"items":[],"attrs":{}}')
    assert isinstance(top, dict) and top["id"] == 2
    row = decode(b'{"id":1,"items":[{"sku":"a","qty":"x","qty":7}],"attrs":{"k":1,"j":0,"k":2}}')
    assert isinstance(row, dict)
    assert row["items"] == [{"sku": "a", "qty": 7, "price": None}]
    assert list(row["attrs"].items()) == [("k", 2), ("j", 0)]
    assert (
        reason(b'{"id":1,"items":[{"sku":"a","qty":7,"qty":"x"}],"attrs":{}}')
        == "wrong_type: field 'items[0].qty': expected int, found string"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b'{"id":1,"items":[],"attrs":{},"ctx":{"tags":["ok","\\ud800"]}}',
            "not_utf8: field 'ctx.tags[1]' holds an unpaired surrogate escape, which has no UTF-8 form",
        ),
        (
            b'{"id":1,"items":[{"sku":"x\\udfffy","qty":1}],"attrs":{}}',
            "not_utf8: field 'items[0].sku' holds an unpaired surrogate escape, which has no UTF-8 form",
        ),
        (
            b'{"id":1,"items":[],"attrs":{"\\ud800":1}}',
            "not_utf8: field 'attrs' has a key with an unpaired surrogate escape, which has no UTF-8 form",
        ),
    ],
)
def test_a_lone_surrogate_inside_nested_data_is_a_dead_letter(raw: bytes, expected: str) -> None:
    assert reason(raw) == expected
    letter = decode(raw)
    assert letter.reason.encode("utf-8")  # the reason itself is always UTF-8


def test_a_lone_surrogate_outside_the_declared_fields_is_dropped_with_them() -> None:
    row = decode(b'{"id":1,"items":[{"sku":"a","qty":1,"x":"\\ud800"}],"attrs":{},"y":{"\\ud800":1}}')
    assert isinstance(row, dict) and row["items"][0]["sku"] == "a"
    json_field = JsonFormat({"j": "json"})
    assert reason(b'{"j":{"a":"\\ud800"}}', json_field).startswith("not_utf8: field 'j' holds an unpaired")
    assert reason(b'{"j":{"\\udc00":1}}', json_field).startswith("not_utf8: field 'j' holds an unpaired")


def test_nesting_deeper_than_the_schema_is_dropped_and_pathological_depth_is_malformed_json() -> None:
    deep = b"[" * 500 + b"]" * 500
    row = decode(b'{"id":1,"items":[{"sku":"a","qty":1,"x":' + deep + b'}],"attrs":{},"z":' + deep + b"}")
    assert isinstance(row, dict) and row["items"] == [{"sku": "a", "qty": 1, "price": None}]
    hostile = b'{"id":1,"items":[{"sku":"a","qty":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    assert reason(hostile) == "malformed_json: nested too deeply to decode"
    assert reason(b'{"id":1,"items":[' + b"[" * 100_000) == "malformed_json: nested too deeply to decode"
    # A json field keeps any depth the parser reads, as its canonical text.
    kept = decode(b'{"j":' + b"[" * 300 + b"]" * 300 + b"}", JsonFormat({"j": "json"}))
    assert isinstance(kept, dict) and kept["j"] == "[" * 300 + "]" * 300


def test_a_long_array_decodes_in_reasonable_time_and_its_bad_element_is_named() -> None:
    fmt = JsonFormat({"xs": "array<int>", "ys": [{"a": "string"}]})
    xs = list(range(100_000))
    raw = json.dumps({"xs": xs, "ys": [{"a": "v"}] * 100_000}).encode()
    started = time.monotonic()
    row = decode(raw, fmt)
    assert time.monotonic() - started < 5
    assert isinstance(row, dict) and row["xs"] == xs and len(row["ys"]) == 100_000
    bad = json.dumps({"xs": [*xs[:-1], "last"], "ys": []}).encode()
    assert reason(bad, fmt) == "wrong_type: field 'xs[99999]': expected int, found string"


UTC = dt.UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-25T12:30:01Z", dt.datetime(2026, 11, 25, 12, 30, 1, tzinfo=UTC)),
        ("2026-11-25T12:30:01.25+01:00", dt.datetime(2026, 11, 25, 11, 30, 1, 250_000, tzinfo=UTC)),
        ("2026-11-25t12:30:01.123456-0530", dt.datetime(2026, 11, 25, 18, 0, 1, 123_456, tzinfo=UTC)),
        ("2026-11-25 12:30z", dt.datetime(2026, 11, 25, 12, 30, tzinfo=UTC)),
        ("2026-11-25T12:30:01.123456000Z", dt.datetime(2026, 11, 25, 12, 30, 1, 123_456, tzinfo=UTC)),
        ("2026-12-31T23:30:00-01:00", dt.datetime(2027, 1, 1, 0, 30, tzinfo=UTC)),
    ],
)
def test_a_timestamp_is_iso_text_with_an_offset_kept_as_its_utc_instant(
    text: str, expected: dt.datetime
) -> None:
    row = decode({"t": text}, JsonFormat({"t": "timestamp"}))
    assert isinstance(row, dict) and row["t"] == expected and row["t"].tzinfo is UTC


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ("2026-11-25T12:30:01", "text without a UTC offset (it needs Z or +HH:MM)"),
        ("2026-11-25T12:30:01.5", "text without a UTC offset (it needs Z or +HH:MM)"),
        ("2026-11-25T12:30:01.1234567Z", "digits past the microsecond"),
        ("2026-02-30T00:00:00Z", "a date, time or offset that does not exist"),
        ("2026-11-25T24:00:00Z", "a date, time or offset that does not exist"),
        ("2026-11-25T12:00:00+24:00", "a date, time or offset that does not exist"),
        ("0001-01-01T00:00:00+01:00", "an instant beyond years 1-9999 in UTC"),
        ("2026-11-25", "text that is not an ISO-8601 timestamp"),
        ("yesterday", "text that is not an ISO-8601 timestamp"),
        ("２０２６-11-25T12:30:01Z", "text that is not an ISO-8601 timestamp"),
        (1_700_000_000, "int"),
    ],
)
def test_a_timestamp_that_is_not_an_instant_is_refused(value: Any, found: str) -> None:
    fmt = JsonFormat({"t": "timestamp"})
    assert reason({"t": value}, fmt) == f"wrong_type: field 't': expected timestamp, found {found}"


def test_epoch_timestamps_are_integers_of_milli_or_microseconds() -> None:
    fmt = JsonFormat({"ms": "timestamp_ms", "us": "timestamp_us?"})
    row = decode({"ms": 1_700_000_000_123, "us": -1}, fmt)
    assert isinstance(row, dict)
    assert row["ms"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
    assert row["us"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    assert [c[:2] for c in row_columns(fmt)[:2]] == [("ms", "timestamp"), ("us", "timestamp")]
    assert reason({"ms": 1.7e12}, fmt) == "wrong_type: field 'ms': expected timestamp_ms, found float"
    assert (
        reason({"ms": "1700000000123"}, fmt) == "wrong_type: field 'ms': expected timestamp_ms, found string"
    )
    assert (
        reason({"ms": 10**17}, fmt)
        == "wrong_type: field 'ms': expected timestamp_ms, found an int beyond years 1-9999"
    )
    assert reason({"ms": 1, "us": 2**70}, fmt).startswith(
        "wrong_type: field 'us': expected timestamp_us, found an int"
    )


def test_a_date_is_iso_text() -> None:
    fmt = JsonFormat({"d": "array<date>"})
    row = decode({"d": ["2026-11-25", "0001-01-01"]}, fmt)
    assert isinstance(row, dict) and row["d"] == [dt.date(2026, 11, 25), dt.date(1, 1, 1)]
    assert reason({"d": ["2026-11-25T00:00:00Z"]}, fmt) == (
        "wrong_type: field 'd[0]': expected date, found text that is not an ISO date YYYY-MM-DD"
    )
    assert (
        reason({"d": ["2026-13-01"]}, fmt)
        == "wrong_type: field 'd[0]': expected date, found a date that does not exist"
    )
    assert reason({"d": [20261125]}, fmt) == "wrong_type: field 'd[0]': expected date, found int"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"12.5", Decimal("12.50")),
        (b'"12.5"', Decimal("12.50")),
        (b"12", Decimal("12.00")),
        (b"-0.10", Decimal("-0.10")),
        (b"12.3400000000000000000000000", Decimal("12.34")),
        (b"1.2e3", Decimal("1200.00")),
        (b'"1E-2"', Decimal("0.01")),
        (b"99999999.99", Decimal("99999999.99")),
        (b"-0.0", Decimal("0.00")),
        (b"0e999999", Decimal("0.00")),
        (b"0.1000000000000000055511151231257827", None),
    ],
)
def test_a_decimal_is_exact_and_never_rounded(raw: bytes, expected: Decimal | None) -> None:
    fmt = JsonFormat({"p": "decimal(10,2)"})
    decoded = decode(b'{"p":' + raw + b"}", fmt)
    if expected is None:
        assert isinstance(decoded, DeadLetter) and "digits after the point" in decoded.reason
        return
    assert isinstance(decoded, dict) and decoded["p"] == expected
    assert decoded["p"].as_tuple().exponent == -2 and str(decoded["p"]) == str(expected)


@pytest.mark.parametrize(
    ("raw", "found"),
    [
        (b"123456789", "a number with 9 digits before the point"),
        (b"1e8", "a number with 9 digits before the point"),
        (b"0.001", "a number with 3 digits after the point"),
        (b"1e-400", "a number with 400 digits after the point"),
        (b"1e999999999", "a number with 1000000000 digits before the point"),
        (b'"12,5"', "text that is not a number"),
        (b'"NaN"', "text that is not a number"),
        (b'" 1"', "text that is not a number"),
        (b'"0x10"', "text that is not a number"),
        (b"true", "bool"),
        (b"[1]", "array"),
    ],
)
def test_a_decimal_that_does_not_fit_is_refused_saying_why(raw: bytes, found: str) -> None:
    fmt = JsonFormat({"p": "decimal(10,2)"})
    assert (
        reason(b'{"p":' + raw + b"}", fmt) == f"wrong_type: field 'p': expected decimal(10,2), found {found}"
    )


@pytest.mark.parametrize(
    "number",
    [
        b"0.1",
        b"1e400",
        b"-1e400",
        b"-0.0",
        b"2.2250738585072011e-308",
        b"4.9e-324",
        b"1" * 400,
        b"123.456e-7",
    ],
)
def test_a_float_in_a_format_with_decimals_is_the_same_double(number: bytes) -> None:
    """Such a format reads fractions as Decimal; its float fields must still get float(text)'s bits."""
    raw = b'{"f":' + number + b',"a":[' + number + b'],"j":' + number + b"}"
    plain = decode(raw, JsonFormat({"f": "float", "a": "array<float>", "j": "json?"}))
    exact = decode(raw, JsonFormat({"f": "float", "a": "array<float>", "j": "json?", "d": "decimal(5,1)?"}))
    if isinstance(plain, DeadLetter):
        assert isinstance(exact, DeadLetter) and exact.reason == plain.reason
        return
    assert isinstance(exact, dict)
    bits = struct.pack("<d", float(number))
    assert struct.pack("<d", exact["f"]) == struct.pack("<d", plain["f"]) == bits
    assert [struct.pack("<d", x) for x in exact["a"]] == [bits]
    assert exact["j"] == plain["j"]


def test_bytes_are_base64_text() -> None:
    fmt = JsonFormat({"b": "bytes", "m": "map<string,bytes?>"})
    row = decode({"b": "AP8=", "m": {"x": "", "y": None}}, fmt)
    assert isinstance(row, dict) and row["b"] == b"\x00\xff" and row["m"] == {"x": b"", "y": None}
    assert reason({"b": "AP8"}, fmt) == "wrong_type: field 'b': expected bytes, found text that is not base64"
    assert reason({"b": "AP8=", "m": {"x": "é"}}, fmt) == (
        "wrong_type: field 'm[\"x\"]': expected bytes, found text that is not base64"
    )
    assert reason({"b": [0, 255]}, fmt) == "wrong_type: field 'b': expected bytes, found array"


def test_a_json_field_keeps_any_value_as_its_canonical_text() -> None:
    fmt = JsonFormat({"j": "json", "n": "json?", "list": "array<json?>"})
    raw = (
        b'{"j":{"b":[1, 2.50, "\xc3\xa9"], "a":{"y":null,"x":true}},"n":null,'
        b'"list":[1,"s",null,12345678901234567890123]}'
    )
    row = decode(raw, fmt)
    assert isinstance(row, dict)
    assert row["j"] == '{"a":{"x":true,"y":null},"b":[1,2.5,"é"]}'
    assert row["n"] is None
    assert row["list"] == ["1", '"s"', None, "12345678901234567890123"]
    assert row["j"] == json.dumps(
        json.loads(raw)["j"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert reason(b'{"j":null,"list":[]}', fmt) == "wrong_type: field 'j': expected json, found null"
    assert reason(b'{"list":[]}', fmt) == "missing_field: field 'j' (json) is missing"
    assert reason(b'{"j":1e400,"list":[]}', fmt) == (
        "wrong_type: field 'j': expected json, found a number beyond the double range"
    )
    scalar = decode(b'{"j":"text","list":[]}', fmt)
    assert isinstance(scalar, dict) and scalar["j"] == '"text"'


def test_row_columns_give_nested_canonical_texts() -> None:
    assert row_columns(FMT)[:5] == [
        ("id", "int", False),
        ("items", f"array<{ITEM}>", False),
        ("ctx", CTX, True),
        ("attrs", "map<string,int>", False),
        ("seen", "array<int?>", True),
    ]


def test_spark_schema_builds_nested_types_with_their_nullability() -> None:
    fmt = JsonFormat(
        {
            "items": [{"sku": "string", "qty": "int", "price": "decimal(10,2)?"}],
            "ctx": nullable({"ip": "string?", "at": "timestamp_ms", "day": "date"}),
            "attrs": "map<string,float?>",
            "raw": "array<bytes?>?",
            "doc": "json",
            "flag": "bool",
        }
    )
    schema = spark_schema(fmt)
    item = T.StructType(
        [
            T.StructField("sku", T.StringType(), False),
            T.StructField("qty", T.LongType(), False),
            T.StructField("price", T.DecimalType(10, 2), True),
        ]
    )
    ctx = T.StructType(
        [
            T.StructField("ip", T.StringType(), True),
            T.StructField("at", T.TimestampType(), False),
            T.StructField("day", T.DateType(), False),
        ]
    )
    assert schema.fields[:6] == [
        T.StructField("items", T.ArrayType(item, containsNull=False), False),
        T.StructField("ctx", ctx, True),
        T.StructField("attrs", T.MapType(T.StringType(), T.DoubleType(), valueContainsNull=True), False),
        T.StructField("raw", T.ArrayType(T.BinaryType(), containsNull=True), True),
        T.StructField("doc", T.StringType(), False),
        T.StructField("flag", T.BooleanType(), False),
    ]
    assert schema.fieldNames()[6:] == ["_topic", "_partition", "_offset", "_timestamp"]
    # The rows are what Spark's own check of createDataFrame accepts for that schema.
    verify = _make_type_verifier(schema, nullable=False)
    row = decode(
        {
            "items": [{"sku": "a", "qty": 1, "price": "2.5"}, {"sku": "b", "qty": 2}],
            "ctx": {"at": 1_700_000_000_000, "day": "2026-11-25"},
            "attrs": {"x": 1, "y": None},
            "raw": ["AP8=", None],
            "doc": {"k": [1]},
            "flag": False,
        },
        fmt,
    )
    assert isinstance(row, dict)
    verify(row)
    verify({**row, "ctx": None, "raw": None})
    with pytest.raises((TypeError, ValueError)):  # the check is not one that accepts anything
        verify({**row, "items": [None]})


def test_the_typed_decoder_leaves_types_it_cannot_prove_to_the_exact_path() -> None:
    assert RowDecoder(JsonFormat({"a": "int", "t": "timestamp?"}), 1000)._typed is None
    assert RowDecoder(JsonFormat({"a": [{"p": "decimal(5,1)"}]}), 1000)._typed is None
    assert RowDecoder(JsonFormat({"a": [{"p": "float", "m": "map<string,bool?>"}]}), 1000)._typed is not None


def test_a_json_field_near_the_parsers_depth_limit_is_a_row_or_a_reason_never_a_crash() -> None:
    """Where the parse succeeds but writing the canonical text runs out of stack (deeper in a struct,
    the writer starts with less of it), the record is a dead letter, not a failed task."""
    found: set[str] = set()
    for fmt, prefix, suffix in [
        (JsonFormat({"j": "json"}), b'{"j":', b"}"),
        (JsonFormat({"s": {"t": {"j": "json"}}}), b'{"s":{"t":{"j":', b"}}}"),
    ]:
        for depth in range(900, 1100, 3):
            decoded = decode(prefix + b"[" * depth + b"]" * depth + suffix, fmt)
            found.add("row" if isinstance(decoded, dict) else decoded.reason.split(": field")[0])
    assert found <= {"row", "malformed_json: nested too deeply to decode", "wrong_type"}
    assert "row" in found and "malformed_json: nested too deeply to decode" in found
