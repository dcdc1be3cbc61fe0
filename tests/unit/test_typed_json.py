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
from onceflow.pipeline import JsonFormat

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
