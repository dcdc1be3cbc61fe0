"""A batch decoded by Arrow's JSON reader holds exactly the rows and dead letters that the record-by-
record decoder gives the same records, in the same places.

Each test decodes one batch twice: with `BatchDecoder` (Arrow's reader when it answers, the records
one by one when it does not) and with `RowDecoder` alone, record after record, as the Python read path
did before batches. Rows are compared with float bits, dead letters with their reasons and offsets.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.decoding.arrow_json import NativeJsonDecoder, native_fields
from onceflow.decoding.records import KafkaRecord, RowDecoder, spark_schema
from onceflow.decoding.typed_json import MAX_OPENINGS
from onceflow.executor.arrow_rows import arrow_schema, row_batches
from onceflow.executor.reading import BatchDecoder, RecordList
from onceflow.executor.rejected import with_dead_letters
from onceflow.pipeline import JsonFormat
from tests.unit.test_typed_json import _KEYS, _VALUES, EDGES, FMT, KEYED

ORDINARY = b'{"id":7,"amount":12.5,"name":"ok","n":3}'
DEAD_LETTER = "_onceflow_dead_letter"


def batch_schema(fmt: JsonFormat) -> Any:
    """The slice's batch schema for ``fmt``: its row columns, all nullable, then the dead-letter column."""
    from pyspark.sql import types as T

    rows = spark_schema(fmt)
    return arrow_schema(
        T.StructType(
            [T.StructField(f.name, f.dataType, True) for f in rows.fields]
            + [T.StructField(DEAD_LETTER, T.StringType(), True)]
        )
    )


def records(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None) -> list[KafkaRecord]:
    keys = keys if keys is not None else [b"k"] * len(values)
    return [
        KafkaRecord("orders", 1, 100 + i, 1_700_000_000_000 + i, key, value, ())
        for i, (key, value) in enumerate(zip(keys, values, strict=True))
    ]


def normal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with floats as their bits (-0.0 and 0.0 differ, NaN equals NaN) and dead letters parsed."""
    out = []
    for row in rows:
        seen = {k: ("float", struct.pack("<d", v)) if type(v) is float else v for k, v in row.items()}
        if seen[DEAD_LETTER] is not None:
            seen[DEAD_LETTER] = json.loads(seen[DEAD_LETTER])
        out.append(seen)
    return out


def decoded(fmt: JsonFormat, batch: list[KafkaRecord], limit: int = 1_000_000) -> tuple[list[Any], list[Any]]:
    """(the batch path's rows, the record-by-record path's rows) of ``batch``."""
    schema = batch_schema(fmt)
    got = [
        r
        for b in BatchDecoder(RowDecoder(fmt, limit), schema).decode(RecordList(batch))
        for r in b.to_pylist()
    ]
    one = RowDecoder(fmt, limit)
    items = (one.decode(record) for record in batch)
    want = [r for b in row_batches(with_dead_letters(items, len(schema) - 1), schema) for r in b.to_pylist()]
    return normal(got), normal(want)


def assert_same(fmt: JsonFormat, batch: list[KafkaRecord], limit: int = 1_000_000) -> None:
    got, want = decoded(fmt, batch, limit)
    assert got == want, [r.value for r in batch]


def native_answers(fmt: JsonFormat, batch: list[KafkaRecord], limit: int = 1_000_000) -> bool:
    fields = list(batch_schema(fmt))[: len(fmt.schema) + (fmt.key_field is not None)]
    return (
        NativeJsonDecoder(fmt, limit, fields).decode([r.value for r in batch], [r.key for r in batch])
        is not None
    )


@pytest.mark.parametrize("value", EDGES)
def test_an_edge_case_among_ordinary_records_decodes_as_record_by_record(value: bytes | None) -> None:
    assert_same(FMT, records([ORDINARY, value, ORDINARY]))
    assert_same(FMT, records([value]))


def test_every_edge_case_in_one_batch_decodes_as_record_by_record() -> None:
    assert_same(FMT, records([ORDINARY, *EDGES, ORDINARY]))


@pytest.mark.parametrize(
    "lines",
    [
        # A record holding two objects and a blank one: as many lines as records, as many rows.
        [b'{"id":1,"amount":1,"name":"a"}{"id":2,"amount":2,"name":"b"}', b""],
        [b'{"id":1,"amount":1,"name":"a"}{"id":2,"amount":2,"name":"b"}', b"   "],
        [b"\t", b'{"id":1,"amount":1,"name":"a"} {"id":2,"amount":2,"name":"b"}'],
        # Two records that make one object only when joined, and the reverse.
        [b'{"id":1,"amount":1,', b'"name":"a"}'],
        [b'{"id":1,"amount":1,"name":"a"}\n{"id":2,"amount":2,"name":"b"}', b'{"id":3}'],
        # A multi-byte character split across two records.
        [b'{"id":1,"amount":1,"name":"\xc3', b'\xa9"}'],
        # Arrow's parser reads Inf; JSON has no such token, in a field or outside the schema.
        [b'{"id":1,"amount":Inf,"name":"a"}'],
        [b'{"id":1,"amount":1,"name":"a","x":Inf}'],
        [b'{"id":1,"amount":1,"name":"a","x":[-Inf]}'],
        [b'{"id":1,"amount":1,"name":"a","x": NaN}'],
        [b'{"id":1,"amount":1,"name":"Inf NaN"}'],
    ],
)
def test_records_that_only_line_up_when_joined_decode_as_record_by_record(lines: list[bytes]) -> None:
    assert_same(FMT, records([ORDINARY, *lines, ORDINARY]))


def test_deep_nesting_outside_the_schema_decodes_as_record_by_record() -> None:
    for depth in (MAX_OPENINGS - 2, MAX_OPENINGS, MAX_OPENINGS + 1, 1100, 3000):
        deep = b'{"id":1,"amount":1,"name":"a","x":' + b"[" * depth + b"]" * depth + b"}"
        assert_same(FMT, records([ORDINARY, deep, ORDINARY]))


def test_an_oversized_record_is_a_dead_letter_in_both_paths() -> None:
    long = b'{"id":1,"amount":1,"name":"' + b"a" * 200 + b'"}'
    assert_same(FMT, records([ORDINARY, long, ORDINARY]), limit=len(long) + 1)  # the key's byte tips it
    assert_same(FMT, records([ORDINARY, long, ORDINARY]), limit=len(long) + 2)


def test_the_key_column_comes_from_the_key_in_both_paths() -> None:
    value = b'{"id":5}'
    assert native_answers(KEYED, records([value, value], [b"alice", b"bob"]))
    assert_same(KEYED, records([value, value], [b"alice", b"bob"]))
    assert_same(KEYED, records([value, value], [b"alice", None]))
    assert_same(KEYED, records([value, value], [b"alice", b"\xff"]))


def test_ordinary_batches_are_settled_by_arrows_reader() -> None:
    """The batch path is not one that always declines: ordinary records, escapes included, go through
    Arrow's reader."""
    batch = records(
        [ORDINARY, b'{"id":-1,"amount":-1.5e-3,"name":"line\\nbreak \\"q\\" \\u00e9 \\/","x":{"y":[1,2]}}']
        * 50
    )
    assert native_answers(FMT, batch)
    assert_same(FMT, batch)
    assert not native_answers(FMT, records([ORDINARY, b'{"id":1}']))  # a required field is missing


def test_only_flat_formats_of_the_four_primitives_are_decoded_by_arrow() -> None:
    assert native_fields(FMT) == tuple(FMT.schema)
    assert native_fields(JsonFormat(schema={"id": "int", "at": "timestamp"})) is None
    assert native_fields(JsonFormat(schema={"id": "int", "tags": ["string"]})) is None


def test_dead_letters_are_counted_across_batches_as_record_by_record() -> None:
    """Past a task's first dead letters, letters keep no payload: the count runs over the task's
    batches, native or not, as it ran over its records."""
    batch = records([b"not json", ORDINARY] * 60)
    schema = batch_schema(FMT)
    decoder = BatchDecoder(RowDecoder(FMT, 1_000_000), schema)
    parts = (RecordList(batch[:50]), RecordList(batch[50:]))
    got = [r for part in parts for b in decoder.decode(part) for r in b.to_pylist()]
    _, want = decoded(FMT, batch)
    assert normal(got) == want


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(_KEYS, _VALUES, max_size=8), st.booleans(), st.sampled_from(["", " ", "\t"])
        ),
        min_size=1,
        max_size=6,
    )
)
def test_arbitrary_batches_decode_as_record_by_record(docs: list[tuple[dict[str, Any], bool, str]]) -> None:
    values = [
        (around + json.dumps(doc, ensure_ascii=ascii_only) + around).encode("utf-8", "surrogatepass")
        for doc, ascii_only, around in docs
    ]
    assert_same(FMT, records(values))


_NUMBER_TEXTS = st.one_of(
    st.builds(
        lambda number, form: form % number,
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(["%r", "%.17g", "%.3e", "%.25f"]),
    ),
    st.integers(-(10**320), 10**320).map(str),
    st.sampled_from(["-0", "0", "-0.0", "0e5", "-0e-5", "1e308", "1e309", "-1e309", "2e-400"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_NUMBER_TEXTS, min_size=1, max_size=5))
def test_float_fields_parse_to_the_same_doubles(texts: list[str]) -> None:
    assert_same(FMT, records([b'{"id":1,"name":"a","amount":' + text.encode() + b"}" for text in texts]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=' \t\r{}[]":,0123456789.eE+-abcnultrfsNIyidamo\\', max_size=40), max_size=4))
def test_arbitrary_text_among_ordinary_records_decodes_as_record_by_record(texts: list[str]) -> None:
    assert_same(FMT, records([ORDINARY, *(text.encode() for text in texts), ORDINARY]))
