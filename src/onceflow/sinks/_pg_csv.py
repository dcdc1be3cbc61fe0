"""Arrow record batches as the CSV that ``COPY ... FROM STDIN (FORMAT csv)`` reads, column by column.

The two-phase sink's row path sends each value as psycopg's text for it; this module produces text
that PostgreSQL reads as the same value, without a Python object per value:

* every valid value is quoted and every null is an unquoted empty field, so an empty string stays an
  empty string and only a null is NULL (PostgreSQL's CSV rule); quotes are doubled, and commas,
  newlines and non-ASCII text travel inside the quotes as they are (the stream is UTF-8);
* text and integers are their own text whatever the column's type; booleans are ``t``/``f`` as psycopg
  writes them; dates, timestamps, times, floats, decimals and bytes use Arrow's formatting only for the
  column types where it reads back as the row path's value (floats are shortest round-trip text, so a
  ``double precision`` column gets the same bits, ``nan``/``inf`` included; a timestamp with a time zone
  goes to ``timestamptz`` as its UTC instant and to ``timestamp`` as its wall time, as psycopg's
  offset-carrying text does; bytes are ``\\x`` hex);
* structs, lists and maps become the Python values the row path gets from ``batch.to_pylist()`` and go
  through the same `NestedValues` (JSON text, PostgreSQL arrays, composites), then psycopg's text;
* any other pairing (a float into ``numeric`` or ``text``...) takes psycopg's own text of each value of
  that column, so it is the row path's by construction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

    from onceflow.sinks._pg import NestedValues

FLOAT_TARGETS = frozenset({"double precision", "real"})
TIMESTAMP_TARGETS = frozenset({"timestamp with time zone", "timestamp without time zone"})
_HEX = b"0123456789abcdef"


def csv_payload(batch: pa.RecordBatch, nested: NestedValues, conn: psycopg.Connection[Any]) -> pa.Buffer:
    """The batch (already in the table's column order) as CSV rows for COPY, without a header;
    ``nested`` has the table's column types (a column it lacks only loses the Arrow-formatted shortcut)
    and turns nested values into what the row path stores."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    columns = []
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if _is_nested(column.type):
            columns.append(_psycopg_text(nested.column(name, column.to_pylist()), conn))
        else:
            columns.append(_text_column(column, nested.type_name(name), conn))
    out = pa.BufferOutputStream()
    options = pcsv.WriteOptions(include_header=False, quoting_style="all_valid")
    pcsv.write_csv(pa.table(columns, names=[f"c{i}" for i in range(len(columns))]), out, options)
    return out.getvalue()


def _is_nested(kind: pa.DataType) -> bool:
    """Struct, list and map columns (dictionary-encoded ones too): their values go through Python."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(kind):
        return _is_nested(kind.value_type)
    return bool(
        t.is_struct(kind)
        or t.is_list(kind)
        or t.is_large_list(kind)
        or t.is_fixed_size_list(kind)
        or t.is_list_view(kind)
        or t.is_large_list_view(kind)
        or t.is_map(kind)
    )


def _text_column(column: pa.Array, target: str, conn: psycopg.Connection[Any]) -> pa.Array:
    """A column the CSV writer formats as the value the row path would store in a ``target`` column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = pa.types
    kind = column.type
    if t.is_dictionary(kind):
        return _text_column(column.dictionary_decode(), target, conn)
    if t.is_null(kind) or t.is_integer(kind) or t.is_string(kind) or t.is_large_string(kind):
        return column
    if t.is_string_view(kind):
        return pc.cast(column, pa.string())
    if t.is_boolean(kind):
        return pc.if_else(column, "t", "f")
    if t.is_floating(kind) and target in FLOAT_TARGETS:
        return pc.cast(column, pa.float64())  # as Python floats: a float32 keeps its double's digits
    if t.is_decimal(kind) and target == "numeric" and kind.scale >= 0:
        return column
    if t.is_date32(kind) and target == "date":
        return column
    if t.is_timestamp(kind) and target in TIMESTAMP_TARGETS:
        if kind.tz is not None and target == "timestamp with time zone":
            return pc.cast(column, pa.timestamp(kind.unit, "UTC"))
        return column
    if (t.is_binary(kind) or t.is_large_binary(kind)) and target == "bytea":
        return _bytea_hex(column)
    return _psycopg_text(column, conn)


def _bytea_hex(column: pa.Array) -> pa.Array:
    """Binary values as PostgreSQL's hex bytea input, ``\\x`` then two lowercase digits per byte."""
    import numpy as np
    import pyarrow as pa

    column = column.cast(pa.large_binary())
    count = len(column)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64, count=count + 1, offset=column.offset * 8)
    data = np.frombuffer(column.buffers()[2] or b"", dtype=np.uint8)[offsets[0] : offsets[-1]]
    digits = np.frombuffer(_HEX, dtype=np.uint8)
    hexed = np.empty(data.size * 2, dtype=np.uint8)
    hexed[0::2] = digits[data >> 4]
    hexed[1::2] = digits[data & 0x0F]
    starts = (offsets[:-1] - offsets[0]) * 2
    text = np.insert(hexed, np.repeat(starts, 2), np.tile(np.frombuffer(b"\\x", dtype=np.uint8), count))
    new_offsets = (offsets - offsets[0]) * 2 + np.arange(count + 1, dtype=np.int64) * 2
    validity = column.buffers()[0] if column.null_count else None
    if validity is not None and column.offset:
        validity = pa.array(column.is_valid()).buffers()[1]
    return pa.Array.from_buffers(
        pa.large_string(), count, [validity, pa.py_buffer(new_offsets), pa.py_buffer(text)]
    )


def _psycopg_text(column: pa.Array | list[Any], conn: psycopg.Connection[Any]) -> pa.Array:
    """psycopg's text of each value (of a column, or values already made from one): what
    ``Copy.write_row`` sends for it on the row path."""
    import pyarrow as pa
    from psycopg.adapt import PyFormat, Transformer

    values = column if isinstance(column, list) else column.to_pylist()
    dumped = Transformer(conn).dump_sequence(values, [PyFormat.TEXT] * len(values))
    return pa.array([None if d is None else bytes(d) for d in dumped], pa.binary()).cast(pa.string())
