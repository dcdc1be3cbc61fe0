"""The Iceberg sink's view of its catalog and table: loading, creating, checking and evolving the schema.

Shared by the writer (in a Spark task), the committer and the plan-time check. It imports pyiceberg
lazily and nothing of the ledger or coordinator. Catalogs are cached per process and per set of
properties, so the tasks of one Python worker open the catalog's database once.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.schemas import types

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

# Column types a sink's `columns` may name: Iceberg's primitive names and the Arrow aliases that the
# files sink takes, so one pipeline's declarations read the same for both sinks.
TYPE_NAMES: dict[str, str] = {
    "string": "string",
    "long": "long",
    "int64": "long",
    "bigint": "long",
    "int": "int",
    "int32": "int",
    "integer": "int",
    "double": "double",
    "float64": "double",
    "float": "float",
    "float32": "float",
    "boolean": "boolean",
    "bool": "boolean",
    "binary": "binary",
    "date": "date",
    "date32": "date",
    "timestamp": "timestamp",
    "timestamptz": "timestamptz",
}
# What the decoded rows' types (`onceflow.decoding.records.row_columns`) are in Iceberg.
ROW_TYPES: dict[str, str] = {
    "string": "string",
    "int": "long",
    "int32": "int",
    "float": "double",
    "bool": "boolean",
    "bytes": "binary",
    "timestamp": "timestamptz",  # Avro's timestamps are instants (UTC)
    "date": "date",
    "json": "string",  # a sub-document as canonical JSON text: Iceberg has no JSON type
}
# A decimal column, declared or decoded (Avro's decimal logical type): ``decimal(precision, scale)``.
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)\Z")

_catalogs: dict[tuple[tuple[str, str], ...], Any] = {}
_lock = threading.Lock()


def catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """The catalog with these properties, opened once per process."""
    from pyiceberg.catalog import load_catalog

    key = (("name", name), *sorted(properties.items()))
    with _lock:
        if key not in _catalogs:
            if properties.get("type") == "sql" and str(properties.get("uri", "")).startswith("sqlite:///"):
                _make_sqlite_parents(properties)
            _catalogs[key] = load_catalog(name, **dict(properties))
        return _catalogs[key]  # type: ignore[no-any-return]


def _make_sqlite_parents(properties: Mapping[str, str]) -> None:
    """A default SQLite catalog under ONCEFLOW_HOME: its folder and warehouse exist before first use."""
    from pathlib import Path

    Path(str(properties["uri"]).removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    warehouse = str(properties.get("warehouse", ""))
    if warehouse.startswith("file://"):
        Path(warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)


def identifier(table: str) -> tuple[str, ...]:
    """``namespace.name`` (namespaces may nest: ``a.b.name``; a bare ``name`` is in ``default``, as in
    Spark) as pyiceberg's identifier tuple."""
    parts = tuple(table.split("."))
    if not all(parts):
        raise ConfigError(
            f"iceberg sink config table={table!r}: expected 'namespace.name', e.g. 'events.clicks'"
        )
    return parts if len(parts) > 1 else ("default", *parts)


def load(cat: Catalog, table: str) -> Table | None:
    """The table, or None when the catalog has no such table."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return cat.load_table(identifier(table))
    except NoSuchTableError:
        return None


def row_type(type_name: str) -> str | None:
    """The Iceberg column type of a decoded row type (`onceflow.decoding.records.row_columns`), or None.

    A flat type becomes its Iceberg name; a nested one keeps its canonical text (without the column's
    own ``?``: columns are optional), which `iceberg_type` reads with the row model's meaning."""
    if _DECIMAL.match(type_name):
        return type_name
    if type_name in ROW_TYPES:
        return ROW_TYPES[type_name]
    try:
        parsed = types.row_type(types.with_nullable(types.parse_type(type_name), False))
    except ConfigError:
        return None
    text = types.render(parsed)
    if types.is_flat(parsed):
        return text if _DECIMAL.match(text) else ROW_TYPES.get(text)
    return text if types.primitive_names(parsed) <= {*ROW_TYPES, "decimal"} else None


def iceberg_type(name: str, where: str) -> Any:
    """The pyiceberg type for a declared column type (e.g. ``long``, ``int64``, ``timestamp``,
    ``decimal(12,2)``), or for a row type's canonical text (``array<struct<sku:string,qty:int>>``,
    ``bytes``, ``json``); a nested type's field ids are unique within it, 1 upwards.

    The flat Iceberg and Arrow names keep the meaning they always had (``int`` 32-bit, ``timestamp``
    without a zone); inside a nested text every name is the row model's (`ROW_TYPES`: ``int`` 64-bit,
    ``float`` double, ``timestamp`` UTC), so that declaring a decoded column's text gives its table."""
    from pyiceberg import types as T

    decimal = _DECIMAL.match(name.strip().lower())
    if decimal is not None:
        precision, scale = int(decimal[1]), int(decimal[2])
        if not 1 <= precision <= 38 or scale > precision:
            raise ConfigError(f"{where}: column type {name!r}: precision 1..38, scale <= precision")
        return T.DecimalType(precision, scale)
    found = TYPE_NAMES.get(name.strip().lower())
    if found is None:
        parsed = _parsed(name, where)
        if parsed is not None:
            ids = itertools.count(1)
            return _of_row_type(types.row_type(parsed), lambda: next(ids))
        known = ", ".join(
            [*sorted(set(TYPE_NAMES)), "decimal(p,s)", "bytes", "json", "struct<...>", "array<T>"]
        )
        raise ConfigError(f"{where}: unknown column type {name!r}; known: {known}, map<string,T>")
    return {
        "string": T.StringType(),
        "long": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "float": T.FloatType(),
        "boolean": T.BooleanType(),
        "binary": T.BinaryType(),
        "date": T.DateType(),
        "timestamp": T.TimestampType(),
        "timestamptz": T.TimestamptzType(),
    }[found]


def _parsed(name: str, where: str) -> types.SchemaType | None:
    """The tree of a canonical type text the row model can store in Iceberg; None when ``name`` is no
    type text at all (so that the message lists the names), a one-line error when it is one with a fault."""
    stripped = name.strip()
    if not re.match(r"(struct|array|map)\s*<|(bytes|json|timestamp_ms|timestamp_us)\s*\??\Z", stripped):
        return None
    parsed = types.parse_type(stripped, f"{where}: column type")
    unknown = sorted(types.primitive_names(types.row_type(parsed)) - {*ROW_TYPES, "decimal"})
    if unknown:
        raise ConfigError(f"{where}: column type {name!r}: {', '.join(unknown)} cannot be stored in Iceberg")
    return parsed


def _of_row_type(t: types.SchemaType, next_id: Callable[[], int]) -> Any:
    """The pyiceberg type of a row type; a field, element or value is required unless its type has ``?``."""
    from pyiceberg import types as T

    if isinstance(t, types.DecimalType):
        return T.DecimalType(t.precision, t.scale)
    if isinstance(t, types.Primitive):
        return iceberg_type(ROW_TYPES[t.name], "row type")
    if isinstance(t, types.Struct):
        return T.StructType(
            *(
                T.NestedField(next_id(), name, _of_row_type(f, next_id), required=not f.nullable)
                for name, f in t.fields
            )
        )
    if isinstance(t, types.Array):
        return T.ListType(
            next_id(), _of_row_type(t.element, next_id), element_required=not t.element.nullable
        )
    key_id, value_id = next_id(), next_id()
    return T.MapType(
        key_id, T.StringType(), value_id, _of_row_type(t.value, next_id), value_required=not t.value.nullable
    )


def arrow_type(t: Any, where: str, column: str) -> Any:
    """The pyiceberg type for an Arrow type of the first rows or batch (when nothing declared the table),
    nested fields, elements and values optional: the first rows cannot say what later ones omit."""
    import pyarrow as pa
    from pyiceberg import types as T

    ids = itertools.count(1)

    def convert(t: Any, path: str) -> Any:
        if pa.types.is_struct(t):
            if t.num_fields == 0:
                raise ConfigError(f"{where}: {path} is an empty struct, which Iceberg cannot store")
            return T.StructType(
                *(
                    T.NestedField(next(ids), f.name, convert(f.type, f"{path}.{f.name}"), required=False)
                    for f in t
                )
            )
        if pa.types.is_map(t):
            key = convert(t.key_type, f"{path} key")
            return T.MapType(
                next(ids), key, next(ids), convert(t.item_type, f"{path} value"), value_required=False
            )
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            return T.ListType(next(ids), convert(t.value_type, f"{path} element"), element_required=False)
        flat = _arrow_flat(t)
        if flat is None:
            if pa.types.is_null(t):
                raise ConfigError(
                    f"{where}: {path} is null (or empty) in every row, so its type is unknown; "
                    "declare `columns` in the sink config"
                )
            raise ConfigError(f"{where}: {path} has type {t}, which the sink cannot store")
        return iceberg_type(flat, where)

    return convert(t, f"column {column!r}")


def _arrow_flat(t: Any) -> str | None:
    """The Iceberg name of a flat Arrow type, or None."""
    import pyarrow as pa

    checks: tuple[tuple[Callable[[Any], bool], str], ...] = (
        (
            lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t),
            "string",
        ),
        (pa.types.is_int64, "long"),
        (pa.types.is_integer, "int"),
        (pa.types.is_float64, "double"),
        (pa.types.is_floating, "float"),
        (pa.types.is_boolean, "boolean"),
        (
            lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t),
            "binary",
        ),
        (pa.types.is_date, "date"),
    )
    for check, name in checks:
        if check(t):
            return name
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"decimal({t.precision},{t.scale})"
    return None


def schema_of(columns: Sequence[tuple[str, str]], where: str) -> Schema:
    """A schema of optional (nullable) columns in the given order: ids 1..n for the columns, then their
    nested fields' in Iceberg's own order (what a catalog assigns a new table)."""
    return schema_of_types([(name, iceberg_type(type_name, where)) for name, type_name in columns])


def schema_of_types(columns: Sequence[tuple[str, Any]]) -> Schema:
    """A schema of optional columns of these pyiceberg types, with fresh, unique field ids.

    Columns stay optional whatever the rows' nullability: a table outlives one pipeline, Iceberg only
    adds optional columns, and a row or batch may lack a column (it is written as nulls)."""
    from pyiceberg.schema import Schema, assign_fresh_schema_ids
    from pyiceberg.types import NestedField

    placeholder = itertools.count(1_000_000)  # unique, so that reassigning maps each id once
    draft = Schema(
        *(
            NestedField(
                field_id=next(placeholder), name=name, field_type=_renumbered(t, placeholder), required=False
            )
            for name, t in columns
        )
    )
    return assign_fresh_schema_ids(draft)


def _renumbered(t: Any, ids: Iterator[int]) -> Any:
    """``t`` with every nested id taken from ``ids`` (types built apart each number from 1)."""
    from pyiceberg import types as T

    if isinstance(t, T.StructType):
        return T.StructType(
            *(
                T.NestedField(next(ids), f.name, _renumbered(f.field_type, ids), required=f.required)
                for f in t.fields
            )
        )
    if isinstance(t, T.ListType):
        return T.ListType(next(ids), _renumbered(t.element_type, ids), element_required=t.element_required)
    if isinstance(t, T.MapType):
        key_id, value_id = next(ids), next(ids)
        return T.MapType(
            key_id, _renumbered(t.key_type, ids), value_id, _renumbered(t.value_type, ids), t.value_required
        )
    return t


def type_text(t: Any) -> str:
    """A pyiceberg type as a message shows it: nested fields by name and requiredness, without ids
    (two tables' ids for one type differ)."""
    from pyiceberg import types as T

    def req(required: bool) -> str:
        return "required " if required else ""

    if isinstance(t, T.StructType):
        return (
            "struct<"
            + ", ".join(f"{f.name}: {req(f.required)}{type_text(f.field_type)}" for f in t.fields)
            + ">"
        )
    if isinstance(t, T.ListType):
        return f"list<{req(t.element_required)}{type_text(t.element_type)}>"
    if isinstance(t, T.MapType):
        return f"map<{type_text(t.key_type)}, {req(t.value_required)}{type_text(t.value_type)}>"
    return str(t)


def holds(existing: Any, wanted: Any) -> bool:
    """Whether a table's column type ``existing`` takes data of type ``wanted``: the same type at every
    depth (fields by name, in order; ids aside), and nothing required in the table that may be null here."""
    from pyiceberg import types as T

    if isinstance(existing, T.StructType) and isinstance(wanted, T.StructType):
        return len(existing.fields) == len(wanted.fields) and all(
            e.name == w.name and (w.required or not e.required) and holds(e.field_type, w.field_type)
            for e, w in zip(existing.fields, wanted.fields, strict=True)
        )
    if isinstance(existing, T.ListType) and isinstance(wanted, T.ListType):
        return (wanted.element_required or not existing.element_required) and holds(
            existing.element_type, wanted.element_type
        )
    if isinstance(existing, T.MapType) and isinstance(wanted, T.MapType):
        return (
            (wanted.value_required or not existing.value_required)
            and holds(existing.key_type, wanted.key_type)
            and holds(existing.value_type, wanted.value_type)
        )
    nested = (T.StructType, T.ListType, T.MapType)
    return not isinstance(existing, nested) and not isinstance(wanted, nested) and existing == wanted


def partition_spec(schema: Schema, partition_by: Sequence[tuple[str, str]], where: str) -> Any:
    """The partition spec for ``{column: transform}`` such as ``{"ts": "day", "id": "bucket[16]"}``."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
    from pyiceberg.transforms import UnknownTransform, parse_transform

    if not partition_by:
        return UNPARTITIONED_PARTITION_SPEC
    fields = []
    for i, (column, transform) in enumerate(partition_by):
        try:
            source = schema.find_field(column)
        except ValueError as exc:
            raise ConfigError(f"{where}: partition column {column!r} is not a column of the table") from exc
        try:
            parsed = parse_transform(transform)
            if isinstance(parsed, UnknownTransform):
                raise ValueError(transform)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: partition transform {transform!r} of {column!r}: expected identity, year, month, "
                "day, hour, bucket[N] or truncate[W]"
            ) from exc
        label = column if transform == "identity" else f"{column}_{transform.split('[')[0]}"
        fields.append(
            PartitionField(source_id=source.field_id, field_id=1000 + i, transform=parsed, name=label)
        )
    return PartitionSpec(*fields)


def differences(table_schema: Schema, wanted: Schema) -> tuple[list[str], list[tuple[str, ...]]]:
    """(conflicts, new fields): a field whose type differs, a field the table requires that may be null
    here, or a required table field the rows do not have, conflicts; a field the table lacks, at any
    depth (a column, or a field of a struct column, of its list elements or map values), is new: added
    as optional, which Iceberg allows. New fields are given by their paths, as `add_column` takes them."""
    conflicts: list[str] = []
    new: list[tuple[str, ...]] = []
    _struct_differences(table_schema.as_struct(), wanted.as_struct(), (), conflicts, new)
    return conflicts, new


def _struct_differences(
    have: Any, wanted: Any, path: tuple[str, ...], conflicts: list[str], new: list[tuple[str, ...]]
) -> None:
    from pyiceberg import types as T

    existing = {f.name: f for f in have.fields}
    for field in wanted.fields:
        here = (*path, field.name)
        found = existing.get(field.name)
        if found is None:
            new.append(here)
        elif found.required and not field.required:
            conflicts.append(f"{'.'.join(here)} is required in the table, and may be null here")
        elif isinstance(found.field_type, T.StructType) and isinstance(field.field_type, T.StructType):
            _struct_differences(found.field_type, field.field_type, here, conflicts, new)
        elif (inner := _element_structs(found.field_type, field.field_type)) is not None:
            name, a, b = inner
            _struct_differences(a, b, (*here, name), conflicts, new)
        elif not holds(found.field_type, field.field_type):
            conflicts.append(
                f"{'.'.join(here)} is {type_text(found.field_type)} in the table, "
                f"{type_text(field.field_type)} here"
            )
    wanted_names = {f.name for f in wanted.fields}
    conflicts += [
        f"{'.'.join((*path, f.name))} is required in the table and missing here"
        for f in have.fields
        if f.required and f.name not in wanted_names
    ]


def _element_structs(have: Any, wanted: Any) -> tuple[str, Any, Any] | None:
    """For a list of structs (a map of struct values) on both sides whose element (value) nullability
    fits: the name Iceberg gives the element (value) field, and the two structs, so that their fields
    are compared and added too."""
    from pyiceberg import types as T

    if isinstance(have, T.ListType) and isinstance(wanted, T.ListType):
        pair, name = (have.element_type, wanted.element_type), "element"
        fits = wanted.element_required or not have.element_required
    elif isinstance(have, T.MapType) and isinstance(wanted, T.MapType) and have.key_type == wanted.key_type:
        pair, name = (have.value_type, wanted.value_type), "value"
        fits = wanted.value_required or not have.value_required
    else:
        return None
    if fits and all(isinstance(t, T.StructType) for t in pair):
        return name, pair[0], pair[1]
    return None


def new_fields(found: Table, wanted: Schema, where: str) -> list[tuple[str, ...]]:
    """The fields ``wanted`` adds to the table ``found``; a conflicting schema is refused in one line."""
    conflicts, new = differences(found.schema(), wanted)
    if conflicts:
        raise ConfigError(
            f"{where}: the table's schema does not match: {'; '.join(conflicts)}; write to a new table or "
            "change the columns"
        )
    return new


def ensure_table(
    cat: Catalog,
    table: str,
    wanted: Schema,
    partition_by: Sequence[tuple[str, str]],
    properties: Mapping[str, str],
    where: str,
) -> Table:
    """The table, created from ``wanted`` when absent; an existing table gains ``wanted``'s new fields
    (optional, at any depth: one schema update, committed before the epoch's snapshot), and a
    conflicting schema is refused with one line naming the fields."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    found = load(cat, table)
    if found is None:
        namespace = identifier(table)[:-1]
        with contextlib.suppress(NamespaceAlreadyExistsError):
            cat.create_namespace(namespace)
        spec = partition_spec(wanted, partition_by, where)
        return cat.create_table_if_not_exists(
            identifier(table), schema=wanted, partition_spec=spec, properties=dict(properties)
        )
    new = new_fields(found, wanted, where)
    if new:
        with found.update_schema() as update:
            for path in new:
                field = wanted.find_field(".".join(path))
                update.add_column(path, field.field_type, doc=field.doc, required=False)
        found = cat.load_table(identifier(table))
    return found
