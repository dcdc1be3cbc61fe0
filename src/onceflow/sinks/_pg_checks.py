"""Plan-time checks of the PostgreSQL sinks: what would certainly fail later is refused before the epoch.

Two things fail late and hide their cause otherwise: a server whose ``max_prepared_transactions`` is too
small (``PREPARE TRANSACTION`` fails inside a Spark task, and the epoch aborts with "prepared transaction
... does not exist" run after run), and a table whose columns are not the ones the sink's config names
(every row of the epoch fails to insert). Both are read from the server once per plan. A column the
sink's columns gained since the table was made is added here, before the epoch's tasks write
(`add_column`), which is how the PostgreSQL sinks follow a reader schema that gained a field.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError, ServiceUnavailable, one_line
from onceflow.sinks._pg import PgTableConfig, find_table, table_identifier

if TYPE_CHECKING:
    import psycopg

    from onceflow.pipeline import Pipeline

CONNECT_TIMEOUT_S = 10
# How long adding a column waits for the table's lock.
LOCK_TIMEOUT_MS = 10_000
LOG = logging.getLogger(__name__)


def server_of(dsn: str) -> str:
    """``host:port/database`` of a DSN, without credentials, for messages."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


def _connect(sink: str, dsn: str) -> psycopg.Connection[Any]:
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(
            f"sink {sink!r}: cannot connect to PostgreSQL at {server_of(dsn)} ({one_line(exc)}): check the "
            "sink's dsn (or ONCEFLOW_PG_DSN / the onceflow_postgres connection) and that the server runs"
        ) from exc


def check_prepared_room(conn: psycopg.Connection[Any], sinks: Sequence[str], dsn: str, tasks: int) -> None:
    """Every task of an epoch holds one prepared transaction per two-phase sink on this server until
    the epoch commits, so the server must allow at least that many at once."""
    row = conn.execute("SHOW max_prepared_transactions").fetchone()
    allowed = int(row[0]) if row is not None else 0
    needed = tasks * len(sinks)
    if allowed < needed:
        raise ConfigError(
            f"sinks {list(sinks)} need up to {needed} prepared transactions at once on PostgreSQL at "
            f"{server_of(dsn)} ({tasks} tasks x {len(sinks)} sinks), but its max_prepared_transactions is "
            f"{allowed}: set max_prepared_transactions >= {needed} in postgresql.conf and restart it, or "
            "lower the pipeline's slices / raise max_records_per_task so that an epoch has fewer tasks"
        )


def check_table(conn: psycopg.Connection[Any], sink: str, table: PgTableConfig, apply: bool = True) -> None:
    """The table exists (or the sink may create it) and has every configured column with its type; a
    configured column the table lacks is added (schema evolution: `add_column`) when the sink may
    create the table, unless this is a preview (``apply`` false); columns the config does not name are
    the table's own business (defaults, generated columns)."""
    oid = find_table(conn, table.table)
    if oid is None:
        if not table.create_table:
            raise ConfigError(
                f"sink {sink!r}: table {table.table!r} does not exist at {server_of(table.dsn)} and the "
                "sink's create_table is false: create the table or set create_table: true"
            )
        return
    actual = dict(
        conn.execute(
            "SELECT attname, atttypid::regtype::text FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
            [oid],
        ).fetchall()
    )
    for column, sql_type in table.columns:
        declared = conn.execute("SELECT to_regtype(%s)::text", [sql_type]).fetchone()
        if declared is None or declared[0] is None:
            raise ConfigError(
                f"sink {sink!r}: column {column!r} has type {sql_type!r}, which PostgreSQL does not know"
            )
        if column not in actual:
            if not table.create_table:
                raise ConfigError(
                    f"sink {sink!r}: table {table.table!r} has no column {column!r} (it has "
                    f"{', '.join(actual)}) and the sink's create_table is false: add the column or "
                    "change the sink's columns"
                )
            if apply:
                add_column(conn, sink, table, column, sql_type)
            continue
        if actual[column] != declared[0]:
            raise ConfigError(
                f"sink {sink!r}: column {column!r} of table {table.table!r} is {actual[column]}, but the "
                f"sink's columns say {sql_type!r} ({declared[0]}): alter the table or change the columns"
            )


def add_column(
    conn: psycopg.Connection[Any], sink: str, table: PgTableConfig, column: str, sql_type: str
) -> None:
    """``ALTER TABLE … ADD COLUMN`` of a column the sink's columns gained, as a nullable column without a
    default (PostgreSQL then changes only the catalog, not a row), in its own transaction at plan time.

    Never inside a task's prepared transaction: the statement's lock would be held until the epoch
    commits and block every reader and every other task. Rows that earlier epochs wrote, and a replay of
    an earlier epoch by code that does not know the column, leave it null. The lock is waited for at
    most `LOCK_TIMEOUT_MS`: a prepared transaction of an unfinished epoch holds the table until it is
    recovered, and the plan then says so instead of hanging.
    """
    from psycopg import errors, sql

    statement = sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
        table_identifier(table.table), sql.Identifier(column), sql.SQL(sql_type)
    )
    try:
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{LOCK_TIMEOUT_MS}ms")))
            conn.execute(statement)
    except errors.LockNotAvailable as exc:
        raise ServiceUnavailable(
            f"sink {sink!r}: cannot add column {column!r} to table {table.table!r}: the table stayed locked "
            f"for {LOCK_TIMEOUT_MS} ms (a prepared transaction of an unfinished epoch, or another session): "
            "recover the pipeline's epoch in flight, then plan again"
        ) from exc
    LOG.info("sink %r: added column %s %s to table %s", sink, column, sql_type, table.table)


def pg_plan_checks(
    table_of: Callable[[Mapping[str, Any]], PgTableConfig], *, prepares: bool
) -> Callable[[Pipeline, Sequence[Mapping[str, Any]], int, bool], None]:
    """The plan checks of a PostgreSQL sink kind whose configs hold a `PgTableConfig` (``table_of``
    reads it); ``prepares`` kinds also need room for their prepared transactions."""

    def checks(
        spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
    ) -> None:
        by_server: dict[str, list[tuple[str, PgTableConfig]]] = {}
        for config in configs:
            table = table_of(config)
            by_server.setdefault(table.dsn, []).append((str(config["name"]), table))
        for dsn, tables in by_server.items():
            with _connect(tables[0][0], dsn) as conn:
                if prepares and parallel_tasks > 0:
                    check_prepared_room(conn, [name for name, _ in tables], dsn, parallel_tasks)
                for name, table in tables:
                    check_table(conn, name, table, apply)

    return checks
