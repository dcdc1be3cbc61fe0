"""A Delta table widened at plan time to the columns an epoch will write.

New columns, and new fields of struct columns, list elements and map values, are added nullable in
**one** metadata commit before any task of the epoch stages a file, as the Iceberg sink's schema update
is: rows of earlier versions read the new columns as null, and a recovered earlier epoch's files,
staged narrower, are read the same way. A column whose type would change is refused in one line, and
nothing is added: Delta's readers only widen types through a table feature that onceflow does not turn on.
"""

from __future__ import annotations

from typing import Any

from onceflow.errors import ConfigError
from onceflow.sinks.delta.config import plain_type


def widenings(table_schema: Any, wanted: Any, where: str) -> list[Any]:
    """The columns to add or to widen so that the table holds ``wanted``: each as the table's column
    with the new fields merged in, nullable (rows written before them have none); a column whose
    type would change otherwise is refused in one line."""
    import pyarrow as pa

    found = {f.name: f for f in table_schema}
    changed: list[Any] = []
    refused: list[str] = []
    for field in wanted:
        have = found.get(field.name)
        if have is None:
            changed.append(pa.field(field.name, plain_type(field.type), True))
            continue
        merged = _merged(plain_type(have.type), plain_type(field.type))
        if merged is None:
            refused.append(f"{field.name} ({have.type} in the table, {field.type} wanted)")
        elif merged != plain_type(have.type):
            changed.append(pa.field(field.name, merged, True))
    if refused:
        raise ConfigError(
            f"{where}: the columns {refused} change type; Delta keeps a column's type: write them to a "
            "new column"
        )
    return changed


def _merged(have: Any, want: Any) -> Any | None:
    """``have`` with the struct fields that ``want`` adds at any depth (nullable), or None when
    ``want`` differs from it otherwise. Fields the rows no longer carry stay, read as null."""
    import pyarrow as pa

    if have == want:
        return have
    types = pa.types
    if types.is_struct(have) and types.is_struct(want):
        fields = {f.name: f for f in have}
        for new in want:
            old = fields.get(new.name)
            if old is None:
                fields[new.name] = pa.field(new.name, new.type, True)
                continue
            inner = _merged(old.type, new.type)
            if inner is None:
                return None
            fields[new.name] = pa.field(old.name, inner, old.nullable)
        return pa.struct(list(fields.values()))
    if types.is_list(have) and types.is_list(want):
        inner = _merged(have.value_type, want.value_type)
        return None if inner is None else pa.list_(pa.field("element", inner, have.value_field.nullable))
    if types.is_map(have) and types.is_map(want) and have.key_type == want.key_type:
        inner = _merged(have.item_type, want.item_type)
        if inner is None:
            return None
        return pa.map_(have.key_field, pa.field("value", inner, have.item_field.nullable))
    return None


def widen(table: Any, fields: list[Any], where: str) -> None:
    """Add ``fields`` to the table in one commit (delta-rs merges a known struct column's new fields
    into it); a refusal of delta-rs is one line naming the table."""
    from deltalake import Field
    from deltalake.exceptions import DeltaError

    try:
        table.alter.add_columns([Field.from_arrow(f) for f in fields])
    except (DeltaError, ValueError) as exc:
        raise ConfigError(
            f"{where}: the new columns could not be added: {' '.join(str(exc).split())}"
        ) from exc
