"""Arrow record batches as the Kafka sink's staged records, built column by column.

The staged format is the row path's (`onceflow.sinks.kafka.encode_record`): per record the key length
as a big-endian int32 (-1 for no key), the key, the value length, the value. Here the lengths are
computed for whole columns and the four pieces of every record are interleaved by one Arrow ``take``.

With ``value_format: json`` the value is the row path's `json_value` text of the row: the object is
assembled from one JSON text column per column, in key order. Text, integer and boolean columns are
encoded by Arrow kernels (text escaped as Python's encoder escapes it: backslash, quote and control
characters); any other column (floats, whose Python spelling Arrow does not share, dates, nested
values...) goes through `json_value` value by value, which is still no dict per row.

`json_value` is Python's encoder (``sort_keys=True, ensure_ascii=False``) with the row model's other
values made JSON as a consumer reads them back: structs and maps are objects (keys sorted at every
depth, so that a struct's field order and a map's insertion order cannot change the bytes), arrays are
arrays, a timestamp is ISO-8601 text with its offset (``2026-01-02T03:04:05.000006+00:00``; a naive one
has none), a date ISO text, a decimal a JSON number with exactly its digits (``12.50``, never a float's
rounding, never an exponent), bytes base64 text (standard alphabet, padded), anything else its ``str``.
"""

from __future__ import annotations

import base64
import json
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from onceflow.sinks._arrow import unique_names
from onceflow.sinks.errors import RowError

if TYPE_CHECKING:
    import pyarrow as pa

KIND = "kafka"
# Python's JSON escapes for control characters (ensure_ascii=False escapes nothing else but \ and ").
_CONTROL_ESCAPES = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}


class _Exact(Exception):
    """A decimal inside a value: Python's encoder has no way to write its digits as a number."""


def _default(value: Any) -> Any:
    if isinstance(value, datetime):  # before date: a datetime is a date
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal):
        raise _Exact
    return str(value)


_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=_default)


def json_value(value: Any) -> str:
    """``value`` as JSON text (see the module's docstring): Python's C encoder, and where a decimal
    is inside, the same text with the decimal's digits, written level by level."""
    try:
        return _ENCODER.encode(value)
    except _Exact:
        return _exact(value)


def _exact(value: Any) -> str:
    """`json_value` of a value holding a decimal: the encoder's own layout (``", "``, ``": "``)."""
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise RowError(f"{KIND} sink: decimal {value} has no JSON number")
        return format(value, "f")
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ", ".join(f"{_key(k)}: {json_value(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(json_value(v) for v in value) + "]"
    return _ENCODER.encode(value)


def _key(key: Any) -> str:
    """An object key as Python's encoder writes it (str, or the JSON text of a number, bool or null)."""
    if isinstance(key, str):
        return _ENCODER.encode(key)
    if key is None or isinstance(key, bool | int | float):
        return _ENCODER.encode(json.dumps(key))
    raise RowError(f"{KIND} sink: an object key must be text, not {type(key).__name__}")


def raw_records(batch: pa.RecordBatch) -> pa.Buffer:
    """Staged records of a batch whose columns are exactly ``value`` and an optional ``key``."""
    names = unique_names(batch, f"{KIND} sink")
    if "value" not in names or set(names) - {"key", "value"}:
        raise RowError(f"{KIND} sink: row columns must be 'value' and optional 'key', got {sorted(names)}")
    values = _bytes_or_text(batch.column("value"), "value")
    if values.null_count:
        raise RowError(f"{KIND} sink: value must be bytes or str, got NoneType")
    keys = _bytes_or_text(batch.column("key"), "key") if "key" in names else None
    return frame(keys, values)


def json_records(batch: pa.RecordBatch, key_column: str | None) -> pa.Buffer:
    """Staged records of any batch: each row as a JSON object, keyed by ``key_column``'s text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = unique_names(batch, f"{KIND} sink")
    if key_column is not None and key_column not in names:
        raise RowError(
            f"{KIND} sink: key_column {key_column!r} is not among the row's columns {sorted(names)}"
        )
    pieces: list[pa.Array | str] = []
    for i, name in enumerate(sorted(names)):
        pieces.append(("{" if i == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": ")
        pieces.append(json_text(batch.column(name)))
    if pieces:
        pieces.append("}")
        values = pc.binary_join_element_wise(*pieces, "")
    else:
        values = pa.array(["{}"] * batch.num_rows, pa.string())
    keys = None if key_column is None else key_text(batch.column(key_column))
    return frame(keys, values)


def json_text(column: pa.Array) -> pa.Array:
    """Each value of a column as Python's JSON encoder writes it (``null`` for a null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = pa.types
    kind = column.type
    if t.is_dictionary(kind):
        return json_text(column.dictionary_decode())
    if t.is_null(kind):
        return pa.array(["null"] * len(column), pa.string())
    if t.is_integer(kind):
        encoded = pc.cast(column, pa.string())
    elif t.is_boolean(kind):
        encoded = pc.if_else(column, "true", "false")
    elif t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind):
        encoded = pc.binary_join_element_wise('"', _escaped(pc.cast(column, pa.string())), '"', "")
    else:
        return pa.array([json_value(v) for v in python_values(column)], pa.string())
    return pc.fill_null(encoded, "null")


def python_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column's values as the row model holds them: a map is a dict (Arrow's own form is a list of
    pairs), a map with a key twice is refused rather than losing a value."""
    try:
        values: list[Any] = column.to_pylist(maps_as_pydicts="strict")
    except KeyError as exc:
        raise RowError(
            f"{KIND} sink: a map holds a key twice, which a JSON object cannot: {exc.args[0]}"
        ) from exc
    return values


def _escaped(text: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    text = pc.replace_substring(text, "\\", "\\\\")
    text = pc.replace_substring(text, '"', '\\"')
    if pc.any(pc.match_substring_regex(text, r"[\x00-\x1f]")).as_py():
        for code in range(0x20):
            escape = _CONTROL_ESCAPES.get(code, f"\\u{code:04x}")
            text = pc.replace_substring(text, chr(code), escape)
    return text


def key_text(column: pa.Array) -> pa.Array:
    """A key column as the row path's ``str(value)`` (null stays null: no key)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = pa.types
    if t.is_dictionary(column.type):
        column = column.dictionary_decode()
    if t.is_integer(column.type) or t.is_string(column.type) or t.is_large_string(column.type):
        return pc.cast(column, pa.string())
    return pa.array([None if v is None else str(v) for v in column.to_pylist()], pa.string())


def _bytes_or_text(column: pa.Array, what: str) -> pa.Array:
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(column.type):
        column = column.dictionary_decode()
    kind = column.type
    if t.is_null(kind) or t.is_binary(kind) or t.is_large_binary(kind) or t.is_binary_view(kind):
        return column
    if t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind):
        return column
    raise RowError(f"{KIND} sink: {what} must be bytes or str, got a column of {kind}")


def frame(keys: pa.Array | None, values: pa.Array) -> pa.Buffer:
    """The records ``(key length, key, value length, value)`` of two columns, in row order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    count = len(values)
    values = values.cast(pa.large_binary())
    value_lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
    if keys is None:
        key_lengths = np.full(count, -1, dtype=np.int64)
        keys = pa.array([b""] * count, pa.large_binary())
    else:
        keys = keys.cast(pa.large_binary())
        key_lengths = pc.fill_null(pc.binary_length(keys), -1).to_numpy(zero_copy_only=False)
        keys = pc.fill_null(keys, b"")
    parts = pa.concat_arrays([_int32_be(key_lengths), keys, _int32_be(value_lengths), values])
    order = np.arange(4 * count, dtype=np.int64).reshape(4, count).T.ravel()
    records = parts.take(pa.array(order))
    offsets = np.frombuffer(records.buffers()[1], dtype=np.int64, count=len(records) + 1)
    data = records.buffers()[2]
    return data.slice(0, int(offsets[-1])) if data is not None else pa.py_buffer(b"")


def _int32_be(numbers: object) -> pa.Array:
    """Each number as a 4-byte big-endian binary value."""
    import numpy as np
    import pyarrow as pa

    packed = np.asarray(numbers, dtype=">i4")
    count = len(packed)
    offsets = np.arange(count + 1, dtype=np.int64) * 4
    return pa.Array.from_buffers(
        pa.large_binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(packed.tobytes())]
    )


def python_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """A batch's rows as the row model holds them (maps as dicts, see `python_values`)."""
    try:
        rows: list[dict[str, Any]] = batch.to_pylist(maps_as_pydicts="strict")
    except KeyError as exc:
        raise RowError(f"{KIND} sink: a map holds a key twice: {exc.args[0]}") from exc
    return rows
