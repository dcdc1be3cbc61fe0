"""Decoding: every record becomes exactly one row or one dead letter with a stable reason code."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.decoding.records import (
    _JSON,
    DEAD_LETTER_CODES,
    DEAD_LETTER_PREFIX_BYTES,
    DEAD_LETTERS_WITH_PAYLOAD,
    DeadLetter,
    KafkaRecord,
    _json_document,
    decode_record,
    decode_records,
    spark_schema,
)
from onceflow.pipeline import JsonFormat, RawFormat

FMT = JsonFormat(schema={"id": "int", "name": "string", "score": "float", "ok": "bool", "note": "string?"})
KEYED = JsonFormat(schema={"id": "int"}, key_field="user")


def rec(value: bytes | None, key: bytes | None = None, offset: int = 7) -> KafkaRecord:
    return KafkaRecord("orders", 2, offset, 1_700_000_000_123, key, value, (("h", b"1"),))


def good(**overrides: object) -> bytes:
    doc: dict[str, object] = {"id": 1, "name": "ann", "score": 2.5, "ok": True, "extra": [1]}
    doc.update(overrides)
    return json.dumps(doc).encode()


def test_valid_json_becomes_a_row_with_metadata_columns() -> None:
    row = decode_record(rec(good(score=3)), FMT, 1000)
    assert row == {
        "id": 1,
        "name": "ann",
        "score": 3.0,
        "ok": True,
        "note": None,
        "_topic": "orders",
        "_partition": 2,
        "_offset": 7,
        "_timestamp": 1_700_000_000_123,
    }
    assert isinstance(row, dict) and isinstance(row["score"], float)


def test_key_field_receives_the_record_key() -> None:
    row = decode_record(rec(b'{"id": 5}', key="zoë".encode()), KEYED, 1000)
    assert isinstance(row, dict) and row["user"] == "zoë" and row["id"] == 5


def test_raw_format_passes_bytes_through() -> None:
    row = decode_record(rec(b"\xff\x00", key=None), RawFormat(), 1000)
    assert (
        isinstance(row, dict) and row["key"] is None and row["value"] == b"\xff\x00" and row["_offset"] == 7
    )


@pytest.mark.parametrize(
    ("record", "fmt", "reason"),
    [
        (rec(b"{not json"), FMT, "malformed_json: Expecting property name enclosed in double quotes"),
        (rec(b""), FMT, "malformed_json: Expecting value: line 1 column 1 (char 0)"),
        (rec(b'{"id": NaN}'), FMT, "malformed_json: NaN is not valid JSON"),
        (rec(b"[1, 2]"), FMT, "not_object: expected a JSON object, found array"),
        (rec(b'"text"'), FMT, "not_object: expected a JSON object, found string"),
        (rec(b"\xc3\x28"), FMT, "not_utf8: value: invalid continuation byte at byte 0"),
        (rec(good(name=None)), FMT, "wrong_type: field 'name': expected string, found null"),
        (rec(b'{"name": "x", "score": 1, "ok": false}'), FMT, "missing_field: field 'id' (int) is missing"),
        (rec(good(id="1")), FMT, "wrong_type: field 'id': expected int, found string"),
        (rec(good(id=1.5)), FMT, "wrong_type: field 'id': expected int, found float"),
        (rec(good(id=True)), FMT, "wrong_type: field 'id': expected int, found bool"),
        (rec(good(id=2**63)), FMT, f"wrong_type: field 'id': expected int, found {2**63} beyond 64 bits"),
        (rec(good(score="high")), FMT, "wrong_type: field 'score': expected float, found string"),
        (rec(good(ok=1)), FMT, "wrong_type: field 'ok': expected bool, found int"),
        (rec(good(note={"a": 1})), FMT, "wrong_type: field 'note': expected string, found object"),
        (rec(None), FMT, "null_value: record has no value (a tombstone?)"),
        (rec(b'{"id": 1}'), KEYED, "missing_key: the format needs a key for column 'user'"),
        (rec(b'{"id": 1}', key=b"\xff"), KEYED, "not_utf8: key: invalid start byte at byte 0"),
        (rec(b"x" * 20, key=b"k" * 11), RawFormat(), "oversized: 31 bytes of key and value, limit 30"),
        (rec(good(), key=b"k" * 100), FMT, "oversized: "),
    ],
)
def test_bad_records_become_dead_letters_with_a_reason(record: KafkaRecord, fmt: object, reason: str) -> None:
    result = decode_record(record, fmt, 30 if isinstance(fmt, RawFormat) else 100)  # type: ignore[arg-type]
    assert isinstance(result, DeadLetter)
    assert result.reason.startswith(reason)
    assert result.code in DEAD_LETTER_CODES
    assert (result.topic, result.partition, result.offset) == ("orders", 2, 7)
    assert (result.key, result.value) == (record.key, record.value)


def test_an_int_beyond_the_float_range_is_a_wrong_type_for_a_float_field() -> None:
    result = decode_record(rec(good(score=10**400)), FMT, 10_000)
    assert isinstance(result, DeadLetter)
    assert result.reason == "wrong_type: field 'score': expected float, found an int beyond its range"


def test_a_record_at_the_size_limit_is_accepted() -> None:
    assert isinstance(decode_record(rec(b"x" * 20, key=b"k" * 10), RawFormat(), 30), dict)


@given(
    st.lists(st.one_of(st.binary(max_size=40), st.builds(lambda i: good(id=i), st.integers())), max_size=30)
)
def test_every_record_yields_exactly_one_row_or_dead_letter(values: list[bytes]) -> None:
    records = [rec(v, offset=i) for i, v in enumerate(values)]
    batch = decode_records(records, FMT, 200)
    assert len(batch.rows) + len(batch.dead_letters) == len(records)
    offsets = sorted([r["_offset"] for r in batch.rows] + [d.offset for d in batch.dead_letters])
    assert offsets == list(range(len(records)))


def test_spark_schema_matches_the_decoded_columns() -> None:
    from pyspark.sql import types as T

    schema = spark_schema(FMT)
    row = decode_record(rec(good()), FMT, 1000)
    assert isinstance(row, dict) and schema.fieldNames() == list(row)
    assert schema["id"].dataType == T.LongType() and not schema["id"].nullable
    assert schema["note"].nullable and schema["score"].dataType == T.DoubleType()
    assert spark_schema(KEYED).fieldNames() == ["id", "user", "_topic", "_partition", "_offset", "_timestamp"]
    raw = spark_schema(RawFormat())
    assert raw["value"].dataType == T.BinaryType()


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\uDFFF", b"x\\udc00y"])
def test_an_unpaired_surrogate_in_a_string_is_a_dead_letter_not_a_poison_row(escape: bytes) -> None:
    """Valid JSON whose string has no UTF-8 form would fail every writer, on every replay."""
    decoded = decode_record(rec(good().replace(b'"ann"', b'"' + escape + b'"')), FMT, 10_000)
    assert isinstance(decoded, DeadLetter)
    assert decoded.reason.startswith("not_utf8: field 'name'")


def test_a_paired_surrogate_escape_is_the_character_it_encodes() -> None:
    decoded = decode_record(rec(good().replace(b'"ann"', b'"\\ud83d\\ude00"')), FMT, 10_000)
    assert not isinstance(decoded, DeadLetter) and decoded["name"] == "\U0001f600"


def test_a_document_nested_too_deeply_is_malformed_json() -> None:
    decoded = decode_record(rec(b"[" * 100_000 + b"]" * 100_000), FMT, 10**6)
    assert isinstance(decoded, DeadLetter) and decoded.reason == "malformed_json: nested too deeply to decode"


def test_a_flood_of_large_bad_records_keeps_a_bounded_prefix_and_every_offset() -> None:
    flood = 1500
    big = b"{" + b"x" * 50_000  # malformed and far larger than what a letter keeps
    records = [KafkaRecord("in", 0, offset, 0, b"key" * 1000, big, ()) for offset in range(flood)]
    batch = decode_records(records, JsonFormat({"n": "int"}), 1_048_576)
    letters = batch.dead_letters
    assert [d.offset for d in letters] == list(range(flood))  # every bad record accounted for
    assert all(d.code == "malformed_json" and d.value_size == len(big) for d in letters)
    assert all(d.key_size == 3000 and d.truncated for d in letters)
    with_bytes = [d for d in letters if d.value is not None]
    assert len(with_bytes) == DEAD_LETTERS_WITH_PAYLOAD
    assert all(d.value == big[:DEAD_LETTER_PREFIX_BYTES] for d in with_bytes)
    kept = sum(len(d.value or b"") + len(d.key or b"") for d in letters)
    assert kept <= 2 * DEAD_LETTER_PREFIX_BYTES * DEAD_LETTERS_WITH_PAYLOAD
    again = DeadLetter.from_json(letters[-1].to_json())  # the sizes travel to the driver
    assert (again.value, again.value_size, again.key_size) == (None, len(big), 3000)


JSON_EDGES = [
    '{"a": 1}',
    ' {"a": 1}',
    '{"a": 1}\n',
    "\t{}\r\n ",
    '{"a": 1} {"b": 2}',
    '{"a": 1}x',
    "",
    "   ",
    "{",
    '{"a": NaN}',
    '{"a": -Infinity}',
    "[1, 2]",
    '"text"',
    '{"a": 1,}',
    "\u00a0{}",
]


@pytest.mark.parametrize("text", JSON_EDGES)
def test_the_decoders_fast_path_answers_as_the_json_module_does(text: str) -> None:
    """`_json_document` skips the decoder's whitespace matches on a plain value: whatever the text, its
    document or its error message is the decoder's own, so dead letters keep their reasons."""
    try:
        expected: object = _JSON.decode(text)
    except ValueError as exc:
        expected = ("error", type(exc), str(exc))
    try:
        got: object = _json_document(text)
    except ValueError as exc:
        got = ("error", type(exc), str(exc))
    assert got == expected


@given(st.text(alphabet=' \t\n\r{}[]":,0123456789.eE+-abcnultrfsNIy\\', max_size=24))
def test_the_decoders_fast_path_agrees_on_arbitrary_text(text: str) -> None:
    try:
        expected: object = _JSON.decode(text)
    except ValueError as exc:
        expected = ("error", str(exc))
    except RecursionError:
        return
    try:
        got: object = _json_document(text)
    except ValueError as exc:
        got = ("error", str(exc))
    assert got == expected


@pytest.mark.parametrize("digits", [4000, 5000])
def test_a_long_reason_is_cut_to_about_200_characters_keeping_its_code(digits: int) -> None:
    value = b'{"id": ' + b"9" * digits + b', "name": "a", "score": 1, "ok": true}'
    letter = decode_record(rec(value), FMT, 100_000)
    assert isinstance(letter, DeadLetter)
    assert len(letter.reason) <= 200
    assert letter.code in ("wrong_type", "malformed_json")
    if digits == 4000:
        assert letter.reason.startswith("wrong_type: field 'id': expected int, found 999")
        assert letter.reason.endswith("9…")
    assert letter.value == value[:DEAD_LETTER_PREFIX_BYTES] and letter.value_size == len(value)
    short = decode_record(rec(good(id="x")), FMT, 1000)
    assert (
        isinstance(short, DeadLetter) and short.reason == "wrong_type: field 'id': expected int, found string"
    )
