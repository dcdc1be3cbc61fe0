"""The Iceberg writer's checks and conversions of struct, list and map columns, shared by its row and
batch paths so that both stage the same data or refuse it with the same message.

Arrow takes a null where its type says "not null" and drops a struct key its type lacks, without a
word; a Parquet file then holds a null in a required field, and a record loses a value. So rows and
batches are checked here: a key the table's struct lacks, or a null where the table requires a value,
is a `RowError` naming the value's place (``items[].qty``, ``attrs{}``).

pyarrow is imported inside functions only, like the sinks' other client libraries.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from onceflow.sinks.errors import RowError


def is_nested(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_struct(t) or pa.types.is_map(t) or _is_list(t))


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _has_struct(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(t):
        return True
    if pa.types.is_map(t):
        return _has_struct(t.item_type)
    return _is_list(t) and _has_struct(t.value_type)


def check_keys(rows: Iterable[Mapping[str, Any]], schema: Any, where: str) -> None:
    """Refuse a struct value with a key its column's struct lacks (Arrow would drop it)."""
    columns = [(f.name, f.type) for f in schema if _has_struct(f.type)]
    if not columns:
        return
    for row in rows:
        for name, t in columns:
            found = _unknown_key(row.get(name), t, name)
            if found is not None:
                raise RowError(f"{where}: {found} is not a field of the table's column {name!r}")


def _unknown_key(value: Any, t: Any, path: str) -> str | None:
    """The place of the first key in ``value`` that type ``t`` has no field for, or None."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_struct(t):
        if not isinstance(value, Mapping):
            return None  # Arrow refuses it when it builds the column
        names = {f.name for f in t}
        for key, inner in value.items():
            if key not in names:
                return f"{path}.{key}"
            found = _unknown_key(inner, t.field(key).type, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if pa.types.is_map(t):
        pairs = value.items() if isinstance(value, Mapping) else value
        for pair in pairs if isinstance(pairs, Iterable) else ():
            if isinstance(pair, tuple) and len(pair) == 2:
                found = _unknown_key(pair[1], t.item_type, f"{path}{{}}")
                if found is not None:
                    return found
        return None
    if _is_list(t) and isinstance(value, list | tuple):
        for item in value:
            found = _unknown_key(item, t.value_type, f"{path}[]")
            if found is not None:
                return found
    return None


def check_required(table: Any, where: str) -> None:
    """Refuse data with a null where the table's schema requires a value, at any depth."""
    for field, column in zip(table.schema, table.columns, strict=True):
        for chunk in column.chunks:
            problem = _null_where_required(chunk, field, field.name)
            if problem is not None:
                raise RowError(f"{where}: {problem} is null, and the table requires a value there")


def _null_where_required(array: Any, field: Any, path: str) -> str | None:
    """The place of a null in ``array`` (the values of ``field``) where the field is not nullable."""
    import pyarrow as pa

    if not field.nullable and array.null_count:
        return path
    t = field.type
    if not is_nested(t):
        return None
    valid = array.filter(array.is_valid()) if array.null_count else array
    if pa.types.is_struct(t):
        for i, child in enumerate(t):
            found = _null_where_required(valid.field(i), child, f"{path}.{child.name}")
            if found is not None:
                return found
        return None
    if pa.types.is_map(t):
        if not len(valid):
            return None
        first, last = valid.offsets[0].as_py(), valid.offsets[-1].as_py()  # `items` ignores slicing
        return _null_where_required(valid.items.slice(first, last - first), t.item_field, f"{path}{{}}")
    return _null_where_required(valid.flatten(), t.value_field, f"{path}[]")


def fit_column(column: Any, target: Any, where: str, name: str) -> Any:
    """A batch's nested column as ``pa.array(column.to_pylist(), target)`` gives it, the row path's
    result: cast where the shapes match (same struct fields in order, lossless leaves), else through
    its Python values, with the row path's key check."""
    import pyarrow as pa

    if _castable(column.type, target):
        try:
            cast = column.cast(target)
            if not _hidden_nulls(cast, pa.field(name, target)):
                return cast
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            pass  # e.g. a null where the table requires a value: the row path says where
    try:
        values = column.to_pylist()
        found = next(
            (p for p in (_unknown_key(v, target, name) for v in values) if p is not None),
            None,
        )
        if found is not None:
            raise RowError(f"{where}: {found} is not a field of the table's column {name!r}")
        return pa.array(values, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise RowError(
            f"{where}: column {name!r} ({column.type}) does not fit the table's {target}: {exc}"
        ) from exc


def _hidden_nulls(array: Any, field: Any) -> bool:
    """Whether a not-nullable struct field holds nulls under null structs: Spark leaves them there,
    Parquet refuses them, and Python values (the row path's) have none, so the column goes through those."""
    import pyarrow as pa

    t = field.type
    if pa.types.is_struct(t):
        return any(
            (not child.nullable and array.field(i).null_count) or _hidden_nulls(array.field(i), child)
            for i, child in enumerate(t)
        )
    if pa.types.is_map(t):
        return _hidden_nulls(array.items, t.item_field)
    if _is_list(t):
        return _hidden_nulls(array.values, t.value_field)
    return False


def _castable(source: Any, target: Any) -> bool:
    """Whether casting ``source`` data to ``target`` gives what its Python values would."""
    import pyarrow as pa

    t = pa.types
    if t.is_struct(source) and t.is_struct(target):
        return [f.name for f in source] == [f.name for f in target] and all(
            _castable(s.type, d.type) for s, d in zip(source, target, strict=True)
        )
    if t.is_map(source) and t.is_map(target):
        return _castable(source.key_type, target.key_type) and _castable(source.item_type, target.item_type)
    if _is_list(source) and _is_list(target):
        return _castable(source.value_type, target.value_type)
    if is_nested(source) or is_nested(target):
        return False
    if source == target:
        return True
    text = (t.is_string, t.is_large_string)
    binary = (t.is_binary, t.is_large_binary)
    return bool(
        (any(f(source) for f in text) and any(f(target) for f in text))
        or (any(f(source) for f in binary) and any(f(target) for f in binary))
        or (t.is_integer(source) and t.is_int64(target))
        or (t.is_floating(source) and t.is_float64(target))
        or (
            t.is_timestamp(source)
            and t.is_timestamp(target)
            and source.tz is not None
            and target.tz is not None
            and source.unit in ("s", "ms", "us")
            and target.unit == "us"
        )
    )


_FIX_LOCK = threading.Lock()


def keep_null_lists() -> None:
    """Make pyiceberg keep a null list of structs null when it projects Arrow data to a file's schema.

    pyiceberg (0.12, the pinned version) rebuilds such a list from its offsets
    alone, so a null becomes an empty list in the Parquet file it writes, for every reader after. The
    rebuilt list gets the original's validity back; installed once per process, for writes and reads
    alike, and a no-op where the projection already keeps them."""
    from pyiceberg.io.pyarrow import ArrowProjectionVisitor

    with _FIX_LOCK:
        original = ArrowProjectionVisitor.list
        if getattr(original, "keeps_null_lists", False):
            return

        def projected_list(self: Any, list_type: Any, list_array: Any, value_array: Any) -> Any:
            result = original(self, list_type, list_array, value_array)
            if result is None or list_array is None or not list_array.null_count or result.null_count:
                return result
            return type(result).from_arrays(
                result.offsets, result.values, type=result.type, mask=list_array.is_null()
            )

        projected_list.keeps_null_lists = True  # type: ignore[attr-defined]
        ArrowProjectionVisitor.list = projected_list  # type: ignore[method-assign]
