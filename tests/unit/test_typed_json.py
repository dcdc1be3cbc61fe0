"""The typed decoder settles only records the exact decoder would turn into the very same row.

Each test compares a `RowDecoder` (the typed decoder first) with one whose typed decoder is off, on
the same record: the row or the dead letter must be equal, float bits and dead-letter reasons included.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder
from onceflow.decoding.typed_json import MAX_OPENINGS, typed_decoder
from onceflow.pipeline import JsonFormat, nullable
from onceflow.schemas.types import Array, Map, Primitive, SchemaType, Struct, parse_type

FMT = JsonFormat(
    schema={
        "id": "int",
        "amount": "float",
        "name": "string",
        "ok": "bool?",
        "n": "int?",
        "x y": "float?",
        "é": "string?",
    }
)
KEYED = JsonFormat(schema={"id": "int"}, key_field="user")


def exact_decoder(fmt: JsonFormat) -> RowDecoder:
    decoder = RowDecoder(fmt, 1_000_000)
    decoder._typed = None  # the exact path alone, the arbiter the typed decoder must agree with
    return decoder


def record(value: bytes | None, key: bytes | None = b"k") -> KafkaRecord:
    return KafkaRecord("orders", 1, 42, 1_700_000_000_000, key, value, ())


def bits(item: Any) -> Any:
    """A decoded item in a form where -0.0 and 0.0 differ and equal floats are equal."""
    if isinstance(item, DeadLetter):
        return ("dead", item.reason, item.offset)
    return tuple(("float", struct.pack("<d", v)) if type(v) is float else (type(v).__name__, v) for v in item)


def assert_same(value: bytes | None, fmt: JsonFormat = FMT, key: bytes | None = b"k") -> Any:
    typed, exact = RowDecoder(fmt, 1_000_000), exact_decoder(fmt)
    got = typed.decode(record(value, key))
    assert bits(got) == bits(exact.decode(record(value, key))), value
    return got


EDGES = [
    b'{"id":1,"amount":2,"name":"a"}',
    b'{"id":1,"id":2,"amount":2,"name":"a"}',
    b'{"id":"x","id":2,"amount":2,"name":"a"}',
    b'{"id":1,"amount":2.5,"name":"a\tb"}',
    b'{"id":9223372036854775807,"amount":1,"name":"a"}',
    b'{"id":-9223372036854775808,"amount":1,"name":"a"}',
    b'{"id":9223372036854775808,"amount":1,"name":"a"}',
    b'{"id":18446744073709551615,"amount":1,"name":"a"}',
    b'{"id":1,"amount":1e400,"name":"a"}',
    b'{"id":1,"amount":-1e400,"name":"a"}',
    b'{"id":1,"amount":' + b"1" * 400 + b',"name":"a"}',
    b'{"id":1,"amount":12345678901234567890123,"name":"a"}',
    b'{"id":1,"amount":179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497791,"name":"a"}',
    b'{"id":1,"amount":-0,"name":"a"}',
    b'{"id":1,"amount":-0.0,"name":"a"}',
    b'{"id":-0,"amount":1E2,"name":"a"}',
    b'{"id":1,"amount":2.2250738585072011e-308,"name":"a"}',
    b'{"id":1,"amount":4.9e-324,"name":"a"}',
    b'{"id":1,"amount":0.1000000000000000055511151231257827,"name":"a"}',
    b'{"id":1,"amount":1,"name":"\\ud800"}',
    b'{"id":1,"amount":1,"name":"a","x":"\\ud800"}',
    b'{"id":1,"amount":1,"name":"a","\\ud800":1}',
    b'{"id":1,"amount":1,"name":"\\uD83D\\uDE00"}',
    b'{"id":1,"amount":1,"name":"a","x":"\xff"}',
    b'{"id":1,"amount":1,"name":"\xff"}',
    b'{"id":1,"amount":1,"name":"\xed\xa0\x80"}',
    b'\xef\xbb\xbf{"id":1,"amount":1,"name":"a"}',
    b' {"id":1,"amount":1,"name":"a"} \n',
    b'\x0c{"id":1,"amount":1,"name":"a"}',
    b'{"id":true,"amount":1,"name":"a"}',
    b'{"id":1,"amount":true,"name":"a"}',
    b'{"id":1.0,"amount":1,"name":"a"}',
    b'{"id":1e2,"amount":1,"name":"a"}',
    b'{"id":1,"amount":1,"name":"a","ok":1}',
    b'{"id":1,"amount":1,"name":"a","ok":null,"n":null,"x y":null,"\\u00e9":"z"}',
    b'{"id":1,"amount":1,"name":"a","x y":3,"n":-5,"ok":false}',
    b'{"\\u0069d":1,"amount":1,"name":"a"}',
    b'{"id":null,"amount":1,"name":"a"}',
    b'{"amount":1,"name":"a"}',
    b'{"id":1,"amount":1,"name":"a","x":NaN}',
    b'{"id":1,"amount":NaN,"name":"a"}',
    b'{"id":1,"amount":Infinity,"name":"a"}',
    b'{"id":01,"amount":1,"name":"a"}',
    b'{"id":1,"amount":1,"name":"a","x":1e99999}',
    b'{"id":1,"amount":1,"name":"a","x":123456789012345678901234567890}',
    b'{"id":1,"amount":1,"name":"a\x00"}',
    b'{"id":1,"amount":1,"name":"a\x7f"}',
    b'{"id":1,"amount":1,"name":"\\u0000"}',
    b'{"id":1,"amount":1,"name":"a"}x',
    b'{"id":1,"amount":1,"name":"a"}{}',
    b'{"id":1,"amount":1,"name":"a",}',
    b'{"id":1,"amount":1,"name":"a","x":[1,]}',
    b'{"id":1,"amount":1,"name":"a","x":"\\x"}',
    b'{"id":1,"amount":1,"name":"a","x":{"y":1,"y":2}}',
    b'{"id":1,"amount":1,"name":"a","x":-}',
    b'{"id":1,"amount":1,"name":"a","x":.5}',
    b'[{"id":1,"amount":1,"name":"a"}]',
    b'"text"',
    b"",
    b"   ",
    None,
]


@pytest.mark.parametrize("value", EDGES)
def test_an_edge_case_decodes_as_the_exact_decoder_decodes_it(value: bytes | None) -> None:
    assert_same(value)


def test_deep_nesting_decodes_as_the_exact_decoder_decodes_it() -> None:
    """msgspec's stack reaches a few levels further than json's, and where both stop depends on how deep
    the caller's stack already is: every depth up to past both limits, here."""
    for depth in [*range(1, 1100, 7), *range(600, 1100)]:
        assert_same(b'{"id":1,"amount":1,"name":"a","x":' + b"[" * depth + b"]" * depth + b"}")


def test_ordinary_records_are_settled_by_the_typed_decoder() -> None:
    """The typed decoder is not a decoder that always declines: the common records go through it."""
    typed = typed_decoder([("id", "int", False), ("amount", "float", False), ("name", "string", True)])
    assert typed('{"id":1,"amount":2,"name":null,"extra":[1,{"a":2}]}') == (1, 2.0, None)
    assert typed('{"name":"b","amount":0.5,"id":-3}') == (-3, 0.5, "b")
    assert typed('{"id":1,"amount":"2"}') is None
    deep = '{"id":1,"amount":2,"x":' + "[" * (MAX_OPENINGS + 1) + "]" * (MAX_OPENINGS + 1) + "}"
    assert typed(deep) is None


def test_the_key_column_comes_from_the_key_in_both_paths() -> None:
    row = assert_same(b'{"id":7}', KEYED, key=b"ann")
    assert row[:2] == (7, "ann")
    assert isinstance(assert_same(b'{"id":7}', KEYED, key=None), DeadLetter)
    assert isinstance(assert_same(b'{"id":7}', KEYED, key=b"\xff"), DeadLetter)


def test_an_oversized_record_is_a_dead_letter_in_both_paths() -> None:
    typed = RowDecoder(FMT, 20).decode(record(b'{"id":1,"amount":1,"name":"a"}'))
    assert isinstance(typed, DeadLetter) and typed.reason.startswith("oversized")


# Values of every JSON kind, the awkward ones included: 64-bit bounds, ints beyond them, floats near
# the double range's ends, lone surrogates.
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "\udfff", "a\ud83d", "\ud83d\ude00"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)
_KEYS = st.sampled_from(["id", "amount", "name", "ok", "n", "x y", "é", "other", ""])


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(_KEYS, _VALUES, max_size=8),
    st.booleans(),
    st.sampled_from(["", " ", "\n", "\t"]),
)
def test_arbitrary_documents_decode_as_the_exact_decoder_decodes_them(
    doc: dict[str, Any], ascii_only: bool, around: str
) -> None:
    text = around + json.dumps(doc, ensure_ascii=ascii_only) + around
    value = text.encode("utf-8", "surrogatepass")
    assert_same(value)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["%r", "%.17g", "%.3e", "%.25f"]))
def test_a_float_field_parses_to_the_same_double(number: float, form: str) -> None:
    text = form % number
    if not math.isfinite(float(text)):
        return
    assert_same(b'{"id":1,"name":"a","amount":' + text.encode() + b"}")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=' \t\n\r{}[]":,0123456789.eE+-abcnultrfsNIyidamo\\', max_size=40))
def test_arbitrary_text_decodes_as_the_exact_decoder_decodes_it(text: str) -> None:
    assert_same(text.encode())


# Nested documents: the typed decoder reads structs, arrays and maps of the four primitives.
NESTED = JsonFormat(
    schema={
        "id": "int",
        "items": [{"sku": "string", "qty": "int", "p": "float?"}],
        "ctx": nullable({"ip": "string?", "flags": ["bool"]}),
        "attrs": "map<string,float?>",
        "grid": "array<array<int?>>?",
        "x y": "struct<`a b`:map<string,array<string>>?>?",
    }
)


def deep_bits(value: Any) -> Any:
    """A decoded value where floats compare by their bits and dicts by their items in order, at
    every depth."""
    if isinstance(value, DeadLetter):
        return ("dead", value.reason, value.offset)
    if type(value) is float:
        return ("float", struct.pack("<d", value))
    if isinstance(value, dict):
        return ("dict", [(k, deep_bits(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [deep_bits(v) for v in value])
    return (type(value).__name__, value)


def assert_same_nested(value: bytes, fmt: JsonFormat = NESTED) -> Any:
    typed, exact = RowDecoder(fmt, 10**7), exact_decoder(fmt)
    assert typed._typed is not None  # the comparison is with the typed decoder, not the exact one twice
    got = typed.decode(record(value))
    assert deep_bits(got) == deep_bits(exact.decode(record(value))), value
    return got


NESTED_EDGES = [
    b'{"id":1,"items":[{"sku":"a","qty":2,"p":1}],"ctx":{"flags":[true]},"attrs":{"k":2}}',
    b'{"id":1,"items":[{"sku":"a","qty":1,"qty":2}],"attrs":{"k":1,"j":2,"k":3}}',
    b'{"id":1,"items":[{"sku":"a","qty":"x","qty":2}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a","qty":2,"qty":"x"}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"\\ud800","qty":1}],"attrs":{}}',
    b'{"id":1,"items":[],"attrs":{"\\ud800":1}}',
    b'{"id":1,"items":[],"attrs":{"a":1},"x y":{"a b":{"\\udc00":["s"]}}}',
    b'{"id":1,"items":[{"sku":"a","qty":1,"zz":"\\ud800"}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a","qty":1,"p":1e400}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a","qty":1,"p":-0}],"attrs":{"n":-0.0,"m":12345678901234567890123}}',
    b'{"id":1,"items":[{"sku":"a","qty":9223372036854775808}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a","qty":-9223372036854775808}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a","qty":true}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a","qty":1.0}],"attrs":{}}',
    b'{"id":1,"items":[null],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a"}],"attrs":{}}',
    b'{"id":1,"items":[{"sku":"a","qty":1,"p":null}],"attrs":{"a":null},"grid":[[1,null],[],null]}',
    b'{"id":1,"items":[{"sku":"a","qty":1}],"attrs":{},"grid":[[1,null],[]]}',
    b'{"id":1,"items":[],"attrs":{},"ctx":null,"grid":null,"x y":{"a b":null}}',
    b'{"id":1,"items":[],"attrs":{},"ctx":{"ip":null}}',
    b'{"id":1,"items":[],"attrs":{},"ctx":{"flags":[true,null]}}',
    b'{"id":1,"items":[],"attrs":{},"x y":{"a b":{"k":["v",1]}}}',
    b'{"id":1,"items":[],"attrs":{},"ctx":{"flags":[]},"deep":' + b"[" * 200 + b"]" * 200 + b"}",
    b'{"id":1,"items":[{"sku":"a","qty":1,"x":' + b"{}" * 300 + b'}],"attrs":{}}',
    b'{"id":1,"items":{},"attrs":[]}',
    b'{"id":1,"items":[],"attrs":{},"ctx":{"flags":[true]} }',
    b'{"id":1,"items":[],"attrs":{"a":NaN}}',
]


@pytest.mark.parametrize("value", NESTED_EDGES)
def test_a_nested_edge_case_decodes_as_the_exact_decoder_decodes_it(value: bytes) -> None:
    assert_same_nested(value)


def test_nested_records_are_settled_by_the_typed_decoder() -> None:
    typed = typed_decoder([(n, *NESTED.field_type(n)) for n in NESTED.schema])
    found = typed(
        '{"id":7,"items":[{"qty":1,"sku":"a","p":2,"z":[1]}],"attrs":{"k":null},"ctx":{"flags":[]}}'
    )
    assert found == (
        7,
        [{"sku": "a", "qty": 1, "p": 2.0}],
        {"ip": None, "flags": []},
        {"k": None},
        None,
        None,
    )
    assert typed('{"id":7,"items":[{"qty":1}],"attrs":{}}') is None


_SURROGATE_TEXT = st.sampled_from(["\ud800", "a\udfff", "\ud83d\ude00"])


def _mostly(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # (Hypothesis draws the ends of a range most often: the rare branch sits in the middle.)
    return st.integers(0, 9).flatmap(lambda n: rare if n == 5 else common)


def _fitting(t: SchemaType, top: bool = False) -> st.SearchStrategy[Any]:
    """Values mostly of type ``t``, with nulls and values of any other kind mixed in at every depth
    (``top``: always an object, the document itself)."""
    if isinstance(t, Primitive):
        base: st.SearchStrategy[Any] = {
            "string": _mostly(st.text(max_size=4), _SURROGATE_TEXT),
            "int": _mostly(
                st.integers(-(2**63), 2**63 - 1),
                st.integers(-(2**64), 2**64) | st.sampled_from([2**63 - 1, -(2**63), 2**63]),
            ),
            "float": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70),
            "bool": st.booleans(),
        }[t.name]
    elif isinstance(t, Struct):
        fields = {name: _fitting(inner) for name, inner in t.fields}
        declared = _mostly(st.fixed_dictionaries(fields), st.fixed_dictionaries({}, optional=fields))
        extra = st.dictionaries(st.sampled_from(["zz", "é", ""]), _VALUES, max_size=1)
        base = st.tuples(declared, extra).map(lambda parts: {**parts[0], **parts[1]})
    elif isinstance(t, Array):
        base = st.lists(_fitting(t.element), max_size=4)
    else:
        assert isinstance(t, Map)
        base = st.dictionaries(st.text(max_size=3) | _SURROGATE_TEXT, _fitting(t.value), max_size=3)
    if top:
        return base
    # Mostly a fitting value, so that many documents are whole rows; sometimes null or anything else.
    return st.integers(0, 24).flatmap(lambda n: _VALUES if n == 7 else st.none() if n == 13 else base)


_NESTED_DOCS = _fitting(Struct(tuple((n, parse_type(text)) for n, text in NESTED.schema.items())), top=True)


@settings(max_examples=600, deadline=None)
@given(_NESTED_DOCS, st.booleans())
def test_arbitrary_nested_documents_decode_as_the_exact_decoder_decodes_them(
    doc: Any, ascii_only: bool
) -> None:
    assert_same_nested(json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(
    "base", ["timestamp", "decimal(5,2)", "bytes", "json", "date", "array<timestamp_ms>"]
)
def test_the_typed_decoder_refuses_to_be_built_for_types_it_does_not_handle(base: str) -> None:
    with pytest.raises(ValueError, match="does not handle"):
        typed_decoder([("a", "int", False), ("b", base, True)])
