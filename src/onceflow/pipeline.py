"""The pipeline spec: what users write in Python, and what travels to spark-submit and into the ledger.

Every field is checked when the spec is built, so a typo fails in the user's editor or at DAG parse time
with a `ConfigError` naming the field, not halfway through an epoch. The spec is plain data: the transform
is a dotted path (``module:function``) resolved only where it runs, so building a spec never imports
PySpark, and `to_dict`/`from_dict` carry it as JSON to the Spark job and the ledger.
"""

from __future__ import annotations

import importlib
import json
import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias, cast

from onceflow.errors import ConfigError, one_line
from onceflow.schemas.avro import avro_columns, envelope_row_schema, parse_schema_text
from onceflow.schemas.types import INTERNAL, Primitive, Sugar, from_sugar, render, walk
from onceflow.schemas.types import nullable as nullable  # next to JsonFormat, for its sugar

Guarantee: TypeAlias = Literal["exactly_once", "at_least_once", "at_most_once"]
OnMissingOffsets: TypeAlias = Literal["fail", "skip"]
OnRerun: TypeAlias = Literal["skip", "replace"]
AvroWire: TypeAlias = Literal["registry", "plain"]
Starting: TypeAlias = Literal["earliest", "latest"] | int

GUARANTEES: tuple[str, ...] = ("exactly_once", "at_least_once", "at_most_once")
ON_MISSING_OFFSETS: tuple[str, ...] = ("fail", "skip")
ON_RERUN: tuple[str, ...] = ("skip", "replace")
# How Avro values are framed: the schema registry's (magic byte 0, 4-byte schema id, body) or bare bodies.
AVRO_WIRES: tuple[str, ...] = ("registry", "plain")
# JSON field types a schema may declare (`onceflow.schemas.types` has the grammar); a trailing "?" makes
# a value nullable (null, or for a field also absent), at any depth.
FIELD_TYPES: tuple[str, ...] = (
    "string",
    "int",
    "float",
    "bool",
    "bytes",
    "date",
    "timestamp",
    "timestamp_ms",
    "timestamp_us",
    "decimal(p,s)",
    "json",
    "struct<name:T,...>",
    "array<T>",
    "map<string,T>",
)
# Columns every decoded row carries, so sinks can deduplicate or trace a row back to its record.
METADATA_COLUMNS: tuple[str, ...] = ("_topic", "_partition", "_offset", "_timestamp")
# The column a change stream's rows carry their op in (`Debezium`): c, u, r, d or t.
OP_COLUMN = "_op"
DECIMAL_HANDLINGS: tuple[str, ...] = ("precise", "string")
# Reducers keyed state folds with: associative, so epoch n's rows fold into the state of epoch n-1.
BUILTIN_REDUCERS: tuple[str, ...] = ("count", "sum", "min", "max")
# The participant name of a stateful pipeline's state snapshot; no user sink may take it.
STATE_SINK = "onceflow_state"
_DOTTED_KIND = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

SPEC_VERSION = 1

# Names end up in Kafka transactional ids, PostgreSQL gids and Airflow dag ids, which all accept this.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# A pipeline's name is shorter still: every DAG of it carries the tag ``onceflow:<name>``, by which the
# epochs console finds it, and Airflow refuses a tag over 100 characters.
PIPELINE_NAME_CHARS = 100 - len("onceflow:")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*$")


def _fail(where: str, value: object, expected: str) -> ConfigError:
    return ConfigError(f"{where}={value!r}: {expected}")


def _positive_int(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(where, value, "expected an integer >= 1")
    return value


def _frozen_json(where: str, value: object) -> Mapping[str, Any]:
    """A read-only deep copy of a JSON object, so that the spec can round-trip and never changes; keys keep
    their order (declared `columns` are the table's columns in that order)."""
    if not isinstance(value, Mapping):
        raise _fail(where, value, "expected a mapping")
    try:
        copied = json.loads(json.dumps(dict(value)))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: must be JSON-serializable ({exc})") from exc
    return MappingProxyType(copied)


def _check_dotted(where: str, value: object) -> str:
    if not isinstance(value, str) or not _DOTTED.match(value):
        raise _fail(where, value, "expected a dotted path 'package.module:attribute'")
    return value


def import_dotted(path: str) -> Any:
    """Resolve ``package.module:attribute`` (attribute may itself be dotted), with a clear error."""
    _check_dotted("path", path)
    module_name, _, attr_path = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{path!r}: cannot import module {module_name!r} ({exc}); is its folder on PYTHONPATH?"
        ) from exc
    except SyntaxError as exc:
        raise ConfigError(
            f"{path!r}: module {module_name!r} has a syntax error at {exc.filename}:{exc.lineno}: {exc.msg}"
        ) from exc
    except Exception as exc:  # the module itself raised while being imported
        raise ConfigError(
            f"{path!r}: importing module {module_name!r} raised {type(exc).__name__}: {one_line(exc)} "
            f"(at {raised_at(exc)})"
        ) from exc
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            raise ConfigError(f"{path!r}: {module_name!r} has no attribute {attr_path!r}") from exc
    return obj


def raised_at(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback outside the import machinery: the
    line of the user's code that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename] or frames
    return f"{own[-1].filename}:{own[-1].lineno}" if own else "an unknown place"


@dataclass(frozen=True)
class KafkaSource:
    """The topics a pipeline reads, and where a pipeline that has never committed starts.

    ``starting`` applies to topics without any committed position: "earliest", "latest" or a timestamp in
    ms (the first offset at or after it). Partitions added later to a topic that is already being read
    start at their earliest offset, so that nothing written to them is skipped.
    ``on_missing_offsets`` decides what happens when retention deleted offsets that the pipeline still
    has to read: "fail" (default) stops the pipeline with `OffsetsLost`; "skip" resumes at the earliest
    available offset and reports how many offsets were skipped.
    """

    topics: tuple[str, ...]
    starting: Starting = "earliest"
    on_missing_offsets: OnMissingOffsets = "fail"

    def __post_init__(self) -> None:
        topics = self.topics
        if isinstance(topics, str) or not isinstance(topics, Iterable):
            raise _fail("source.topics", topics, "expected a list of topic names")
        topics = tuple(topics)
        if not topics:
            raise _fail("source.topics", list(topics), "expected at least one topic")
        for topic in topics:
            if not isinstance(topic, str) or not _TOPIC.match(topic):
                raise _fail("source.topics", topic, "not a valid Kafka topic name ([A-Za-z0-9._-], 1-249)")
        duplicates = sorted({t for t in topics if topics.count(t) > 1})
        if duplicates:
            raise _fail("source.topics", duplicates, "topics listed more than once")
        object.__setattr__(self, "topics", topics)
        starting = self.starting
        if isinstance(starting, bool) or not (
            starting in ("earliest", "latest") or (isinstance(starting, int) and starting >= 0)
        ):
            raise _fail(
                "source.starting", starting, "expected 'earliest', 'latest' or a timestamp in ms >= 0"
            )
        if self.on_missing_offsets not in ON_MISSING_OFFSETS:
            raise _fail(
                "source.on_missing_offsets", self.on_missing_offsets, f"expected one of {ON_MISSING_OFFSETS}"
            )


@dataclass(frozen=True)
class Debezium:
    """The records are Debezium change events (JSON, with or without the converter's schema wrapper)
    whose row images have the format's schema; each row gets the event's op in `OP_COLUMN` (``c``
    insert, ``u`` update, ``r`` snapshot read, ``d`` delete, ``t`` truncate).

    ``key``: the fields that identify a row (default: the record key's own fields, Debezium's primary
    key). ``decimals``: Debezium's ``decimal.handling.mode`` where events carry no schema (``precise``,
    its default, writes base64; ``string`` numeric text); with the wrapper the schema says. A delete's
    row holds its key and nulls; a tombstone is a delete of its key. Every field of such a row may be
    null, the key's aside.

    ``transactions``: Debezium's transaction topic (``<topic.prefix>.transaction``, written with the
    connector's ``provide.transaction.metadata=true``). Each epoch then ends between source
    transactions, so a sink that applies an epoch at once never shows half of one
    (`onceflow.protocol.transaction_cuts`).
    """

    key: tuple[str, ...] = ()
    decimals: str = "precise"
    transactions: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.key, str) or not all(isinstance(k, str) and k for k in self.key):
            raise _fail("format.changes.key", self.key, "expected a tuple of field names")
        object.__setattr__(self, "key", tuple(self.key))
        if self.decimals not in DECIMAL_HANDLINGS:
            raise _fail("format.changes.decimals", self.decimals, f"expected one of {DECIMAL_HANDLINGS}")
        if self.transactions is not None and (
            not isinstance(self.transactions, str) or not _TOPIC.match(self.transactions)
        ):
            raise _fail(
                "format.changes.transactions", self.transactions, "expected the transaction topic's name"
            )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"envelope": "debezium", "key": list(self.key), "decimals": self.decimals}
        if self.transactions is not None:
            out["transactions"] = self.transactions
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Debezium:
        _check_keys(
            "format.changes", data, required={"envelope"}, optional={"key", "decimals", "transactions"}
        )
        if data["envelope"] != "debezium":
            raise _fail("format.changes.envelope", data["envelope"], "expected 'debezium'")
        return cls(
            key=tuple(data.get("key") or ()),
            decimals=data.get("decimals", "precise"),
            transactions=data.get("transactions"),
        )


@dataclass(frozen=True)
class JsonFormat:
    """Record values are JSON objects with a declared schema: {field: type}.

    A type is a text of `onceflow.schemas.types`' grammar ("int?", "timestamp", "decimal(10,2)",
    "array<string>", "struct<ip:string?>?", ...) or JSON-shaped sugar: a dict is a required struct of its
    fields, a one-element list a required array of its element (``{"items": [{"sku": "string"}]}``);
    `nullable` makes sugar nullable. A type ending in "?" is nullable (the field may be null or absent).
    Every field is kept as its canonical text, so ``schema`` stays ``{name: text}``, travels as it is,
    and a flat schema reads exactly as written. Fields not in the schema are dropped, at every depth.
    JSON has no time or decimal values, so these read text or integers: ``timestamp`` ISO-8601 text with
    its offset or Z, ``timestamp_ms``/``timestamp_us`` epoch integers (all three a UTC ``timestamp``
    column), ``date`` ``YYYY-MM-DD``, ``decimal(p,s)`` a number or numeric text kept exactly (one with
    more digits than the type holds is a dead letter, never rounded), ``bytes`` base64 text, ``json``
    any value as its canonical JSON text.
    ``key_field``, when set, is the row column that receives the record's key as UTF-8 text; records
    without a key are then dead-lettered rather than given an empty key.
    ``changes``: the records are change events (`Debezium`) and the schema is their rows'.
    """

    schema: Mapping[str, str] = field(hash=False)
    key_field: str | None = None
    changes: Debezium | None = None

    def __init__(
        self, schema: Mapping[str, Sugar], key_field: str | None = None, changes: Debezium | None = None
    ) -> None:
        # A hand-written __init__ only to type ``schema`` as what users may give (sugar); what is kept
        # is always {name: canonical text}.
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "key_field", key_field)
        object.__setattr__(self, "changes", changes)
        self.__post_init__()

    def __post_init__(self) -> None:
        if not isinstance(self.schema, Mapping) or not self.schema:
            raise _fail("format.schema", self.schema, "expected a non-empty mapping of field name to type")
        canonical: dict[str, str] = {}
        for name, declared in self.schema.items():
            where = f"format.schema[{name!r}]"
            if not isinstance(name, str) or not name:
                raise _fail("format.schema", name, "field names must be non-empty strings")
            if name in METADATA_COLUMNS:
                raise _fail(where, declared, f"field name is reserved for metadata {METADATA_COLUMNS}")
            parsed = from_sugar(declared, where)
            internal = sorted(
                {t.name for t in walk(parsed) if isinstance(t, Primitive) and t.name in INTERNAL}
            )
            if internal:
                raise _fail(where, declared, f"type {internal[0]!r} is the metadata's; use 'int'")
            canonical[name] = render(parsed)
        if self.key_field is not None:
            if not isinstance(self.key_field, str) or not self.key_field:
                raise _fail("format.key_field", self.key_field, "expected a non-empty column name")
            if self.key_field in canonical or self.key_field in METADATA_COLUMNS:
                raise _fail("format.key_field", self.key_field, "collides with a schema or metadata column")
        if self.changes is not None:
            if not isinstance(self.changes, Debezium):
                raise _fail("format.changes", self.changes, "expected Debezium(...)")
            if self.key_field is not None:
                raise _fail("format.key_field", self.key_field, "not with changes: the key is the change's")
            if OP_COLUMN in canonical:
                raise _fail("format.schema", OP_COLUMN, "is the change's op column")
            unknown = [k for k in self.changes.key if k not in canonical]
            if unknown:
                raise _fail("format.changes.key", unknown, "key fields must be fields of the schema")
        object.__setattr__(self, "schema", MappingProxyType(canonical))

    def field_type(self, name: str) -> tuple[str, bool]:
        """(base type, nullable) of a schema field: its canonical text without the trailing "?"."""
        declared = self.schema[name]
        return declared.removesuffix("?"), declared.endswith("?")


@dataclass(frozen=True)
class AvroFormat:
    """Record values are Avro records, read with a reader schema that gives the row's columns.

    The reader schema comes from an ``.avsc`` file (``schema_file``, read when the spec is built, so the
    file need not exist where the tasks run) or from a schema registry subject (``subject``: its latest
    schema, pinned by each slice's driver when the slice opens, from the deployment's registry, see
    `onceflow.config.Settings.schema_registry_url`). ``wire="registry"``: each value is the magic byte 0,
    the writer schema's 4-byte big-endian id in the registry, then the Avro body; writer schemas are
    resolved by id and read with Avro's resolution rules, so producers may evolve compatibly.
    ``wire="plain"``: each value is a bare Avro body, written with ``writer_schema_file``'s schema or
    else with the reader schema. ``key_field`` works as in `JsonFormat`.
    """

    schema_file: str | None = None
    subject: str | None = None
    wire: AvroWire = "registry"
    writer_schema_file: str | None = None
    key_field: str | None = None
    # The schemas' JSON text: loaded from the files, or pinned from the subject; this is what travels.
    reader_schema: str | None = None
    writer_schema: str | None = None
    # Debezium change events: the reader schema is their envelope, the rows are its before/after record.
    changes: Debezium | None = None

    def __post_init__(self) -> None:
        if self.wire not in AVRO_WIRES:
            raise _fail("format.wire", self.wire, f"expected one of {AVRO_WIRES}")
        if (self.schema_file is None) == (self.subject is None):
            raise ConfigError("format: give the reader schema as schema_file or as subject, one of them")
        for name in ("schema_file", "subject", "writer_schema_file"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise _fail(f"format.{name}", value, "expected a non-empty string")
        if self.writer_schema_file is not None and self.wire != "plain":
            raise _fail("format.writer_schema_file", self.writer_schema_file, "only with wire='plain'")
        if self.reader_schema is None and self.schema_file is not None:
            object.__setattr__(self, "reader_schema", _read_text("format.schema_file", self.schema_file))
        if self.writer_schema is None and self.writer_schema_file is not None:
            object.__setattr__(
                self, "writer_schema", _read_text("format.writer_schema_file", self.writer_schema_file)
            )
        names: list[str] = []
        if self.reader_schema is not None:
            object.__setattr__(
                self,
                "reader_schema",
                _avro_schema("format.reader_schema", self.reader_schema, self.changes is not None),
            )
            names = [name for name, _, _ in self.columns()]
            reserved = sorted(set(names) & set(METADATA_COLUMNS))
            if reserved:
                raise _fail("format.reader_schema", reserved, "field names are reserved for metadata")
        if self.writer_schema is not None:
            object.__setattr__(
                self, "writer_schema", _avro_schema("format.writer_schema", self.writer_schema)
            )
        if self.key_field is not None:
            if not isinstance(self.key_field, str) or not self.key_field:
                raise _fail("format.key_field", self.key_field, "expected a non-empty column name")
            if self.key_field in names or self.key_field in METADATA_COLUMNS:
                raise _fail("format.key_field", self.key_field, "collides with a schema or metadata column")
        if self.changes is not None:
            if not isinstance(self.changes, Debezium):
                raise _fail("format.changes", self.changes, "expected Debezium(...)")
            if self.key_field is not None:
                raise _fail("format.key_field", self.key_field, "not with changes: the key is the change's")
            if self.changes.decimals != "precise":
                raise _fail("format.changes.decimals", self.changes.decimals, "Avro carries exact decimals")
            unknown = [k for k in self.changes.key if names and k not in names]
            if unknown:
                raise _fail("format.changes.key", unknown, "key fields must be fields of the change's rows")

    @property
    def pinned(self) -> bool:
        """Whether the reader schema is known (always, from a file; from a subject once pinned)."""
        return self.reader_schema is not None

    def columns(self) -> list[tuple[str, str, bool]]:
        """(name, row type, nullable) of the reader schema's fields."""
        if self.reader_schema is None:
            raise ConfigError(
                f"format.subject={self.subject!r}: the reader schema is not pinned yet (a slice's driver "
                "pins the subject's latest schema from the schema registry)"
            )
        schema = json.loads(self.reader_schema)
        if self.changes is not None:
            schema = envelope_row_schema("format.reader_schema", schema)
        return avro_columns("format.reader_schema", schema)

    def pin(self, reader_schema: str) -> AvroFormat:
        """This format reading with ``reader_schema`` (a subject's latest, fetched by the caller)."""
        return AvroFormat(
            subject=self.subject,
            wire=self.wire,
            writer_schema=self.writer_schema,
            key_field=self.key_field,
            reader_schema=reader_schema,
            changes=self.changes,
        )


def _read_text(where: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(where, path, f"cannot read it ({one_line(exc)})") from exc


def _avro_schema(where: str, text: str, changes: bool = False) -> str:
    """The schema as compact JSON, after checking that Avro accepts it and that rows can hold it (a
    change event envelope's rows, with ``changes``)."""
    schema = parse_schema_text(where, text)
    avro_columns(where, envelope_row_schema(where, schema) if changes else schema)
    from fastavro import parse_schema  # imported where used: a JSON-only deployment need not load it

    try:
        parse_schema(dict(schema))
    except Exception as exc:  # fastavro raises several kinds for a bad schema
        raise ConfigError(f"{where}: not a valid Avro schema ({one_line(exc)})") from exc
    return json.dumps(schema, sort_keys=True)


@dataclass(frozen=True)
class RawFormat:
    """Record keys and values are passed through as bytes (columns ``key`` and ``value``)."""


RecordFormat: TypeAlias = JsonFormat | AvroFormat | RawFormat


# A state key: a column, or a nested field by its path of names (a name in backquotes may hold anything
# but a backquote, as Spark reads it).
_KEY_PATH = re.compile(r"^(?:[^.`]+|`[^`]+`)(?:\.(?:[^.`]+|`[^`]+`))*$")
_KEY_PART = re.compile(r"[^.`]+|`[^`]+`")


def key_column(key: str) -> str:
    """The column a state key gives: its last field's name (``ctx.ip`` -> ``ip``, ```a.b``` -> ``a.b``)."""
    parts: list[str] = _KEY_PART.findall(key)
    return parts[-1].strip("`")


@dataclass(frozen=True)
class StateSpec:
    """Keyed state: the transform's rows are grouped by ``keys`` and ``column`` is folded with ``reducer``.

    A key is a column or a nested field by its path (``ctx.ip``; `key_columns` names its column).

    State after epoch n = the committed state of epoch n-1 folded with epoch n's rows. The sinks receive,
    for every key the epoch touched, the keys and the new folded value (in column ``output``, by default
    ``column``, or "count"). The reducers are the associative ones (`BUILTIN_REDUCERS`), which is what lets
    an epoch's rows be folded into the previous state without re-reading old epochs. The snapshot lives
    in files under ``root`` (default ``$ONCEFLOW_HOME/state``), staged by the job and promoted with the
    epoch like any other participant.
    """

    keys: tuple[str, ...]
    reducer: str
    column: str | None = None
    output: str | None = None
    root: str | None = None

    def __post_init__(self) -> None:
        keys = self.keys
        if isinstance(keys, str) or not isinstance(keys, Iterable) or not tuple(keys):
            raise _fail("state.keys", keys, "expected a non-empty list of column names")
        keys = tuple(keys)
        for key in keys:
            if not isinstance(key, str) or not key:
                raise _fail("state.keys", key, "expected column names")
        if len(set(keys)) != len(keys):
            raise _fail("state.keys", list(keys), "a key column is listed more than once")
        object.__setattr__(self, "keys", keys)
        for key in keys:
            if not _KEY_PATH.match(key):
                raise _fail(
                    "state.keys", key, "expected a column, or a nested field as its path (ctx.ip, `a.b`)"
                )
        named = [key_column(key) for key in keys]
        if len(set(named)) != len(named):
            raise _fail(
                "state.keys",
                list(keys),
                f"two keys give one column name ({named}); alias one in the transform",
            )
        if self.reducer not in BUILTIN_REDUCERS:
            raise _fail("state.reducer", self.reducer, f"expected one of {BUILTIN_REDUCERS}")
        if self.column is None and self.reducer != "count":
            raise _fail("state.column", None, f"reducer {self.reducer!r} needs the column it folds")
        for name in ("column", "output", "root"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise _fail(f"state.{name}", value, "expected a non-empty string")
        if self.value_column in self.key_columns:
            raise _fail("state.output", self.value_column, "the folded value's column collides with a key")

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The key columns the state and the sinks' rows carry: a nested key (``ctx.ip``) is named by
        its last field (``ip``), as Spark names ``select("ctx.ip")``."""
        return tuple(key_column(key) for key in self.keys)

    @property
    def value_column(self) -> str:
        """The column that carries the folded value in the state and in the sinks' rows."""
        return self.output or self.column or "count"


@dataclass(frozen=True)
class SinkSpec:
    """One output. ``kind`` selects the sink implementation; ``config`` is its JSON configuration."""

    name: str
    kind: str
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise _fail(
                "sinks.name", self.name, "expected [A-Za-z0-9][A-Za-z0-9_.-]*, at most 100 characters"
            )
        if not isinstance(self.kind, str) or not (_IDENT.match(self.kind) or _DOTTED_KIND.match(self.kind)):
            raise _fail(
                f"sinks[{self.name!r}].kind",
                self.kind,
                "expected a kind such as 'postgres_2pc', or package.module:attribute naming a SinkKind",
            )
        object.__setattr__(self, "config", _frozen_json(f"sinks[{self.name!r}].config", self.config))


@dataclass(frozen=True)
class Pipeline:
    """A complete pipeline: source, record format, transform, optional state, sinks and limits.

    Limits: ``max_records_per_partition`` bounds an epoch's range per partition (in offsets),
    ``max_records_per_task`` the span of one Spark read task, ``max_record_bytes`` the key plus value size
    of one record (larger records are dead-lettered), ``transaction_timeout_s`` how long staged
    transactions may stay open (and so how long a slice may run), ``max_dead_letters_per_epoch`` how
    many dead letters an epoch may keep: past it the epoch aborts, its range is replayed by the next run.

    ``on_rerun`` decides what re-running a data interval that already committed does: "skip" (default)
    does nothing and says so; "replace" processes the interval's ranges again and replaces its earlier
    output, which only replaceable sink kinds (`SinkKind.replaceable`) can do.
    """

    name: str
    source: KafkaSource
    format: RecordFormat
    sinks: tuple[SinkSpec, ...]
    transform: str | None = None
    state: StateSpec | None = None
    guarantee: Guarantee = "exactly_once"
    slices: int = 1
    max_records_per_partition: int = 100_000
    # Each read task has a fixed cost (its Python workers, its Kafka consumer, its sinks' writers): on
    # 2 cores, 10^7 records in epochs of 10^6 ran at 226 k records/s in tasks of 50,000, 358 k in tasks
    # of 125,000 and 389 k in tasks of 250,000, as large as one partition's range of such an epoch (one
    # task per Kafka partition, as Spark's own Kafka source reads). A task streams its records, so its
    # memory does not grow with it; a smaller one spreads a partition over more cores.
    max_records_per_task: int = 250_000
    max_record_bytes: int = 1_048_576
    transaction_timeout_s: int = 900
    max_dead_letters_per_epoch: int = 10_000
    on_rerun: OnRerun = "skip"

    def __post_init__(self) -> None:
        if (
            not isinstance(self.name, str)
            or not _NAME.match(self.name)
            or len(self.name) > PIPELINE_NAME_CHARS
        ):
            raise _fail(
                "name",
                self.name,
                f"expected [A-Za-z0-9][A-Za-z0-9_.-]*, at most {PIPELINE_NAME_CHARS} characters (the Airflow "
                "tag onceflow:<name> is at most 100)",
            )
        if not isinstance(self.source, KafkaSource):
            raise _fail("source", self.source, "expected a KafkaSource")
        if not isinstance(self.format, JsonFormat | AvroFormat | RawFormat):
            raise _fail("format", self.format, "expected JsonFormat(...), AvroFormat(...) or RawFormat()")
        sinks = self.sinks
        if isinstance(sinks, SinkSpec) or not isinstance(sinks, Iterable):
            raise _fail("sinks", sinks, "expected a list of SinkSpec")
        sinks = tuple(sinks)
        if not sinks:
            raise _fail("sinks", [], "expected at least one sink")
        for sink in sinks:
            if not isinstance(sink, SinkSpec):
                raise _fail("sinks", sink, "expected SinkSpec entries")
        names = [s.name for s in sinks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise _fail("sinks", duplicates, "duplicate sink names")
        object.__setattr__(self, "sinks", sinks)
        if self.transform is not None:
            _check_dotted("transform", self.transform)
        if self.state is not None and not isinstance(self.state, StateSpec):
            raise _fail("state", self.state, "expected a StateSpec or None")
        if STATE_SINK in names:
            raise _fail("sinks.name", STATE_SINK, "is reserved for the keyed state's snapshot")
        if self.on_rerun not in ON_RERUN:
            raise _fail("on_rerun", self.on_rerun, f"expected one of {ON_RERUN}")
        if self.on_rerun == "replace" and self.state is not None:
            # Whether each sink can take an interval's output back is its kind's to say: checked at plan
            # time (`onceflow.protocol.planning.check_rerun`), since the spec knows no sink kinds.
            raise _fail("on_rerun", self.on_rerun, "keyed state would fold the interval's records twice")
        if self.state is not None and self.guarantee == "at_most_once":
            raise _fail(
                "guarantee",
                self.guarantee,
                "keyed state is promoted with a committed epoch; use another guarantee",
            )
        if self.state is not None and self.slices != 1:
            raise _fail(
                "slices",
                self.slices,
                "a pipeline with keyed state runs as one slice, because a key's records may come from "
                "any partition (Spark still spreads the slice over its executors)",
            )
        if self.guarantee not in GUARANTEES:
            raise _fail("guarantee", self.guarantee, f"expected one of {GUARANTEES}")
        for name in (
            "slices",
            "max_records_per_partition",
            "max_records_per_task",
            "max_record_bytes",
            "transaction_timeout_s",
            "max_dead_letters_per_epoch",
        ):
            _positive_int(name, getattr(self, name))

    @property
    def commits_before_processing(self) -> bool:
        """at_most_once: an epoch's source position is committed when it is planned, before any record is
        processed, so a failed epoch is never replayed (and nothing can be written twice)."""
        return self.guarantee == "at_most_once"

    def sink(self, name: str) -> SinkSpec:
        for sink in self.sinks:
            if sink.name == name:
                return sink
        raise ConfigError(
            f"pipeline {self.name!r} has no sink {name!r}; sinks: {[s.name for s in self.sinks]}"
        )

    def load_transform(self) -> Callable[[Any], Any]:
        """The transform function (DataFrame -> DataFrame); the identity when none is declared."""
        if self.transform is None:
            return _identity
        function = import_dotted(self.transform)
        if not callable(function):
            raise _fail("transform", self.transform, "does not name a callable")
        return cast(Callable[[Any], Any], function)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible description; `from_dict` rebuilds an equal spec."""
        fmt: dict[str, Any]
        if isinstance(self.format, JsonFormat):
            fmt = {"type": "json", "schema": dict(self.format.schema), "key_field": self.format.key_field}
        elif isinstance(self.format, AvroFormat):
            fmt = {"type": "avro", **{name: getattr(self.format, name) for name in _AVRO_KEYS}}
        if isinstance(self.format, JsonFormat | AvroFormat):
            if self.format.changes is not None:
                fmt["changes"] = self.format.changes.to_dict()
        else:
            fmt = {"type": "raw"}
        state = None
        if self.state is not None:
            state = {
                "keys": list(self.state.keys),
                "reducer": self.state.reducer,
                "column": self.state.column,
                "output": self.state.output,
                "root": self.state.root,
            }
        return {
            "version": SPEC_VERSION,
            "name": self.name,
            "source": {
                "topics": list(self.source.topics),
                "starting": self.source.starting,
                "on_missing_offsets": self.source.on_missing_offsets,
            },
            "format": fmt,
            "sinks": [{"name": s.name, "kind": s.kind, "config": dict(s.config)} for s in self.sinks],
            "transform": self.transform,
            "state": state,
            "guarantee": self.guarantee,
            "slices": self.slices,
            "max_records_per_partition": self.max_records_per_partition,
            "max_records_per_task": self.max_records_per_task,
            "max_record_bytes": self.max_record_bytes,
            "transaction_timeout_s": self.transaction_timeout_s,
            "max_dead_letters_per_epoch": self.max_dead_letters_per_epoch,
            "on_rerun": self.on_rerun,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pipeline:
        """Rebuild a spec from `to_dict` output; unknown or missing keys are a `ConfigError`."""
        if not isinstance(data, Mapping):
            raise _fail("pipeline", data, "expected a mapping")
        if data.get("version") != SPEC_VERSION:
            raise _fail("version", data.get("version"), f"this onceflow reads spec version {SPEC_VERSION}")
        _check_keys("pipeline", data, required={"name", "source", "format", "sinks"}, optional=_OPTIONAL_KEYS)
        source = data["source"]
        _check_keys("source", source, required={"topics"}, optional={"starting", "on_missing_offsets"})
        fmt_data = data["format"]
        _check_keys(
            "format", fmt_data, required={"type"}, optional={"schema", "key_field", "changes", *_AVRO_KEYS}
        )
        fmt: RecordFormat
        changes = None if fmt_data.get("changes") is None else Debezium.from_dict(fmt_data["changes"])
        if fmt_data["type"] == "json":
            fmt = JsonFormat(
                schema=fmt_data.get("schema") or {}, key_field=fmt_data.get("key_field"), changes=changes
            )
        elif fmt_data["type"] == "avro":
            fmt = AvroFormat(
                **{name: fmt_data[name] for name in _AVRO_KEYS if name in fmt_data}, changes=changes
            )
        elif fmt_data["type"] == "raw":
            fmt = RawFormat()
        else:
            raise _fail("format.type", fmt_data["type"], "expected 'json', 'avro' or 'raw'")
        sinks_data = data["sinks"]
        if not isinstance(sinks_data, list):
            raise _fail("sinks", sinks_data, "expected a list")
        sinks = []
        for sink in sinks_data:
            _check_keys("sinks[]", sink, required={"name", "kind"}, optional={"config"})
            sinks.append(SinkSpec(name=sink["name"], kind=sink["kind"], config=sink.get("config") or {}))
        state = None
        if data.get("state") is not None:
            state_data = data["state"]
            _check_keys(
                "state", state_data, required={"keys", "reducer"}, optional={"column", "output", "root"}
            )
            state = StateSpec(
                keys=state_data["keys"],
                reducer=state_data["reducer"],
                column=state_data.get("column"),
                output=state_data.get("output"),
                root=state_data.get("root"),
            )
        limits = {k: data[k] for k in _OPTIONAL_KEYS - {"version", "transform", "state"} if k in data}
        return cls(
            name=data["name"],
            source=KafkaSource(
                topics=source["topics"],
                starting=source.get("starting", "earliest"),
                on_missing_offsets=source.get("on_missing_offsets", "fail"),
            ),
            format=fmt,
            sinks=tuple(sinks),
            transform=data.get("transform"),
            state=state,
            **limits,
        )

    @classmethod
    def from_json(cls, text: str) -> Pipeline:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"pipeline spec is not valid JSON ({exc})") from exc
        return cls.from_dict(data)


_AVRO_KEYS = (
    "schema_file",
    "subject",
    "wire",
    "writer_schema_file",
    "key_field",
    "reader_schema",
    "writer_schema",
)
_OPTIONAL_KEYS = frozenset(
    {
        "version",
        "transform",
        "state",
        "guarantee",
        "slices",
        "max_records_per_partition",
        "max_records_per_task",
        "max_record_bytes",
        "transaction_timeout_s",
        "max_dead_letters_per_epoch",
        "on_rerun",
    }
)


def _check_keys(where: str, data: object, *, required: set[str], optional: Iterable[str]) -> None:
    if not isinstance(data, Mapping):
        raise _fail(where, data, "expected a mapping")
    missing = sorted(required - set(data))
    if missing:
        raise ConfigError(f"{where}: missing keys {missing}")
    unknown = sorted(set(data) - required - set(optional))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}")


def _identity(frame: Any) -> Any:
    return frame


def load_pipeline(path: str) -> Pipeline:
    """The `Pipeline` at ``module:attribute``: how the Spark job and the DAGs find a user's pipeline."""
    spec = import_dotted(path)
    if not isinstance(spec, Pipeline):
        raise ConfigError(f"{path!r}: expected a onceflow Pipeline, found {type(spec).__name__}")
    return spec
