"""PostgreSQL helpers shared by the PostgreSQL sinks: table config, identifiers, row checks.

psycopg is imported inside functions only, so importing a sink module on a Spark executor stays cheap.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.sinks._config import ConfigReader, deployment_default
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.registry import SinkSetting

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


@dataclass(frozen=True)
class PgTableConfig:
    """A target table: where it is, its columns and whether the sink creates it.

    Column types are SQL text from the pipeline's own configuration (trusted, like a migration).
    """

    dsn: str
    table: str
    columns: tuple[tuple[str, str], ...]
    create_table: bool = True
    batch_size: int = 1000
    name: str | None = None

    @classmethod
    def read(cls, reader: ConfigReader) -> PgTableConfig:
        dsn = reader.optional_string("dsn")
        if dsn is None:  # `pg_defaults` fills it with the deployment's PostgreSQL
            raise deployment_default(reader.kind, "dsn", "Settings.pg_dsn (ONCEFLOW_PG_DSN)")
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"{reader.kind} sink config dsn: expected a postgresql:// URL")
        return cls(
            dsn=dsn,
            table=reader.string("table"),
            columns=reader.columns(),
            create_table=reader.boolean("create_table", True),
            batch_size=reader.integer("batch_size", 1000, minimum=1),
            name=reader.optional_string("name"),
        )

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)


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
        "the table's columns in order, `{name: SQL type}`; rows must have exactly these columns",
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

    def _values(self, rows: Iterable[Row]) -> list[tuple[Any, ...]]:
        from onceflow.sinks.errors import WriterStateError

        if self._conn is None:
            raise WriterStateError(f"{self.kind} writer: write() needs begin() first")
        where = f"{self.kind} sink table {self.table.table}"
        values = [row_values(row, self.table.column_names, where) for row in rows]
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
