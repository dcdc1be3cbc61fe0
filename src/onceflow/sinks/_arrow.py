"""Arrow record batches as the sinks' writers take them: column checks and row-equivalent types.

A writer's ``write_batch`` must stage what ``write(batch.to_pylist())`` stages. Where the row path
builds Arrow data from Python values (``pa.array(values, type)``, or type inference without a type),
the batch path casts the column instead, but only for the casts that give the same result; any other
column goes through its Python values once, so the outcome is the row path's by construction.

pyarrow is imported inside functions only, like the sinks' other client libraries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.sinks.errors import RowError

if TYPE_CHECKING:
    import pyarrow as pa


def exact_columns(batch: pa.RecordBatch, names: tuple[str, ...], where: str) -> pa.RecordBatch:
    """The batch's columns in ``names`` order; a missing or unknown column is an error, as for rows."""
    found = unique_names(batch, where)
    missing = [n for n in names if n not in found]
    unknown = [n for n in found if n not in names]
    if missing or unknown:
        raise RowError(f"{where}: rows have missing columns {missing} and unknown columns {unknown}")
    return batch.select(list(names))


def unique_names(batch: pa.RecordBatch, where: str) -> list[str]:
    """The batch's column names; two columns of one name would be one key of a row, so are refused."""
    names = list(batch.schema.names)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RowError(f"{where}: rows have duplicate columns {twice}; rename them in the transform")
    return names


def as_declared(column: pa.Array, declared: pa.DataType, where: str) -> pa.Array:
    """``column`` as ``pa.array(column.to_pylist(), declared)`` would be, cast where that is the same."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.type == declared:
        return column
    source = column.type
    same_family = (
        (pa.types.is_integer(source) and pa.types.is_integer(declared))
        or (pa.types.is_floating(source) and pa.types.is_floating(declared))
        or (_is_text(source) and _is_text(declared))
        or (_is_bytes(source) and _is_bytes(declared))
    )
    try:
        if same_family:
            return pc.cast(column, declared, safe=True)
        return pa.array(column.to_pylist(), type=declared)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise RowError(f"{where}: rows do not fit: column of {source} as {declared}: {exc}") from exc


def as_inferred(column: pa.Array, where: str) -> pa.Array:
    """``column`` as ``pa.array(column.to_pylist())`` would infer it (Python ints are int64, floats
    double, datetimes microseconds...), cast where that is the same, else through its values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    target = _inferred_type(column.type)
    try:
        if target is not None:
            try:
                return column if column.type == target else pc.cast(column, target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # e.g. nanoseconds that microseconds cannot hold: the values decide, as for rows
        return pa.array(column.to_pylist())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise RowError(f"{where}: rows do not fit: column of {column.type}: {exc}") from exc


def _inferred_type(source: pa.DataType) -> pa.DataType | None:
    """What inference gives for the Python values of a ``source`` column, where a cast reaches it."""
    import pyarrow as pa

    t = pa.types
    if t.is_boolean(source) or t.is_null(source) or t.is_date32(source):
        return source
    if t.is_decimal128(source):  # as rows give it (`widened_decimals`), whatever the batch's values
        return pa.decimal128(38, source.scale)
    if t.is_integer(source):
        return pa.int64()
    if t.is_floating(source):
        return pa.float64()
    if _is_text(source):
        return pa.string()
    if _is_bytes(source) or t.is_fixed_size_binary(source):
        return pa.binary()
    if t.is_date64(source):
        return pa.date32()
    if t.is_timestamp(source):
        return pa.timestamp("us", source.tz)
    if t.is_time(source):
        return pa.time64("us")
    if t.is_duration(source):
        return pa.duration("us")
    return None


def _is_text(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _is_bytes(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t))


def widened_decimals(table: pa.Table) -> pa.Table:
    """``table`` with each decimal column inferred from Python values widened to the largest precision
    of its scale: the values of the first rows would otherwise fix a precision later rows exceed."""
    import pyarrow as pa

    fields = [
        pa.field(f.name, pa.decimal128(38, f.type.scale)) if pa.types.is_decimal128(f.type) else f
        for f in table.schema
    ]
    schema = pa.schema(fields)
    return table if schema == table.schema else table.cast(schema)
