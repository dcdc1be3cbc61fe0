"""Arrow record batches as the sinks' writers take them: column checks and row-equivalent types.

A writer's ``write_batch`` must stage what ``write(batch.to_pylist())`` stages. Where the row path
builds Arrow data from Python values (``pa.array(values, type)``, or type inference without a type),
the batch path casts the column instead, but only for the casts that give the same result; any other
column goes through its Python values once, so the outcome is the row path's by construction.

Nested columns (struct, list, map) keep their shape: a batch's type is mapped, level by level, to what
inference gives for its values. Only where values cannot show a type do the paths differ, and then the
batch's type is the better one: an empty list or an all-null field infers ``null``, which rows widen
(`merged_type`) once later values show the type, and a map's Python form is a dict (the row model's,
``to_pylist(maps_as_pydicts="strict")``), which infers a struct unless the column's type is known.

pyarrow is imported inside functions only, like the sinks' other client libraries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.sinks.errors import RowError

if TYPE_CHECKING:
    import pyarrow as pa

    from onceflow.schemas import SchemaType


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

    source = column.type
    try:
        if column.type == declared and not hides_nulls(column):
            return column
        if column.type != declared and _cast_is_conversion(source, declared):
            try:
                cast = pc.cast(column, declared, safe=True)
                if not hides_nulls(cast):
                    return cast
            except pa.ArrowNotImplementedError:
                pass  # a kind of list Arrow cannot cast to a list: through the values, as rows go
        return pa.array(column.to_pylist(), type=declared)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise RowError(f"{where}: rows do not fit: column of {source} as {declared}: {exc}") from exc


def hides_nulls(column: pa.Array) -> bool:
    """Whether a non-nullable field of a struct holds nulls where its struct is null. Spark's Arrow
    batches are made so, and Parquet's writer refuses such a field although no reader sees those
    values; through Python values the slots are filled and the column written."""
    import pyarrow as pa

    types = pa.types
    if isinstance(column, pa.ChunkedArray):
        return any(hides_nulls(chunk) for chunk in column.chunks)
    kind = column.type
    if types.is_struct(kind):
        for index, field in enumerate(kind):
            child = column.field(index)
            if (not field.nullable and child.null_count) or hides_nulls(child):
                return True
        return False
    if types.is_map(kind):
        return hides_nulls(column.keys) or hides_nulls(column.items)
    if types.is_list(kind) or types.is_large_list(kind):
        return hides_nulls(column.values)
    return False


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


def _cast_is_conversion(source: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a safe cast from ``source`` to ``declared`` gives what ``pa.array`` gives for the
    column's Python values: within one family of scalars, and through nested types of the same shape
    (struct fields of the same names in the same order)."""
    import pyarrow as pa

    t = pa.types
    if source == declared or t.is_null(source):
        return True
    if _is_list(source) and t.is_list(declared):
        return _cast_is_conversion(source.value_type, declared.value_type)
    if t.is_struct(source) and t.is_struct(declared):
        if _names(source) != _names(declared):
            return False
        pairs = zip(_fields(source), _fields(declared), strict=True)
        return all(_cast_is_conversion(a.type, b.type) for a, b in pairs)
    if t.is_map(source) and t.is_map(declared):
        return _cast_is_conversion(source.key_type, declared.key_type) and _cast_is_conversion(
            source.item_type, declared.item_type
        )
    return bool(
        (t.is_integer(source) and t.is_integer(declared))
        or (t.is_floating(source) and t.is_floating(declared))
        or (_is_text(source) and _is_text(declared))
        or (_is_bytes(source) and _is_bytes(declared))
        or (t.is_decimal128(source) and t.is_decimal128(declared) and source.scale == declared.scale)
        or (t.is_timestamp(source) and t.is_timestamp(declared) and source.unit == declared.unit)
    )


def _fields(struct: pa.DataType) -> list[pa.Field]:
    return [struct.field(i) for i in range(struct.num_fields)]


def _names(struct: pa.DataType) -> list[str]:
    return [f.name for f in _fields(struct)]


def _is_list(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


# The names Arrow, Spark and Python give UTC.
UTC_NAMES = frozenset(
    {"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Zulu", "Z", "+00:00"}
)


def _inferred_type(source: pa.DataType) -> pa.DataType | None:
    """What inference gives for the Python values of a ``source`` column, where a cast reaches it.

    Nested types keep their shape, each level mapped the same way: a list of any kind is a ``list``,
    a struct keeps its fields (nullable, as inferred ones are), a map stays a map (a batch knows it is
    one; its values alone would not say)."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(source):
        return _inferred_type(source.value_type)
    if _is_list(source):
        element = _inferred_type(source.value_type)
        return None if element is None else pa.list_(element)
    if t.is_struct(source):
        fields = [source.field(i) for i in range(source.num_fields)]
        types = [_inferred_type(f.type) for f in fields]
        if any(x is None for x in types) or len({f.name for f in fields}) != len(fields):
            return None  # a name twice would be one key of the row's dict
        return pa.struct([pa.field(f.name, x) for f, x in zip(fields, types, strict=True)])
    if t.is_map(source):
        key, item = _inferred_type(source.key_type), _inferred_type(source.item_type)
        return None if key is None or item is None else pa.map_(key, item)
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
    if t.is_timestamp(source):  # UTC by any of its names is UTC (Spark says Etc/UTC, Python's rows UTC)
        return pa.timestamp("us", "UTC" if source.tz in UTC_NAMES else source.tz)
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
    """``table`` with each decimal inferred from Python values, at any depth, widened to the largest
    precision of its scale: the values of the first rows would otherwise fix a precision later rows
    exceed."""
    import pyarrow as pa

    schema = pa.schema([f.with_type(_widened(f.type)) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def _widened(kind: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    t = pa.types
    if t.is_decimal128(kind):
        return pa.decimal128(38, kind.scale)
    if t.is_list(kind):
        return pa.list_(kind.value_field.with_type(_widened(kind.value_type)))
    if t.is_struct(kind):
        return pa.struct([f.with_type(_widened(f.type)) for f in _fields(kind)])
    if t.is_map(kind):
        return pa.map_(kind.key_type, kind.item_field.with_type(_widened(kind.item_type)))
    return kind


def merged_type(have: pa.DataType, new: pa.DataType) -> pa.DataType | None:
    """The type that holds ``have``'s data and ``new``'s values, or None when there is none.

    ``have`` is what a writer established from earlier rows; it only ever grows where it had no type
    (``null``: an empty list, an all-null field), so its data casts to the result as it stands. ``new``'s
    ints fit a double as the row path converts them; a struct may lack fields (null there), never bring
    new ones: a dict whose keys vary is a map, which the writer cannot tell without `columns` or a
    batch's map type (whose items must then hold the dict's values)."""
    import pyarrow as pa

    t = pa.types
    if have == new or t.is_null(new):
        return have
    if t.is_null(have):
        return new
    if t.is_floating(have) and t.is_integer(new):
        return have
    if (
        t.is_timestamp(have)
        and t.is_timestamp(new)
        and have.unit == new.unit
        and None not in (have.tz, new.tz)
    ):
        return have  # the same instants shown in another zone (UTC, Etc/UTC): Arrow keeps them in UTC
    if t.is_list(have) and _is_list(new):
        element = merged_type(have.value_type, new.value_type)
        return None if element is None else pa.list_(have.value_field.with_type(element))
    if t.is_struct(have) and t.is_struct(new):
        theirs = {new.field(i).name: new.field(i).type for i in range(new.num_fields)}
        if not set(theirs) <= set(_names(have)):
            return None
        fields = []
        for field in (have.field(i) for i in range(have.num_fields)):
            merged = merged_type(field.type, theirs.get(field.name, pa.null()))
            if merged is None:
                return None
            fields.append(field.with_type(merged))
        return pa.struct(fields)
    if t.is_map(have) and t.is_struct(new):  # a map's dicts, inferred: their values must fit its items
        items = [merged_type(have.item_type, new.field(i).type) for i in range(new.num_fields)]
        return have if all(x == have.item_type for x in items) else None
    if t.is_map(have) and t.is_map(new):
        key, item = merged_type(have.key_type, new.key_type), merged_type(have.item_type, new.item_type)
        if key is None or item is None:
            return None
        return pa.map_(have.key_field.with_type(key), have.item_field.with_type(item))
    return None


def declared_type(text: str, where: str) -> pa.DataType:
    """The Arrow type a sink config declares: an Arrow alias (``int64``, ``double``, ``string``...,
    with Arrow's meaning, so that an existing config keeps its schema), else one of the row model's
    type texts (`onceflow.schemas`), nested ones included."""
    import pyarrow as pa

    from onceflow.errors import ConfigError
    from onceflow.schemas import parse_type

    try:
        return pa.type_for_alias(text)
    except ValueError:
        pass
    try:
        return arrow_type(parse_type(text, where))
    except ConfigError as exc:
        raise ConfigError(
            f"{where}: unknown Arrow type {text!r} (an alias such as int64, double or string), and not a "
            f"type text such as array<struct<sku:string,qty:int>>: {exc}"
        ) from exc


def arrow_type(kind: SchemaType) -> pa.DataType:
    """The Arrow type of a row type, as the decoded rows' values infer it (``timestamp`` is UTC
    microseconds, ``json`` its text). Every field and element is nullable, as the sink's columns are:
    the row model's ``?`` is checked where the rows are made, not again in the file."""
    import pyarrow as pa

    from onceflow.schemas import Array, DecimalType, Primitive, Struct

    if isinstance(kind, Primitive):
        simple = {
            "string": pa.string(),
            "json": pa.string(),
            "int": pa.int64(),
            "int32": pa.int32(),
            "float": pa.float64(),
            "bool": pa.bool_(),
            "bytes": pa.binary(),
            "date": pa.date32(),
        }
        if kind.name in simple:
            return simple[kind.name]
        return pa.timestamp("us", "UTC")  # timestamp, and its JSON spellings timestamp_ms, timestamp_us
    if isinstance(kind, DecimalType):
        return pa.decimal128(kind.precision, kind.scale)
    if isinstance(kind, Struct):
        return pa.struct([pa.field(name, arrow_type(inner)) for name, inner in kind.fields])
    if isinstance(kind, Array):
        return pa.list_(arrow_type(kind.element))
    return pa.map_(pa.string(), arrow_type(kind.value))


def utc_times(tables: list[pa.Table]) -> list[pa.Table]:
    """``tables`` with each zoned timestamp column that they name in different zones named in UTC:
    the same instants (Arrow keeps them in UTC), which Arrow will not concatenate as they are. Files
    written before every writer said UTC one way hold ``Etc/UTC`` or ``UTC``."""
    import pyarrow as pa

    zones: dict[str, set[str]] = {}
    for table in tables:
        for f in table.schema:
            if pa.types.is_timestamp(f.type) and f.type.tz:
                zones.setdefault(f.name, set()).add(f.type.tz)
    mixed = {name for name, names in zones.items() if len(names) > 1}
    if not mixed:
        return tables
    out = []
    for table in tables:
        fields = [
            f.with_type(pa.timestamp(f.type.unit, "UTC"))
            if f.name in mixed and pa.types.is_timestamp(f.type)
            else f
            for f in table.schema
        ]
        out.append(table.cast(pa.schema(fields, metadata=table.schema.metadata)))
    return out
