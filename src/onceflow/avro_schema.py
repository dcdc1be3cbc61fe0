"""Which Avro reader schemas the row model can hold, and the row columns they give.

A row is flat: one column per field of a top-level record, each a primitive (or a logical type over one),
optionally nullable through a ``["null", T]`` union. Everything else (nested records, arrays, maps,
other unions, time-of-day) is refused when the format is built, with one line naming the field, so
that no epoch fails later on a value it has no column for. Pure Python: building a spec needs no Avro
library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from onceflow.errors import ConfigError

# Avro primitive type -> the row model's type name (see `onceflow.decoding.records.row_columns`).
_PRIMITIVES: dict[str, str] = {
    "string": "string",
    "int": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "boolean": "bool",
    "bytes": "bytes",
}
# Logical types, by the Avro type they annotate; uuid is kept as its text.
_LOGICAL: dict[tuple[str, str], str] = {
    ("timestamp-millis", "long"): "timestamp",
    ("timestamp-micros", "long"): "timestamp",
    ("date", "int"): "date",
    ("uuid", "string"): "string",
}
_UNSUPPORTED_LOGICAL = ("time-millis", "time-micros", "local-timestamp-millis", "local-timestamp-micros")


def parse_schema_text(where: str, text: str) -> Mapping[str, Any]:
    """The JSON of an Avro schema, which must be a record."""
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not a JSON Avro schema ({exc})") from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError(f"{where}: expected an Avro schema of type 'record' at the top")
    if not isinstance(schema.get("fields"), list) or not schema["fields"]:
        raise ConfigError(f"{where}: the record has no fields")
    return schema


def avro_columns(where: str, schema: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(name, row type, nullable) of each field of a record schema, in the schema's order."""
    columns = []
    for field in schema["fields"]:
        if not isinstance(field, dict) or not isinstance(field.get("name"), str):
            raise ConfigError(f"{where}: every field needs a name")
        name = field["name"]
        row_type, nullable = _field_type(f"{where} field {name!r}", field.get("type"))
        columns.append((name, row_type, nullable))
    return columns


def _field_type(where: str, avro_type: Any) -> tuple[str, bool]:
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        if len(branches) != 1 or len(avro_type) != 2:
            raise ConfigError(
                f'{where}: union {json.dumps(avro_type)} is not supported (only ["null", T] maps to a column)'
            )
        return _value_type(where, branches[0]), True
    return _value_type(where, avro_type), False


def _value_type(where: str, avro_type: Any) -> str:
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return _PRIMITIVES[avro_type]
        raise ConfigError(f"{where}: type {avro_type!r} has no row column (named types must be inline)")
    if not isinstance(avro_type, dict):
        raise ConfigError(f"{where}: type {json.dumps(avro_type)} has no row column")
    base, logical = avro_type.get("type"), avro_type.get("logicalType")
    if logical == "decimal" and base in ("bytes", "fixed"):
        precision, scale = avro_type.get("precision"), avro_type.get("scale", 0)
        if not isinstance(precision, int) or not isinstance(scale, int) or not 0 <= scale <= precision <= 38:
            raise ConfigError(f"{where}: decimal needs 0 <= scale <= precision <= 38")
        return f"decimal({precision},{scale})"
    if logical in _UNSUPPORTED_LOGICAL:
        raise ConfigError(f"{where}: logical type {logical!r} has no row column")
    if isinstance(logical, str) and isinstance(base, str) and (logical, base) in _LOGICAL:
        return _LOGICAL[(logical, base)]
    if base == "enum":
        return "string"
    if base == "fixed":
        return "bytes"
    if isinstance(base, str) and base in _PRIMITIVES:
        return _PRIMITIVES[base]  # a primitive spelled as an object, or an unknown logical type over it
    raise ConfigError(f"{where}: type {base!r} has no row column (rows are flat records of primitives)")
