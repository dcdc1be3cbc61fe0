"""PostgreSQL helpers shared by the PostgreSQL sinks: table config, identifiers, row checks, and the
values of nested columns.

A struct, array or map value (a dict, a list, or the list of (key, value) pairs Arrow gives for a map)
is stored as the column it goes to asks (`pg_value`):

* a PostgreSQL array column (``bigint[]``, ``text[]``, ``item[]``...) takes an array as a PostgreSQL
  array, each element as the element type asks (a list inside a list is a further dimension);
* a composite column (``CREATE TYPE item AS (...)``) takes a struct or a map whose keys are exactly the
  type's fields, each field as its type asks;
* ``jsonb``, ``json`` and text columns take the value's JSON (`json_text`), and so does a column whose
  type is unknown: structs and maps are objects, arrays are arrays; timestamps are ISO-8601 in UTC with
  their offset (a timestamp without a time zone keeps its wall time, without one), dates ISO, decimals
  exact JSON numbers (never through a float), bytes base64 (standard alphabet, padded);
* any other column refuses it with one `RowError` line naming the column and the place in the value.

A sink's ``columns`` may name a nested column by its row type text instead of SQL
(``items: "array<struct<sku:string,qty:int>>"``): the column is ``jsonb``, and a ``json`` field inside
it is stored as the document its text holds, and an empty map as ``{}`` (a column declared as SQL
cannot tell a json field from a string, nor Arrow's empty list of map pairs from an empty array, so
there they are a JSON string and ``[]``).
Scalars at the top level go to psycopg as they always did.
psycopg is imported inside functions only, so importing a sink module on a Spark executor stays cheap.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any, TypeAlias

from onceflow.errors import ConfigError
from onceflow.schemas.types import Array, Map, Primitive, SchemaType, Struct, field_path, key_path, parse_type
from onceflow.sinks._config import ConfigReader, deployment_default
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.registry import SinkSetting

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


# A column type written as a nested row type text (`onceflow.schemas.types`), not as SQL: SQL type
# names never hold "<".
_ROW_TYPE_TEXT = re.compile(r"\s*(struct|array|map)\s*<")


@dataclass(frozen=True)
class PgTableConfig:
    """A target table: where it is, its columns and whether the sink creates it.

    Column types are SQL text from the pipeline's own configuration (trusted, like a migration); a
    nested row type text there becomes ``jsonb``, and ``row_types`` keeps the type it was.
    """

    dsn: str
    table: str
    columns: tuple[tuple[str, str], ...]
    create_table: bool = True
    batch_size: int = 1000
    name: str | None = None
    row_types: tuple[tuple[str, SchemaType], ...] = ()

    @classmethod
    def read(cls, reader: ConfigReader) -> PgTableConfig:
        dsn = reader.optional_string("dsn")
        if dsn is None:  # `pg_defaults` fills it with the deployment's PostgreSQL
            raise deployment_default(reader.kind, "dsn", "Settings.pg_dsn (ONCEFLOW_PG_DSN)")
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"{reader.kind} sink config dsn: expected a postgresql:// URL")
        columns: list[tuple[str, str]] = []
        row_types: list[tuple[str, SchemaType]] = []
        for name, sql_type in reader.columns():
            if _ROW_TYPE_TEXT.match(sql_type):
                row_types.append((name, parse_type(sql_type, f"{reader.kind} sink config columns[{name!r}]")))
                sql_type = "jsonb"
            columns.append((name, sql_type))
        return cls(
            dsn=dsn,
            table=reader.string("table"),
            columns=tuple(columns),
            row_types=tuple(row_types),
            create_table=reader.boolean("create_table", True),
            batch_size=reader.integer("batch_size", 1000, minimum=1),
            name=reader.optional_string("name"),
        )

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def key_columns(self, reader: ConfigReader) -> tuple[str, ...]:
        """The config's ``key_columns``, each one of this table's columns."""
        keys = reader.string_list("key_columns")
        unknown = [k for k in keys if k not in self.column_names]
        if unknown:
            raise ConfigError(f"{reader.kind} sink config key_columns: {unknown} are not among the columns")
        return keys


# The keys `PgTableConfig.read` takes, shared by every PostgreSQL sink kind's `SinkKind.settings`.
PG_TABLE_SETTINGS: tuple[SinkSetting, ...] = (
    SinkSetting(
        "dsn",
        "string",
        "PostgreSQL URL (`postgresql://user:pw@host:port/db`) of the database that holds the table",
        default_from="`ONCEFLOW_PG_DSN` (in Airflow: the `onceflow_postgres` connection)",
    ),
    SinkSetting(
        "table",
        "string",
        "target table, `name` or `schema.name`; each part is taken as written (quoted: case kept)",
        required=True,
    ),
    SinkSetting(
        "columns",
        "columns",
        "the table's columns in order, `{name: SQL type}` (a nested value goes to `jsonb`, an array type "
        "or a composite type), or a row type's text such as `array<struct<sku:string,qty:int>>` for a "
        "`jsonb` column; rows must have exactly these columns",
        required=True,
    ),
    SinkSetting("create_table", "boolean", "create the table if it is missing, before writing", default=True),
    SinkSetting(
        "batch_size",
        "integer",
        "rows per write batch (`plain`, `postgres_upsert`, `wal`; `postgres_2pc` writes in one COPY)",
        default=1000,
        minimum=1,
    ),
)


def table_identifier(name: str) -> sql.Composable:
    """``schema.table`` or ``table`` as a quoted identifier: ``"Schema"."Table"``.

    The one form of a configured name, for creating a table and for finding it (`find_table`): quoted,
    a mixed-case name keeps its case, where an unquoted lookup would fold it to lower case and miss it.
    """
    from psycopg import sql

    parts = name.split(".")
    if any(not part or "\x00" in part for part in parts):
        raise ConfigError(f"table name {name!r}: expected `name` or `schema.name`")
    return sql.Identifier(*parts)


def find_table(conn: psycopg.Connection[Any], name: str) -> int | None:
    """The oid of table ``name`` (as `table_identifier` quotes it), or None when it does not exist."""
    quoted = table_identifier(name).as_string(conn)
    found = conn.execute("SELECT to_regclass(%s)::oid", [quoted]).fetchone()
    return None if found is None or found[0] is None else int(found[0])


def column_list(names: Iterable[str]) -> sql.Composable:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def create_table_if_missing(
    conn: psycopg.Connection[Any], table: PgTableConfig, extra: sql.Composable | None = None
) -> None:
    """Create the target table (outside any data transaction) unless it exists.

    Concurrent tasks may race on ``CREATE TABLE IF NOT EXISTS``; the loser's duplicate error is harmless.
    """
    from psycopg import sql

    definitions = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in table.columns
    )
    if extra is not None:
        definitions = sql.SQL("{}, {}").format(definitions, extra)
    statement = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        table_identifier(table.table), definitions
    )
    run_ddl(conn, statement)


def run_ddl(conn: psycopg.Connection[Any], statement: sql.Composed) -> None:
    from psycopg import errors

    try:
        with conn.transaction():
            conn.execute(statement)
    except (errors.UniqueViolation, errors.DuplicateTable, errors.DuplicateObject):
        pass  # another task created it at the same moment


def row_values(row: Row, columns: tuple[str, ...], where: str) -> tuple[Any, ...]:
    """The row's values in column order; a missing or unknown column is an error, never dropped."""
    if not isinstance(row, Mapping):
        raise RowError(f"{where}: a row must be a mapping of column -> value, got {type(row).__name__}")
    if len(row) != len(columns) or any(c not in row for c in columns):
        missing = [c for c in columns if c not in row]
        unknown = [k for k in row if k not in columns]
        raise RowError(
            f"{where}: row {dict(row)!r} has missing columns {missing} and unknown columns {unknown}"
        )
    return tuple(row[c] for c in columns)


# Column types whose values are PostgreSQL text: a nested value goes there as its JSON.
JSON_TYPES = frozenset({"json", "jsonb"})
# pg_type.typcategory values: arrays, composites, strings, numbers, booleans.
_ARRAY, _COMPOSITE, _STRING, _NUMERIC, _BOOLEAN = "A", "C", "S", "N", "B"


@dataclass(frozen=True)
class PgType:
    """A column's type as the nested values need it: its name as ``regtype`` prints it (``bigint[]``,
    ``double precision``), its ``pg_type.typcategory``, an array's element type, a composite's fields
    and the psycopg class that dumps the composite (registered on the connection that read it)."""

    name: str
    category: str = "X"
    element: PgType | None = None
    fields: tuple[tuple[str, PgType], ...] = ()
    make: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    @property
    def holds_json(self) -> bool:
        """Whether a nested value goes here as its JSON text (json, jsonb, any string type)."""
        return self.name in JSON_TYPES or self.category == _STRING


# The type of a column that the catalog does not describe: a nested value goes there as JSON.
UNKNOWN_TYPE = PgType("jsonb", "U")


def table_types(conn: psycopg.Connection[Any], table: str) -> dict[str, PgType]:
    """Each column of ``table`` (a quoted identifier) and its `PgType`; nothing for a missing table.

    Composite types met on the way are registered on ``conn``, so that psycopg dumps their values
    (`pg_value` builds them) on this connection, in COPY and in INSERT alike.
    """
    rows = conn.execute(
        "SELECT attname, atttypid FROM pg_attribute"
        " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        [table],
    ).fetchall()
    seen: dict[int, PgType] = {}
    return {str(name): _describe(conn, int(oid), seen) for name, oid in rows}


def _describe(conn: psycopg.Connection[Any], oid: int, seen: dict[int, PgType]) -> PgType:
    from psycopg.types.composite import CompositeInfo, register_composite

    if oid in seen:
        return seen[oid]
    found = conn.execute(
        "SELECT oid::regtype::text, typcategory, typelem, typtype, typbasetype FROM pg_type WHERE oid = %s",
        [oid],
    ).fetchone()
    if found is None:
        return UNKNOWN_TYPE
    name, category, element, kind, base = str(found[0]), str(found[1]), int(found[2]), found[3], int(found[4])
    if kind == "d":  # a domain's values are its base type's
        described = _describe(conn, base, seen)
    elif category == _ARRAY and element:
        described = PgType(name, category, element=_describe(conn, element, seen))
    elif kind == "c":
        info = CompositeInfo.fetch(conn, name)
        if info is None:
            return UNKNOWN_TYPE
        register_composite(info, conn)
        fields = tuple(
            (str(n), _describe(conn, int(t), seen))
            for n, t in zip(info.field_names, info.field_types, strict=True)
        )
        described = PgType(name, _COMPOSITE, fields=fields, make=info.python_type)
    else:
        described = PgType(name, category)
    seen[oid] = described
    return described


# A row value that is a struct, array or map (a tuple only as one of a map's pairs); a tuple of
# classes, which isinstance checks several times faster than a union.
_NESTED = (dict, list, tuple)


def is_nested(value: Any) -> bool:
    """Whether a row value is a struct, array or map (a dict, a list, or a tuple)."""
    return isinstance(value, _NESTED)


def map_items(value: Any) -> Mapping[Any, Any] | None:
    """A map or struct value as a mapping: a dict, or the non-empty list of (key, value) pairs that an
    Arrow map's ``to_pylist`` gives (an empty one is an empty array: nothing tells them apart)."""
    if isinstance(value, dict):
        return value
    if (
        isinstance(value, list)
        and value
        and all(type(item) is tuple and len(item) == 2 and isinstance(item[0], str) for item in value)
    ):
        return dict(value)
    return None


# Where a value sits, built only when an error names it: the column's name, or (parent, field name or
# array index); `place_text` writes it as the decoders do (items[3].qty, counts["a b"]).
Place: TypeAlias = "str | tuple[Place, str | int]"


def place_text(place: Place) -> str:
    """The text of a `Place`: ``items[3].qty``, ``counts["a b"]`` (a long key cut, as `key_path` does)."""
    if isinstance(place, str):
        return place
    parent, key = place
    text = place_text(parent)
    if isinstance(key, int):
        return f"{text}[{key}]"
    return field_path(text, key) if len(key) <= 64 else key_path(text, key)


def pg_value(value: Any, target: PgType, path: Place, where: str, row_type: SchemaType | None = None) -> Any:
    """``value`` as psycopg dumps it into a ``target`` column (see the module's docstring); ``path`` is
    the column and the place inside it, named by a `RowError` when the value does not fit; ``row_type``,
    when the sink's columns give it, marks the ``json`` fields of a value that goes as JSON."""
    if value is None:
        return None
    items = map_items(value)
    if target.category == _ARRAY and target.element is not None and items is None and is_nested(value):
        element = target.element
        return [
            pg_value(item, target if _sub_array(item, element) else element, (path, i), where)
            for i, item in enumerate(value)
        ]
    if target.category == _COMPOSITE and items is not None and target.make is not None:
        names = [name for name, _ in target.fields]
        missing = [n for n in names if n not in items]
        unknown = [k for k in items if k not in names]
        if missing or unknown:
            raise RowError(
                f"{where} column {place_text(path)}: the value has missing fields {missing} and unknown "
                f"fields {unknown} for composite type {target.name}"
            )
        return target.make(*(pg_value(items[n], t, (path, n), where) for n, t in target.fields))
    if is_nested(value):
        if target.holds_json:
            return json_text(value, path, where, row_type)
        shown = "a struct or map" if items is not None else "an array"
        raise RowError(
            f"{where} column {place_text(path)}: {shown} does not fit a column of type {target.name}; "
            "declare it jsonb (any nested value), a PostgreSQL array (of scalars) or a composite type"
        )
    if target.category == _NUMERIC and (
        isinstance(value, bool) or not isinstance(value, int | float | Decimal)
    ):
        raise RowError(f"{where} column {place_text(path)}: {_shown(value)} does not fit type {target.name}")
    if target.category == _BOOLEAN and not isinstance(value, bool):
        raise RowError(f"{where} column {place_text(path)}: {_shown(value)} does not fit type {target.name}")
    return value


def _sub_array(item: Any, element: PgType) -> bool:
    """Whether an array's item is a further dimension of it (PostgreSQL arrays have any number), not
    one element: a list of an array whose elements are not JSON."""
    return isinstance(item, list | tuple) and map_items(item) is None and not element.holds_json


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def json_text(value: Any, path: Place, where: str, row_type: SchemaType | None = None) -> str:
    """The JSON of a row value (see the module's docstring for each scalar's form), compact, keys in
    the value's order; what PostgreSQL cannot hold (NaN, infinities, NUL characters) is a `RowError`.
    Where ``row_type`` says a string is a ``json`` field, its text goes in as the document it holds."""
    out: list[str] = []
    _json(value, path, where, out, row_type)
    return "".join(out)


def _inner(t: SchemaType | None, key: str | None = None) -> SchemaType | None:
    """The row type of a struct's field ``key``, a map's values or an array's elements, if known."""
    if t is None:
        return None
    if isinstance(t, Struct):
        return next((f for n, f in t.fields if n == key), None)
    if isinstance(t, Map):
        return t.value
    if isinstance(t, Array):
        return t.element
    return None


def _json(value: Any, path: Place, where: str, out: list[str], t: SchemaType | None = None) -> None:
    # The exact types rows hold come first, tested by identity: a nested value has many of them.
    kind = type(value)
    if kind is str and (t is None or not isinstance(t, Primitive) or t.name != "json"):
        if "\x00" in value:
            raise RowError(
                f"{where} column {place_text(path)}: text with a NUL character cannot be stored in PostgreSQL"
            )
        out.append(encode_basestring(value))
    elif kind is int:
        out.append(int.__repr__(value))
    elif value is None:
        out.append("null")
    elif kind is dict:
        _object(value, path, where, out, t)
    elif kind is list and not (value and type(value[0]) is tuple):
        if not value and isinstance(t, Map):
            out.append("{}")  # Arrow's empty list of pairs, where the row type says it is a map
            return
        out.append("[")
        inner = _inner(t)
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _json(item, (path, i), where, out, inner)
        out.append("]")
    else:
        _json_other(value, path, where, out, t)


def _object(items: Mapping[Any, Any], path: Place, where: str, out: list[str], t: SchemaType | None) -> None:
    out.append("{")
    first = True
    for key, item in items.items():
        if type(key) is not str:
            raise RowError(f"{where} column {place_text(path)}: map key {key!r} is not a string")
        if not first:
            out.append(",")
        first = False
        _json(key, path, where, out)
        out.append(":")
        _json(item, (path, key), where, out, _inner(t, key))
    out.append("}")


def _json_other(value: Any, path: Place, where: str, out: list[str], t: SchemaType | None) -> None:
    """`_json` for the values that are not a plain str, int, None, dict or list."""
    if isinstance(value, str) and isinstance(t, Primitive) and t.name == "json":
        try:
            json.loads(value, parse_constant=_no_constant)
        except ValueError as exc:
            raise RowError(
                f"{where} column {place_text(path)}: a json field holds text that is not JSON ({exc})"
            ) from None
        out.append(value)
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise RowError(f"{where} column {place_text(path)}: {value!r} has no JSON number")
        out.append(repr(float(value)))
    elif isinstance(value, str):
        _json(str(value), path, where, out, t)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise RowError(f"{where} column {place_text(path)}: decimal {value} has no JSON number")
        out.append(str(value))
    elif isinstance(value, bytes | bytearray | memoryview):
        out.append('"' + base64.b64encode(value).decode("ascii") + '"')
    elif isinstance(value, dt.datetime):
        moment = value if value.tzinfo is None else value.astimezone(dt.UTC)
        out.append('"' + moment.isoformat() + '"')
    elif isinstance(value, dt.date):
        out.append('"' + value.isoformat() + '"')
    elif (items := map_items(value)) is not None:
        _object(items, path, where, out, t)
    elif isinstance(value, list | tuple):
        _json(list(value), path, where, out, t)
    else:
        raise RowError(f"{where} column {place_text(path)}: {_shown(value)} has no JSON form")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class NestedValues:
    """Turns a table's rows into what psycopg stores, for the nested values among them: built once per
    writer from the table's column types, it leaves a row without nested values as it is."""

    def __init__(
        self,
        names: tuple[str, ...],
        types: Mapping[str, PgType],
        where: str,
        row_types: Mapping[str, SchemaType] | None = None,
    ) -> None:
        self.names = names
        self.types = dict(types)
        self.targets = tuple(types.get(n, UNKNOWN_TYPE) for n in names)
        self.row_types = tuple((row_types or {}).get(n) for n in names)
        self.where = where

    def row(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        for v in values:
            if isinstance(v, _NESTED):
                break
        else:
            return values  # the common flat row: one type check per value, nothing built
        return tuple(
            pg_value(v, t, n, self.where, r) if isinstance(v, _NESTED) else v
            for v, t, n, r in zip(values, self.targets, self.names, self.row_types, strict=True)
        )

    def type_name(self, name: str) -> str:
        """The column's type as ``regtype`` prints it (``double precision``), "" when not known."""
        target = self.types.get(name)
        return "" if target is None else target.name

    def column(self, name: str, values: list[Any]) -> list[Any]:
        """One column's values, as `row` gives them (the Arrow batch path's nested columns)."""
        at = self.names.index(name)
        target, row_type = self.targets[at], self.row_types[at]
        return [pg_value(v, target, name, self.where, row_type) if is_nested(v) else v for v in values]


class RowDigest:
    """A running checksum of the rows a task wrote, recorded in its committable for audits.

    Rows given as values are hashed as JSON; rows given already encoded (`add_encoded`) as their bytes.
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.count = 0

    def add(self, values: tuple[Any, ...]) -> None:
        self._digest.update(json.dumps(values, default=str, separators=(",", ":")).encode())
        self._digest.update(b"\n")
        self.count += 1

    def add_encoded(self, data: bytes | memoryview, rows: int) -> None:
        """Rows that went out already encoded (an Arrow batch's COPY data): their bytes are hashed."""
        self._digest.update(data)
        self.count += rows

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def insert_statement(table: PgTableConfig, key_columns: tuple[str, ...] = ()) -> sql.Composed:
    """A plain INSERT, or an upsert on ``key_columns`` that overwrites the other columns."""
    from psycopg import sql

    names = table.column_names
    statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        table_identifier(table.table), column_list(names), sql.SQL(", ").join(sql.Placeholder() * len(names))
    )
    if not key_columns:
        return statement
    others = [n for n in names if n not in key_columns]
    if not others:
        return sql.SQL("{} ON CONFLICT ({}) DO NOTHING").format(statement, column_list(key_columns))
    updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in others)
    target = column_list(key_columns)
    return sql.SQL("{} ON CONFLICT ({}) DO UPDATE SET {}").format(statement, target, updates)


def insert_rows(conn: psycopg.Connection[Any], statement: sql.Composed, rows: list[tuple[Any, ...]]) -> None:
    """Insert in one short transaction per batch (the target is not transactional across batches)."""
    if not rows:
        return
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(statement, rows)


def copy_rows(conn: psycopg.Connection[Any], table: PgTableConfig, rows: list[tuple[Any, ...]]) -> None:
    """Append rows with COPY in one short transaction: what plain INSERTs do, several times faster.

    The direct sinks' rows become visible batch by batch either way; COPY only removes the per-row
    statement cost, so that a direct sink is compared with the two-phase sink (also COPY) on equal terms.
    """
    from psycopg import sql

    if not rows:
        return
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        table_identifier(table.table), column_list(table.column_names)
    )
    with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)


class DirectWriterBase:
    """Shared by the sinks that write during ``write()`` (plain, upsert): one autocommit connection.

    Subclasses implement ``write()``; there is nothing to stage, so ``pre_commit()`` only describes what
    was written and ``abort()`` can only close the connection.
    """

    kind = "direct"

    def __init__(self, table: PgTableConfig, key_columns: tuple[str, ...] = ()) -> None:
        self.table = table
        self.key_columns = key_columns
        self._conn: psycopg.Connection[Any] | None = None
        self._task: Any = None
        self._digest = RowDigest()
        self._nested: NestedValues | None = None

    def _open(self, task: Any) -> None:
        import psycopg
        from psycopg import sql

        from onceflow.sinks.errors import WriterStateError

        if self._task is not None:
            raise WriterStateError(f"{self.kind} writer: begin() called twice")
        self._conn = psycopg.connect(self.table.dsn, autocommit=True)
        self._task = task
        if self.table.create_table:
            extra = None
            if self.key_columns:
                extra = sql.SQL("PRIMARY KEY ({})").format(column_list(self.key_columns))
            create_table_if_missing(self._conn, self.table, extra)
        types = table_types(self._conn, table_identifier(self.table.table).as_string(self._conn))
        where = f"{self.kind} sink table {self.table.table}"
        self._nested = NestedValues(self.table.column_names, types, where, dict(self.table.row_types))

    def _values(self, rows: Iterable[Row]) -> list[tuple[Any, ...]]:
        from onceflow.sinks.errors import WriterStateError

        if self._conn is None or self._nested is None:
            raise WriterStateError(f"{self.kind} writer: write() needs begin() first")
        nested = self._nested
        values = [nested.row(row_values(row, self.table.column_names, nested.where)) for row in rows]
        for v in values:
            self._digest.add(v)
        return values

    def _close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()

    def begin(self, task: TaskContext) -> None:
        self._open(task)

    def pre_commit(self) -> Committable:
        from onceflow.sinks.errors import WriterStateError

        if self._task is None:
            raise WriterStateError(f"{self.kind} writer: pre_commit() needs begin() first")
        self._close()
        return Committable.for_task(
            self._task, handle={}, record_count=self._digest.count, checksum=self._digest.hexdigest()
        )

    def abort(self) -> None:
        """Rows already written stay: these sinks cannot take them back (see each sink's guarantee)."""
        self._close()


class NothingToCommit:
    """The committer of a sink whose writes were final when made: commit, abort and sweep are no-ops."""

    def commit(self, committables: Sequence[Committable]) -> None:
        return None

    def abort(self, committables: Sequence[Committable]) -> None:
        return None

    def orphans(self, pipeline: str) -> list[Committable]:
        return []
