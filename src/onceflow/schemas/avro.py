"""Which Avro reader schemas the row model can hold, and the row columns they give.

A row is one column per field of the top-level record. A column is a primitive (or a logical type over
one), or nests: a record becomes a ``struct<...>``, an array ``array<T>``, a map ``map<string,T>``; a
``["null", T]`` union makes its type nullable at any depth, an enum is its symbol's text and a fixed its
bytes. Everything else (other unions, time-of-day, references by name to a type defined elsewhere,
which includes recursive records) is refused when the format is built, with one line naming the field's
path (``items[]`` an array's element, ``attrs{}`` a map's value), so that no epoch fails later on a value
it has no column for. Pure Python: building a spec needs no Avro library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from onceflow.errors import ConfigError
from onceflow.schemas.types import (
    MAX_DEPTH,
    MAX_PRECISION,
    Array,
    DecimalType,
    Map,
    Primitive,
    SchemaType,
    Struct,
    render,
    with_nullable,
)

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


def avro_fields(where: str, schema: Mapping[str, Any]) -> list[tuple[str, SchemaType]]:
    """(name, type) of each field of a record schema, in the schema's order; a type's own nullability
    is the field's."""
    enclosing = _names(schema)
    fields = []
    for field in schema["fields"]:
        if not isinstance(field, dict) or not isinstance(field.get("name"), str):
            raise ConfigError(f"{where}: every field needs a name")
        name = field["name"]
        fields.append((name, _field_type(where, name, field.get("type"), enclosing, 1)))
    return fields


def avro_columns(where: str, schema: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(name, row type text, nullable) of each field of a record schema, in the schema's order."""
    return [(name, render(with_nullable(t, False)), t.nullable) for name, t in avro_fields(where, schema)]


def _names(record: Mapping[str, Any]) -> frozenset[str]:
    """The names a reference to ``record`` could use: its name and its full name."""
    name, namespace = record.get("name"), record.get("namespace")
    if not isinstance(name, str):
        return frozenset()
    full = f"{namespace}.{name}" if isinstance(namespace, str) and namespace and "." not in name else name
    return frozenset({name, full, full.rpartition(".")[2]})


def _field_type(where: str, path: str, avro_type: Any, enclosing: frozenset[str], depth: int) -> SchemaType:
    at = f"{where} field {path!r}"
    if depth > MAX_DEPTH:
        raise ConfigError(f"{at}: types nest deeper than {MAX_DEPTH} levels")
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        if len(branches) != 1 or len(avro_type) != 2:
            raise ConfigError(
                f'{at}: union {json.dumps(avro_type)} is not supported (only ["null", T] maps to a column)'
            )
        return with_nullable(_value_type(where, path, branches[0], enclosing, depth), True)
    return _value_type(where, path, avro_type, enclosing, depth)


def _value_type(where: str, path: str, avro_type: Any, enclosing: frozenset[str], depth: int) -> SchemaType:
    at = f"{where} field {path!r}"
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return Primitive(_PRIMITIVES[avro_type])
        if avro_type == "null":
            raise ConfigError(f"{at}: type 'null' alone has no row column (use [\"null\", T])")
        if avro_type in enclosing:
            raise ConfigError(f"{at}: recursive reference to {avro_type!r} (a row cannot hold itself)")
        raise ConfigError(f"{at}: type {avro_type!r} has no row column (named types must be inline)")
    if not isinstance(avro_type, dict):
        raise ConfigError(f"{at}: type {json.dumps(avro_type)} has no row column")
    base, logical = avro_type.get("type"), avro_type.get("logicalType")
    if logical == "decimal" and base in ("bytes", "fixed"):
        precision, scale = avro_type.get("precision"), avro_type.get("scale", 0)
        if (
            not isinstance(precision, int)
            or not isinstance(scale, int)
            or not 0 <= scale <= precision
            or not 1 <= precision <= MAX_PRECISION
        ):
            raise ConfigError(f"{at}: decimal needs 0 <= scale <= precision, 1 <= precision <= 38")
        return DecimalType(precision, scale)
    if logical in _UNSUPPORTED_LOGICAL:
        raise ConfigError(f"{at}: logical type {logical!r} has no row column")
    if isinstance(logical, str) and isinstance(base, str) and (logical, base) in _LOGICAL:
        return Primitive(_LOGICAL[(logical, base)])
    if base == "enum":
        return Primitive("string")
    if base == "fixed":
        return Primitive("bytes")
    if base == "record":
        return _record(where, path, avro_type, enclosing, depth)
    if base == "array":
        return Array(_field_type(where, f"{path}[]", avro_type.get("items"), enclosing, depth + 1))
    if base == "map":
        return Map(_field_type(where, f"{path}{{}}", avro_type.get("values"), enclosing, depth + 1))
    if isinstance(base, str) and base in _PRIMITIVES:
        return Primitive(_PRIMITIVES[base])  # a primitive spelled as an object, or an unknown logical type
    raise ConfigError(f"{at}: type {base!r} has no row column")


def _record(
    where: str, path: str, record: Mapping[str, Any], enclosing: frozenset[str], depth: int
) -> Struct:
    fields = record.get("fields")
    if not isinstance(fields, list) or not fields:
        raise ConfigError(f"{where} field {path!r}: a nested record needs at least one field")
    inner = enclosing | _names(record)
    found: list[tuple[str, SchemaType]] = []
    for field in fields:
        if not isinstance(field, dict) or not isinstance(field.get("name"), str) or not field["name"]:
            raise ConfigError(f"{where} field {path!r}: every field needs a name")
        name = field["name"]
        if any(name == seen for seen, _ in found):
            raise ConfigError(f"{where} field {path!r}: field {name!r} is declared twice")
        found.append((name, _field_type(where, f"{path}.{name}", field.get("type"), inner, depth + 1)))
    return Struct(tuple(found))


def defaulted_fields(schema: Mapping[str, Any]) -> frozenset[str]:
    """The paths (as `avro_fields` names them: ``ctx.ip``, ``items[].sku``, ``attrs{}.n``) of the record
    fields, at any depth, that have a default: a reader may add such a field even when it is required,
    because Avro's resolution fills the default into records written without it."""
    found: set[str] = set()

    def visit(avro_type: Any, path: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            return
        if isinstance(avro_type, list):
            for branch in avro_type:
                visit(branch, path, depth + 1)
        elif isinstance(avro_type, Mapping):
            base = avro_type.get("type")
            if base == "record" and isinstance(avro_type.get("fields"), list):
                for field in avro_type["fields"]:
                    if isinstance(field, Mapping) and isinstance(field.get("name"), str):
                        inner = f"{path}.{field['name']}" if path else field["name"]
                        if "default" in field:
                            found.add(inner)
                        visit(field.get("type"), inner, depth + 1)
            elif base == "array":
                visit(avro_type.get("items"), f"{path}[]", depth + 1)
            elif base == "map":
                visit(avro_type.get("values"), f"{path}{{}}", depth + 1)

    visit(schema, "", 0)
    return frozenset(found)


def envelope_row_schema(where: str, envelope: Mapping[str, Any]) -> Mapping[str, Any]:
    """The row record of a Debezium change event's Avro schema: the record its ``before`` and ``after``
    fields hold (``["null", record]``, written inline at the first of them, named at the second)."""
    for field in envelope.get("fields", ()):
        if isinstance(field, Mapping) and field.get("name") in ("before", "after"):
            declared = field.get("type")
            for branch in declared if isinstance(declared, list) else [declared]:
                if isinstance(branch, Mapping) and branch.get("type") == "record":
                    return branch
    raise ConfigError(
        f"{where}: not a Debezium change event's schema (no 'before' or 'after' record); a format with "
        "changes reads the connector's value subject"
    )
