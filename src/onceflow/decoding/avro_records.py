"""Avro record values decoded into row values, with fastavro, or rejected with a dead-letter reason.

Runs wherever records are decoded (the local executor, spark-submit tasks, the warm runtime's Python
workers), so it imports nothing of the ledger or the coordinator. Writer schemas are looked up by id
once per process (`_WRITERS`): a registry round trip per record would cost more than the decode.
An id the registry refused is remembered too (`_FAILED`, bounded, for a while), and each decoder asks the
registry at most `MAX_LOOKUPS_PER_TASK` times: a flood of distinct unknown ids, from a broken or hostile
producer, costs a few calls, and its records become dead letters with their reason.
Avro's schema resolution (fields added with a default, fields removed, int widened to long or float
to double) is fastavro's; what this module adds is telling apart why a record could not be read.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from onceflow.decoding.debezium import OPS, UPSERTS
from onceflow.decoding.schema_registry import (
    MAGIC_BYTE,
    WIRE_HEADER,
    SchemaNotFound,
    SchemaRegistry,
    registry_at,
)
from onceflow.errors import ConfigError
from onceflow.pipeline import AvroFormat, Pipeline
from onceflow.schemas.avro import avro_fields, envelope_row_schema
from onceflow.schemas.types import Array, Map, SchemaType, Struct, field_path, key_path

# Turns fastavro's value at a path into the row's (a uuid as its text), or refuses it with `AvroReject`.
_Fixer = Callable[[str, Any], Any]

# Parsed writer schemas by (registry's cache key, id), for this process: ids are immutable in a registry.
_WRITERS: dict[tuple[str, int], Any] = {}
# Ids the registry refused (unknown, or not a usable schema), by (cache key, id), with their reason and
# when they were refused, for this process: at most `MAX_FAILED_IDS`, the oldest forgotten first, each
# for `FAILED_ID_TTL_S` (a registry may learn an id later, e.g. a replica catching up).
_FAILED: OrderedDict[tuple[str, int], tuple[float, tuple[str, str]]] = OrderedDict()
_FAILED_LOCK = threading.Lock()
MAX_FAILED_IDS = 10_000
FAILED_ID_TTL_S = 300.0
# Registry calls one decoder (one task) makes at most: a topic has a handful of writer schemas, so more
# distinct ids than this in one task is a flood; its records past the cap are dead letters
# (``unknown_schema_id``, saying that the id was not looked up).
MAX_LOOKUPS_PER_TASK = 64
# One registry client per URL and process, so every task of a Python worker shares one.
_REGISTRIES: dict[tuple[str, bool], SchemaRegistry] = {}


def registry_for(url: str | None, allow_insecure_auth: bool = False) -> SchemaRegistry | None:
    """This process's client of the registry at ``url`` (see `schema_registry.registry_at`)."""
    if url is None:
        return None
    key = (url, allow_insecure_auth)
    if key not in _REGISTRIES:
        made = registry_at(url, allow_insecure_auth)
        assert made is not None  # a URL always names a registry
        _REGISTRIES[key] = made
    return _REGISTRIES[key]


def pinned(spec: Pipeline, registry_url: str | None, allow_insecure_auth: bool = False) -> Pipeline:
    """``spec`` with its Avro subject's latest schema as the reader schema, for one slice: every task of
    the slice then reads with the same schema, whatever the subject gets meanwhile. Other specs as given.
    """
    fmt = spec.format
    if not isinstance(fmt, AvroFormat) or fmt.pinned:
        return spec
    registry = registry_for(registry_url, allow_insecure_auth)
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
        fmt.columns()  # a format not pinned yet fails here, by name
        reader_json = json.loads(fmt.reader_schema or "{}")
        # Change events: the reader schema is their envelope, a row is its before or after record.
        self.changes = fmt.changes
        row_json = envelope_row_schema("format.reader_schema", reader_json) if self.changes else reader_json
        self.types: dict[str, SchemaType] = dict(avro_fields("format.reader_schema", row_json))
        self.names = list(self.types)
        self.required = {name for name, t in self.types.items() if not t.nullable}
        # What fastavro's values need before they are the row's, at any depth: a uuid's text, and a
        # decimal's check (fastavro rounds a decimal with more digits than its precision instead of
        # failing: such a value is caught here, or it would fail the whole task at the sink).
        self.fixers = [_fixer(field["type"]) for field in row_json["fields"]]
        self.reader = parse_schema(reader_json)
        plain_writer = fmt.writer_schema or fmt.reader_schema or "{}"
        self.plain_writer = parse_schema(json.loads(plain_writer))
        self._plain_refused = _refused_writer(json.loads(plain_writer), "of the format")
        self.plain_is_reader = fmt.writer_schema is None or fmt.writer_schema == fmt.reader_schema
        if fmt.wire == "registry" and registry is None:
            raise ConfigError(
                "format.wire='registry' needs a schema registry: set ONCEFLOW_SCHEMA_REGISTRY_URL "
                "(http(s):// for a registry server, file:///folder for a folder of schemas)"
            )
        # Ids whose schema this decoder could not use, with the reason: asked once, not once per record.
        self._rejected: dict[int, tuple[str, str]] = {}
        self.lookups = 0  # registry calls made by this decoder, at most `MAX_LOOKUPS_PER_TASK`

    def values(self, value: bytes) -> list[Any]:
        """The reader schema's field values of one record value; `AvroReject` when it has none."""
        return self._row(self._decoded(value))

    def _decoded(self, value: bytes) -> dict[str, Any]:
        """One record value as the reader schema's record."""
        if self.fmt.wire == "plain":
            if self._plain_refused is not None:
                raise AvroReject(*self._plain_refused)
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

    def change_values(self, key: bytes | None, value: bytes | None) -> list[Any]:
        """A Debezium change event's row (`onceflow.decoding.debezium`): the row record's fields, then
        the op. An upsert's row is its ``after``; a delete's (or a tombstone's) its key and nulls, the
        key from ``before`` or else from the record key (Avro of the registry's key subject); a
        truncate's all nulls."""
        assert self.changes is not None
        op: str = "d"
        image: Any = None
        if value is not None:
            envelope = self._decoded(value)
            found_op = envelope.get("op")
            if not isinstance(found_op, str) or found_op not in OPS:
                raise AvroReject("malformed_change", f"op {str(found_op)[:40]!r} is not one of {sorted(OPS)}")
            op = found_op
            image = envelope.get("after") if op in UPSERTS else envelope.get("before")
            if op in UPSERTS and not isinstance(image, dict):
                raise AvroReject("malformed_change", f"op {op!r} without an 'after' record")
        if op == "t":
            return [None] * len(self.names) + [op]
        record_key = self._key_record(key) if not self.changes.key or image is None else None
        keys = self.changes.key or tuple(record_key or ())
        if not keys:
            raise AvroReject("missing_key", f"a {OPS[op]} without a record key, and no key fields are named")
        values: list[Any] = []
        for name, fixer in zip(self.names, self.fixers, strict=True):
            if op not in UPSERTS and name not in keys:
                values.append(None)
                continue
            found = (image or {}).get(name)
            if found is None and record_key is not None:
                found = record_key.get(name)
            if found is not None and fixer is not None:
                found = fixer(name, found)
            values.append(found)
        missing = [name for name, v in zip(self.names, values, strict=True) if name in keys and v is None]
        if missing:
            raise AvroReject("missing_key", f"a {OPS[op]} without a value for key field(s) {missing}")
        return [*values, op]

    def _key_record(self, key: bytes | None) -> dict[str, Any] | None:
        """The record key's fields, where it is Avro in the registry's wire format (Debezium's)."""
        from fastavro import schemaless_reader

        if key is None or self.registry is None or len(key) < WIRE_HEADER.size or key[0] != MAGIC_BYTE:
            return None
        _, schema_id = WIRE_HEADER.unpack_from(key)
        try:
            schema = self._writer(schema_id)  # cached and capped as the values' writer schemas are
        except AvroReject as rejected:
            if rejected.reason.startswith("unknown_schema_id:"):
                return None
            raise
        try:
            record = schemaless_reader(io.BytesIO(key[WIRE_HEADER.size :]), schema, None)
        except Exception as exc:  # the key does not decode with its own writer schema
            raise AvroReject("malformed_change", f"the key does not decode ({_short(exc)})") from exc
        return record if isinstance(record, dict) else None

    def _writer(self, schema_id: int) -> Any:
        parsed = self._writers.get(schema_id)
        if parsed is None and self.cache_key is not None:
            parsed = _WRITERS.get((self.cache_key, schema_id))
        if parsed is not None:
            return parsed
        refused = self._rejected.get(schema_id) or self._failed_before(schema_id)
        if refused is not None:
            self._rejected[schema_id] = refused
            raise AvroReject(*refused)
        if self.lookups >= MAX_LOOKUPS_PER_TASK:
            raise AvroReject(
                "unknown_schema_id",
                f"schema id {schema_id} not looked up: this task already asked the schema registry "
                f"for {MAX_LOOKUPS_PER_TASK} ids, the most one task asks",
            )
        assert self.registry is not None
        self.lookups += 1
        try:
            text = self.registry.schema_by_id(schema_id)  # RegistryUnavailable propagates: the epoch aborts
        except SchemaNotFound as exc:
            refused = ("unknown_schema_id", f"the schema registry has no schema id {schema_id}")
            self._refuse(schema_id, refused)
            raise AvroReject(*refused) from exc
        from fastavro import parse_schema

        try:
            written = json.loads(text)
            parsed = parse_schema(written)
        except Exception as exc:  # a registry may hold a schema fastavro cannot use
            detail = f"writer schema id {schema_id} is not a usable Avro schema ({_short(exc)})"
            refused = ("incompatible_schema", detail)
            self._refuse(schema_id, refused)
            raise AvroReject(*refused) from exc
        refused = _refused_writer(written, f"id {schema_id}")
        if refused is not None:
            self._refuse(schema_id, refused)
            raise AvroReject(*refused)
        self._writers[schema_id] = parsed
        if self.cache_key is not None:
            _WRITERS[(self.cache_key, schema_id)] = parsed
        return parsed

    def _failed_before(self, schema_id: int) -> tuple[str, str] | None:
        """Why this process's registry refused ``schema_id`` lately, if it did."""
        if self.cache_key is None:
            return None
        key = (self.cache_key, schema_id)
        with _FAILED_LOCK:
            found = _FAILED.get(key)
            if found is None:
                return None
            if time.monotonic() - found[0] > FAILED_ID_TTL_S:
                del _FAILED[key]
                return None
            return found[1]

    def _refuse(self, schema_id: int, reason: tuple[str, str]) -> None:
        """Remember a refused id in this decoder and, bounded, in this process."""
        self._rejected[schema_id] = reason
        if self.cache_key is None:
            return
        with _FAILED_LOCK:
            _FAILED[(self.cache_key, schema_id)] = (time.monotonic(), reason)
            _FAILED.move_to_end((self.cache_key, schema_id))
            while len(_FAILED) > MAX_FAILED_IDS:
                _FAILED.popitem(last=False)

    def _read(self, body: bytes | memoryview, writer: Any, reader: Any, which: str) -> dict[str, Any]:
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
        return record

    def _row(self, record: dict[str, Any]) -> list[Any]:
        """The reader schema's field values of a decoded record, fixed as the row holds them."""
        values = []
        for name, fixer in zip(self.names, self.fixers, strict=True):
            field = record.get(name)
            if field is None:
                if name in self.required:
                    raise AvroReject(
                        "null_field", f"field {name!r} is null, and the reader schema requires it"
                    )
            elif fixer is not None:
                field = fixer(name, field)
            values.append(field)
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
            for name, t in self.types.items():
                found = _null_at(name, written[name], t) if name in written else None
                if found is not None:
                    return AvroReject(
                        "null_field",
                        f"field {found!r} is null (writer schema {which}), the reader schema requires it",
                    )
        place = _unresolved_place(written, writer, self.reader)
        at = "" if place is None else f" at field {place!r}"
        return AvroReject(
            "incompatible_schema",
            f"writer schema {which} does not resolve to the reader schema{at} ({_short(exc)})",
        )


def _refused_writer(schema: Any, which: str) -> tuple[str, str] | None:
    """Why no body of the writer ``schema`` is read, if one is: it has an array of items that take no
    bytes, whose count only the body's block counts give, unbounded by its length (fastavro allocates or
    loops over 2^60 items of a few bytes). Other collections are bounded: every item, or map key, takes a
    byte, so a count past the body ends at its end."""
    try:
        found = _endless_array(schema)
    except RecursionError:
        return ("incompatible_schema", f"writer schema {which} is nested too deeply to check: not read")
    if found is None:
        return None
    path, shown = found
    return (
        "incompatible_schema",
        f"writer schema {which}: the array at field {path!r} holds items of no width ({shown}), which a "
        "few bytes can make endless: not read",
    )


def _endless_array(schema: Any) -> tuple[str, str] | None:
    """The path and item type of the first array in ``schema`` (Avro JSON) whose items take no bytes: a
    null, a fixed of size 0, a record of no fields or of such fields only."""
    named: dict[str, Any] = {}

    def define(t: dict[str, Any]) -> None:
        name = t.get("name")
        if isinstance(name, str):
            named[name] = named[name.rpartition(".")[2]] = t
            namespace = t.get("namespace")
            if isinstance(namespace, str) and namespace:
                named[f"{namespace}.{name}"] = t

    def empty(t: Any, seen: tuple[int, ...]) -> bool:
        if isinstance(t, str):
            return t == "null" or (t in named and empty(named[t], seen))
        if not isinstance(t, dict) or id(t) in seen:  # a union takes its branch's index; recursion: no
            return False
        kind = t.get("type")
        if kind in ("record", "error", "fixed", "enum"):
            define(t)
        if kind == "fixed":
            return t.get("size") == 0
        if kind in ("record", "error"):
            fields = t.get("fields") or []
            return all(isinstance(f, dict) and empty(f.get("type"), (*seen, id(t))) for f in fields)
        return kind == "null" or (isinstance(kind, dict | list) and empty(kind, seen))

    def shown(t: Any) -> str:
        if isinstance(t, str) and t in named:
            t = named[t]
        if isinstance(t, dict) and isinstance(t.get("type"), str) and "name" in t:
            return f"{t['type']} {t['name']}"
        return "null"

    def walk(t: Any, path: str) -> tuple[str, str] | None:
        if isinstance(t, list):
            return next((found for branch in t if (found := walk(branch, path))), None)
        if not isinstance(t, dict):
            return None
        kind = t.get("type")
        if kind in ("record", "error", "fixed", "enum"):
            define(t)
        if kind in ("record", "error"):
            for f in t.get("fields") or []:
                if isinstance(f, dict) and isinstance(f.get("name"), str):
                    inner = f["name"] if not path else field_path(path, f["name"])
                    if found := walk(f.get("type"), inner):
                        return found
            return None
        if kind == "array":
            items = t.get("items")
            return (path, shown(items)) if empty(items, ()) else walk(items, f"{path}[]")
        if kind == "map":
            return walk(t.get("values"), f"{path}[]")
        return walk(kind, path) if isinstance(kind, dict | list) else None

    return walk(schema, "")


def _null_at(path: str, value: Any, t: SchemaType) -> str | None:
    """The path of the first null the writer wrote where the reader's type ``t`` requires a value."""
    if value is None:
        return None if t.nullable else path
    if isinstance(t, Struct) and isinstance(value, dict):
        for name, inner in t.fields:
            if name in value and (found := _null_at(field_path(path, name), value[name], inner)):
                return found
    elif isinstance(t, Array) and isinstance(value, list):
        for index, item in enumerate(value):
            if found := _null_at(f"{path}[{index}]", item, t.element):
                return found
    elif isinstance(t, Map) and isinstance(value, dict):
        for key, item in value.items():
            if found := _null_at(key_path(path, key), item, t.value):
                return found
    return None


def _unresolved_place(written: Any, writer: Any, reader: Any) -> str | None:
    """The path of the value at which fastavro's resolution of ``writer`` (the record as written,
    ``written``) to ``reader`` failed: the first value, in the order fastavro reads them, whose writer
    type does not match the reader's (``items[0].qty``, ``counts`` for a map whose value types differ),
    or the reader field that the writer lacks and that has no default. None when it cannot be told.
    Both are parsed schemas; the match is fastavro's own."""
    from fastavro import _read_py

    # fastavro's own test of whether a writer type resolves to a reader type (untyped, hence Any).
    match_schemas: Callable[..., Any] = _read_py.match_schemas
    match_types: Callable[..., Any] = _read_py.match_types
    named = {"writer": writer.get("__named_schemas", {}), "reader": reader.get("__named_schemas", {})}

    def resolved(t: Any, side: str) -> Any:
        return named[side].get(t, t) if isinstance(t, str) else t

    def walk(path: str, value: Any, w: Any, r: Any) -> str | None:
        w, r = resolved(w, "writer"), resolved(r, "reader")
        if isinstance(w, list):  # the branch the value was written with
            w = resolved(_written_branch(value, w), "writer")
            if w is None:
                return None
        if isinstance(r, list):  # fastavro reads with the first reader branch the writer's type matches
            r = resolved(next((b for b in r if match_types(w, b, named)), None), "reader")
            if r is None:
                return path
        if match_schemas(w, r, named, raise_on_error=False) is None:
            return path
        kind = w.get("type") if isinstance(w, dict) else w
        if kind == "record" and isinstance(value, dict) and isinstance(r, dict):
            unread = {f["name"]: f for f in r["fields"]}
            aliases = {alias: f for f in r["fields"] for alias in f.get("aliases", ())}
            for field in w["fields"]:
                read = unread.get(field["name"]) or aliases.get(field["name"])
                if read is None:
                    continue  # skipped
                unread.pop(read["name"], None)
                inner = field_path(path, read["name"]) if path else read["name"]
                if (found := walk(inner, value.get(field["name"]), field["type"], read["type"])) is not None:
                    return found
            missing = [name for name, f in unread.items() if "default" not in f]
            if missing:
                return field_path(path, missing[0]) if path else missing[0]
        if kind == "array" and isinstance(value, list) and isinstance(r, dict):
            for index, item in enumerate(value):
                if (found := walk(f"{path}[{index}]", item, w["items"], r["items"])) is not None:
                    return found
        if kind == "map" and isinstance(value, dict) and isinstance(r, dict):
            for key, item in value.items():
                if (found := walk(key_path(path, key), item, w["values"], r["values"])) is not None:
                    return found
        return None

    if not isinstance(written, dict):
        return None
    try:
        top = walk("", written, writer, reader)
    except Exception:  # a schema this walk does not follow: the reason goes without a place
        return None
    return top or None


def _written_branch(value: Any, union: list[Any]) -> Any:
    """The branch of a writer's union that ``value`` was written with (None: not told apart)."""
    if value is None:
        return "null" if "null" in union else None
    branches = [b for b in union if b != "null"]
    if len(branches) == 1:
        return branches[0]
    from fastavro.validation import validate

    for branch in branches:
        try:
            if validate(value, branch, raise_errors=False):
                return branch
        except Exception:  # a branch naming a type defined elsewhere in the schema
            continue
    return None


def _fixer(avro_type: Any) -> _Fixer | None:
    """What a value of ``avro_type`` needs before it is the row's (None: nothing, the common case)."""
    if isinstance(avro_type, list):  # ["null", T]: a null stays null
        inner = next((f for b in avro_type if b != "null" and (f := _fixer(b)) is not None), None)
        return None if inner is None else (lambda path, value: None if value is None else inner(path, value))
    if not isinstance(avro_type, dict):
        return None
    if avro_type.get("logicalType") == "uuid":
        return lambda path, value: str(value)
    if avro_type.get("logicalType") == "decimal" and avro_type.get("type") in ("bytes", "fixed"):
        precision, scale = int(avro_type["precision"]), int(avro_type.get("scale", 0))
        return lambda path, value: _check_decimal(path, value, precision, scale)
    kind = avro_type.get("type")
    if kind == "record":
        fields = [(f["name"], fixer) for f in avro_type["fields"] if (fixer := _fixer(f["type"])) is not None]
        return None if not fields else lambda path, value: _fix_record(path, value, fields)
    if kind == "array":
        item = _fixer(avro_type.get("items"))
        if item is None:
            return None
        return lambda path, value: [item(f"{path}[{i}]", x) for i, x in enumerate(value)]
    if kind == "map":
        each = _fixer(avro_type.get("values"))
        if each is None:
            return None
        return lambda path, value: {k: each(key_path(path, k), x) for k, x in value.items()}
    return None


def _fix_record(path: str, value: dict[str, Any], fields: list[tuple[str, _Fixer]]) -> dict[str, Any]:
    for name, fixer in fields:
        if value.get(name) is not None:
            value[name] = fixer(field_path(path, name), value[name])
    return value


def _check_decimal(path: str, value: Any, precision: int, scale: int) -> Any:
    """A decoded decimal keeps its scale as its exponent and at most ``precision`` digits, unless
    fastavro rounded an unscaled value too wide for the type (then the exponent moved)."""
    _, digits, exponent = value.as_tuple()
    if exponent != -scale or len(digits) > precision:
        raise AvroReject(
            "malformed_avro",
            f"field {path!r}: the unscaled value has more digits than decimal({precision},{scale}) holds",
        )
    return value


# An object's repr in an exception message ("<_io.BytesIO object at 0x7f…>"): its address differs between
# processes, and a dead letter's reason must not, so that a replay or the other decoder gives the same one.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")


def _short(exc: BaseException) -> str:
    text = _ADDRESS.sub("", " ".join(str(exc).split())) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
