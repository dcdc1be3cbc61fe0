"""The Iceberg sink's view of its catalog and table: loading, creating, checking and evolving the schema.

Shared by the writer (in a Spark task), the committer and the plan-time check. It imports pyiceberg
lazily and nothing of the ledger or coordinator. Catalogs are cached per process and per set of
properties, so the tasks of one Python worker open the catalog's database once.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError

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
    """The Iceberg column type of a decoded row type (`onceflow.decoding.records.row_columns`), or None."""
    return type_name if _DECIMAL.match(type_name) else ROW_TYPES.get(type_name)


def iceberg_type(name: str, where: str) -> Any:
    """The pyiceberg type for a declared column type name (e.g. ``long``, ``int64``, ``timestamp``,
    ``decimal(12,2)``)."""
    from pyiceberg import types as T

    decimal = _DECIMAL.match(name.strip().lower())
    if decimal is not None:
        precision, scale = int(decimal[1]), int(decimal[2])
        if not 1 <= precision <= 38 or scale > precision:
            raise ConfigError(f"{where}: column type {name!r}: precision 1..38, scale <= precision")
        return T.DecimalType(precision, scale)
    found = TYPE_NAMES.get(name.strip().lower())
    if found is None:
        known = ", ".join([*sorted(set(TYPE_NAMES)), "decimal(p,s)"])
        raise ConfigError(f"{where}: unknown column type {name!r}; known: {known}")
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


def schema_of(columns: Sequence[tuple[str, str]], where: str) -> Schema:
    """A schema of optional (nullable) columns in the given order; field ids are assigned 1..n."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    return Schema(
        *(
            NestedField(field_id=i, name=name, field_type=iceberg_type(type_name, where), required=False)
            for i, (name, type_name) in enumerate(columns, start=1)
        )
    )


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


def differences(table_schema: Schema, wanted: Schema) -> tuple[list[str], list[str]]:
    """(conflicts, new columns): a column whose type differs, or a required table column the rows do
    not have, conflicts; a column the table lacks is new (added as optional, which Iceberg allows)."""
    conflicts: list[str] = []
    new: list[str] = []
    have = {f.name: f for f in table_schema.fields}
    wanted_names = {f.name for f in wanted.fields}
    for field in wanted.fields:
        existing = have.get(field.name)
        if existing is None:
            new.append(field.name)
        elif existing.field_type != field.field_type:
            conflicts.append(f"{field.name} is {existing.field_type} in the table, {field.field_type} here")
    conflicts += [
        f"{f.name} is required in the table and missing here"
        for f in have.values()
        if f.required and f.name not in wanted_names
    ]
    return conflicts, new


def ensure_table(
    cat: Catalog,
    table: str,
    wanted: Schema,
    partition_by: Sequence[tuple[str, str]],
    properties: Mapping[str, str],
    where: str,
) -> Table:
    """The table, created from ``wanted`` when absent; an existing table gains ``wanted``'s new columns
    (nullable), and a conflicting schema is refused with one line naming the columns."""
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
    conflicts, new = differences(found.schema(), wanted)
    if conflicts:
        raise ConfigError(
            f"{where}: the table's schema does not match: {'; '.join(conflicts)}; write to a new table or "
            "change the columns"
        )
    if new:
        with found.update_schema() as update:
            for name in new:
                field = wanted.find_field(name)
                update.add_column(name, field.field_type)
        found = cat.load_table(identifier(table))
    return found
