"""Avro record values decoded into row values, with fastavro, or rejected with a dead-letter reason.

Runs wherever records are decoded (the local executor, spark-submit tasks, the warm runtime's Python
workers), so it imports nothing of the ledger or the coordinator. Writer schemas are looked up by id
once per process (`_WRITERS`): a registry round trip per record would cost more than the decode.
Avro's schema resolution (fields added with a default, fields removed, int widened to long or float
to double) is fastavro's; what this module adds is telling apart why a record could not be read.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from typing import Any

from onceflow.decoding.schema_registry import (
    MAGIC_BYTE,
    WIRE_HEADER,
    SchemaNotFound,
    SchemaRegistry,
    registry_at,
)
from onceflow.errors import ConfigError
from onceflow.pipeline import AvroFormat, Pipeline

# Parsed writer schemas by (registry's cache key, id), for this process: ids are immutable in a registry.
_WRITERS: dict[tuple[str, int], Any] = {}
# One registry client per URL and process, so every task of a Python worker shares one.
_REGISTRIES: dict[str, SchemaRegistry] = {}


def registry_for(url: str | None) -> SchemaRegistry | None:
    """This process's client of the registry at ``url`` (see `schema_registry.registry_at`)."""
    if url is None:
        return None
    if url not in _REGISTRIES:
        made = registry_at(url)
        assert made is not None  # a URL always names a registry
        _REGISTRIES[url] = made
    return _REGISTRIES[url]


def pinned(spec: Pipeline, registry_url: str | None) -> Pipeline:
    """``spec`` with its Avro subject's latest schema as the reader schema, for one slice: every task of
    the slice then reads with the same schema, whatever the subject gets meanwhile. Other specs as given.
    """
    fmt = spec.format
    if not isinstance(fmt, AvroFormat) or fmt.pinned:
        return spec
    registry = registry_for(registry_url)
    if registry is None:
        raise ConfigError(
            f"format.subject={fmt.subject!r} needs a schema registry: set ONCEFLOW_SCHEMA_REGISTRY_URL"
        )
    assert fmt.subject is not None
    try:
        latest = registry.latest(fmt.subject)  # RegistryUnavailable propagates: the slice fails
    except SchemaNotFound as exc:
        raise ConfigError(f"format.subject={fmt.subject!r}: {exc}") from exc
    return dataclasses.replace(spec, format=fmt.pin(latest.schema))


class AvroReject(Exception):
    """A record that cannot become a row: its dead-letter reason, ``code: detail``."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.reason = f"{code}: {detail}"


class AvroDecoder:
    """Turns one format's Avro values into the reader schema's field values, in its field order."""

    def __init__(self, fmt: AvroFormat, registry: SchemaRegistry | None) -> None:
        from fastavro import parse_schema

        self.fmt = fmt
        self.registry = registry
        # Registries that name a cache key share parsed writer schemas across this process's decoders.
        self.cache_key: str | None = getattr(registry, "cache_key", None)
        self._writers: dict[int, Any] = {}
        columns = fmt.columns()
        self.names = [name for name, _, _ in columns]
        self.required = {name for name, _, nullable in columns if not nullable}
        fields = json.loads(fmt.reader_schema or "{}")["fields"]
        self.uuids = {f["name"] for f in fields if _is_uuid(f["type"])}
        # fastavro rounds a decimal with more digits than its precision to that many significant digits
        # instead of failing: such a value is caught here, or it would fail the whole task at the sink.
        self.decimals = {f["name"]: found for f in fields if (found := _decimal(f["type"])) is not None}
        self.reader = parse_schema(json.loads(fmt.reader_schema or "{}"))
        plain_writer = fmt.writer_schema or fmt.reader_schema or "{}"
        self.plain_writer = parse_schema(json.loads(plain_writer))
        self.plain_is_reader = fmt.writer_schema is None or fmt.writer_schema == fmt.reader_schema
        if fmt.wire == "registry" and registry is None:
            raise ConfigError(
                "format.wire='registry' needs a schema registry: set ONCEFLOW_SCHEMA_REGISTRY_URL "
                "(http(s):// for a registry server, file:///folder for a folder of schemas)"
            )
        # Ids whose schema this decoder could not use, with the reason: asked once, not once per record.
        self._rejected: dict[int, tuple[str, str]] = {}

    def values(self, value: bytes) -> list[Any]:
        """The reader schema's field values of one record value; `AvroReject` when it has none."""
        if self.fmt.wire == "plain":
            return self._read(
                value, self.plain_writer, None if self.plain_is_reader else self.reader, "of the format"
            )
        if len(value) < 1 or value[0] != MAGIC_BYTE:
            found = f"0x{value[0]:02x}" if value else "an empty value"
            raise AvroReject("bad_magic_byte", f"expected 0x00 then a 4-byte schema id, found {found}")
        if len(value) < WIRE_HEADER.size:
            raise AvroReject("malformed_avro", f"{len(value)} bytes, shorter than the 5-byte header")
        _, schema_id = WIRE_HEADER.unpack_from(value)
        writer = self._writer(schema_id)
        return self._read(memoryview(value)[WIRE_HEADER.size :], writer, self.reader, f"id {schema_id}")

    def _writer(self, schema_id: int) -> Any:
        parsed = self._writers.get(schema_id)
        if parsed is None and self.cache_key is not None:
            parsed = _WRITERS.get((self.cache_key, schema_id))
        if parsed is not None:
            return parsed
        if schema_id in self._rejected:
            raise AvroReject(*self._rejected[schema_id])
        assert self.registry is not None
        try:
            text = self.registry.schema_by_id(schema_id)  # RegistryUnavailable propagates: the epoch aborts
        except SchemaNotFound as exc:
            self._rejected[schema_id] = (
                "unknown_schema_id",
                f"the schema registry has no schema id {schema_id}",
            )
            raise AvroReject(*self._rejected[schema_id]) from exc
        from fastavro import parse_schema

        try:
            parsed = parse_schema(json.loads(text))
        except Exception as exc:  # a registry may hold a schema fastavro cannot use
            detail = f"writer schema id {schema_id} is not a usable Avro schema ({_short(exc)})"
            self._rejected[schema_id] = ("incompatible_schema", detail)
            raise AvroReject(*self._rejected[schema_id]) from exc
        self._writers[schema_id] = parsed
        if self.cache_key is not None:
            _WRITERS[(self.cache_key, schema_id)] = parsed
        return parsed

    def _read(self, body: bytes | memoryview, writer: Any, reader: Any, which: str) -> list[Any]:
        from fastavro import schemaless_reader
        from fastavro.read import SchemaResolutionError

        stream = io.BytesIO(body)
        try:
            record = schemaless_reader(stream, writer, reader)
        except SchemaResolutionError as exc:
            raise self._resolution_failure(bytes(body), writer, which, exc) from exc
        except UnicodeDecodeError as exc:
            raise AvroReject(
                "malformed_avro", f"writer schema {which}: a string is not UTF-8 ({exc.reason})"
            ) from exc
        except Exception as exc:  # EOF, bad lengths, bad union indexes: the body is not this schema's
            # fastavro's messages for an empty body differ by the field type read first (EOFError, or
            # "cannot read double from <stream>"): one reason for all of them.
            detail = "the body is empty" if not len(body) else f"body does not decode ({_short(exc)})"
            raise AvroReject("malformed_avro", f"writer schema {which}: {detail}") from exc
        left = len(body) - stream.tell()
        if left:
            raise AvroReject("malformed_avro", f"writer schema {which}: {left} bytes left after the record")
        if not isinstance(record, dict):
            raise AvroReject("incompatible_schema", f"writer schema {which} does not write a record")
        values = []
        for name in self.names:
            field = record.get(name)
            if field is None and name in self.required:
                raise AvroReject("null_field", f"field {name!r} is null, and the reader schema requires it")
            if field is not None and name in self.decimals:
                _check_decimal(name, field, *self.decimals[name])
            values.append(str(field) if name in self.uuids and field is not None else field)
        return values

    def _resolution_failure(self, body: bytes, writer: Any, which: str, exc: Exception) -> AvroReject:
        """Why the writer's record could not be read with the reader schema: a null where the reader
        requires a value (the writer's field is nullable, the reader's is not), or schemas that do not
        resolve at all."""
        from fastavro import schemaless_reader

        try:
            written = schemaless_reader(io.BytesIO(body), writer, None)
        except Exception as inner:
            return AvroReject(
                "malformed_avro", f"writer schema {which}: body does not decode ({_short(inner)})"
            )
        if isinstance(written, dict):
            for name in self.names:
                if name in self.required and name in written and written[name] is None:
                    return AvroReject(
                        "null_field",
                        f"field {name!r} is null (writer schema {which}), the reader schema requires it",
                    )
        return AvroReject(
            "incompatible_schema",
            f"writer schema {which} does not resolve to the reader schema ({_short(exc)})",
        )


def _decimal(avro_type: Any) -> tuple[int, int] | None:
    """(precision, scale) of a decimal type, or of the decimal branch of a union; None otherwise."""
    if isinstance(avro_type, list):
        return next((found for branch in avro_type if (found := _decimal(branch)) is not None), None)
    if isinstance(avro_type, dict) and avro_type.get("logicalType") == "decimal":
        return int(avro_type["precision"]), int(avro_type.get("scale", 0))
    return None


def _check_decimal(name: str, value: Any, precision: int, scale: int) -> None:
    """A decoded decimal keeps its scale as its exponent and at most ``precision`` digits, unless
    fastavro rounded an unscaled value too wide for the type (then the exponent moved)."""
    _, digits, exponent = value.as_tuple()
    if exponent != -scale or len(digits) > precision:
        raise AvroReject(
            "malformed_avro",
            f"field {name!r}: the unscaled value has more digits than decimal({precision},{scale}) holds",
        )


def _is_uuid(avro_type: Any) -> bool:
    if isinstance(avro_type, list):
        return any(_is_uuid(branch) for branch in avro_type)
    return isinstance(avro_type, dict) and avro_type.get("logicalType") == "uuid"


# An object's repr in an exception message ("<_io.BytesIO object at 0x7f…>"): its address differs between
# processes, and a dead letter's reason must not, so that a replay or the other decoder gives the same one.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")


def _short(exc: BaseException) -> str:
    text = _ADDRESS.sub("", " ".join(str(exc).split())) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
