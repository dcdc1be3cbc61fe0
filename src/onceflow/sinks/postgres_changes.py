"""PostgreSQL mirror of a change stream: upserts and deletes applied by key, exactly once, at the commit.

A change stream (`onceflow.pipeline.Debezium`) can hold changes of one key in several tasks of an epoch:
a partition's range is split into read tasks. If each task applied its changes in its own prepared
transaction, a task would wait on another's row lock, which is only released when the epoch commits,
and the commit waits for every task: a deadlock, and the order between tasks lost. So the two halves
split differently from `postgres_2pc`:

* a **task** stages its changes, rows with their op and source position, in a staging table beside the
  target (``<table>_onceflow_changes``) inside its own prepared transaction, exactly as `postgres_2pc`
  stages rows (the same gids, markers and recovery). Staging rows have no key constraint, so tasks never
  wait on each other, and nothing reaches the target table;
* the **commit** commits the prepared transactions, then applies the epoch's changes in one transaction:
  per key the last change in source order (the highest offset of its partition; Debezium writes one key
  to one partition) wins, deletes are deleted, the rest upserted, a truncate empties the table before
  the changes after it in its partition. The same transaction writes the epoch's apply marker and
  deletes its staged rows, so a commit that is repeated, or recovered after a crash, applies nothing
  twice, and readers see the epoch's changes all at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import PG_TABLE_SETTINGS, PgTableConfig, column_list, run_ddl, table_identifier
from onceflow.sinks._pg_checks import pg_plan_checks
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.postgres_2pc import (
    PostgresTwoPhaseCommitter,
    PostgresTwoPhaseConfig,
    PostgresTwoPhaseWriter,
    ensure_marker_table,
)
from onceflow.sinks.registry import SinkKind, SinkSetting, pg_defaults

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

    from onceflow.pipeline import Pipeline

KIND = "postgres_changes"
# What a staged change carries beside the row's columns: its op and source position (from the row),
# and the pipeline and epoch it belongs to (from the task).
CHANGE_COLUMNS = (("_op", "text"), ("_partition", "integer"), ("_offset", "bigint"))
SCOPE_COLUMNS = (("_pipeline", "text"), ("_epoch", "bigint"))
# The marker task name of an epoch's apply step (task names are never this).
APPLY_TASK = "~apply"


@dataclass(frozen=True)
class ChangesConfig:
    """``table`` and ``columns`` of the target (its primary key made of ``key_columns``), the staging
    table (default ``<table>_onceflow_changes``), and what `postgres_2pc` takes for the staging."""

    target: PgTableConfig
    key_columns: tuple[str, ...]
    staging: PostgresTwoPhaseConfig

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ChangesConfig:
        reader = ConfigReader(KIND, config)
        target = PgTableConfig.read(reader)
        keys = target.key_columns(reader)
        clash = [n for n, _ in (*CHANGE_COLUMNS, *SCOPE_COLUMNS) if n in target.column_names]
        if clash:
            raise ConfigError(f"{KIND} sink config columns: {clash} are the staged changes' own")
        staging_name = reader.optional_string("staging_table") or f"{target.table}_onceflow_changes"
        marker = reader.string("marker_table", "onceflow_markers")
        lock_timeout_ms = reader.integer("lock_timeout_ms", 10_000, minimum=1)
        reader.finish()
        staging_table = replace(
            target, table=staging_name, columns=(*target.columns, *CHANGE_COLUMNS, *SCOPE_COLUMNS)
        )
        return cls(target, keys, PostgresTwoPhaseConfig(staging_table, marker, lock_timeout_ms))


def _as_config(config: ChangesConfig | Mapping[str, Any]) -> ChangesConfig:
    return config if isinstance(config, ChangesConfig) else ChangesConfig.from_mapping(config)


def ensure_tables(conn: psycopg.Connection[Any], config: ChangesConfig) -> None:
    """The target (its primary key the key columns, for the upserts) and the staging table."""
    from psycopg import sql

    target = config.target
    definitions = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in target.columns
    )
    run_ddl(
        conn,
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            table_identifier(target.table), definitions, column_list(config.key_columns)
        ),
    )
    staging = config.staging.table
    definitions = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in staging.columns
    )
    run_ddl(
        conn,
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(table_identifier(staging.table), definitions),
    )
    ensure_marker_table(conn, config.staging.marker_table)


class PostgresChangesWriter(PostgresTwoPhaseWriter):
    """Stages the task's changes in the staging table, in the task's prepared transaction."""

    def __init__(self, config: ChangesConfig | Mapping[str, Any]) -> None:
        self.changes = _as_config(config)
        super().__init__(self.changes.staging)

    def begin(self, task: TaskContext) -> None:
        import psycopg

        if self.changes.target.create_table:
            with psycopg.connect(self.changes.target.dsn, autocommit=True) as conn:
                ensure_tables(conn, self.changes)
        super().begin(task)

    def _scope(self) -> tuple[str, int]:
        _, task = self._require()
        return task.pipeline, task.epoch

    def write(self, rows: Iterable[Row]) -> None:
        pipeline, epoch = self._scope()
        super().write({**row, "_pipeline": pipeline, "_epoch": epoch} for row in rows)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        import pyarrow as pa

        pipeline, epoch = self._scope()
        n = batch.num_rows
        batch = batch.append_column("_pipeline", pa.array([pipeline] * n, pa.string()))
        super().write_batch(batch.append_column("_epoch", pa.array([epoch] * n, pa.int64())))

    def pre_commit(self) -> Committable:
        committable = super().pre_commit()
        return replace(committable, handle={**committable.handle, "table": self.changes.target.table})


class PostgresChangesCommitter:
    """Commits the staged changes' prepared transactions, then applies each epoch's changes once."""

    def __init__(self, config: ChangesConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        self.staged = PostgresTwoPhaseCommitter(self.config.staging)

    def commit(self, committables: Sequence[Committable]) -> None:
        self.staged.commit(committables)
        for pipeline, epoch, sink in sorted({(c.pipeline, c.epoch, c.sink) for c in committables}):
            self._apply(pipeline, epoch, sink)

    def abort(self, committables: Sequence[Committable]) -> None:
        self.staged.abort(committables)

    def orphans(self, pipeline: str) -> list[Committable]:
        return self.staged.orphans(pipeline)

    def _apply(self, pipeline: str, epoch: int, sink: str) -> None:
        """One transaction: the apply marker (none yet, or nothing to do), the epoch's deletes and
        upserts by key in source order, and the staged rows removed."""
        import psycopg
        from psycopg import errors, sql

        config = self.config
        target, staging = table_identifier(config.target.table), table_identifier(config.staging.table.table)
        marker = table_identifier(config.staging.marker_table)
        keys = column_list(config.key_columns)
        names = config.target.column_names
        others = [n for n in names if n not in config.key_columns]
        scope = sql.SQL("s._pipeline = %(pipeline)s AND s._epoch = %(epoch)s")
        # A change after which its partition has a truncate is gone with the table's rows.
        live = sql.SQL(
            "NOT EXISTS (SELECT 1 FROM {staging} t WHERE t._pipeline = s._pipeline AND t._epoch = s._epoch"
            " AND t._op = 't' AND t._partition = s._partition AND t._offset > s._offset)"
        ).format(staging=staging)
        last = sql.SQL(
            "SELECT DISTINCT ON ({keys}) * FROM {staging} s WHERE {scope} AND s._op <> 't' AND {live}"
            " ORDER BY {keys}, s._offset DESC"
        ).format(keys=keys, staging=staging, scope=scope, live=live)
        on_key = sql.SQL(" AND ").join(
            sql.SQL("t.{c} = l.{c}").format(c=sql.Identifier(k)) for k in config.key_columns
        )
        upsert_set = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(n)) for n in others)
            )
            if others
            else sql.SQL("DO NOTHING")
        )
        values = {"pipeline": pipeline, "epoch": epoch}
        with psycopg.connect(config.target.dsn, autocommit=True) as conn:
            ensure_tables(conn, config)
            try:
                with conn.transaction():
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} (pipeline, epoch, sink, task, attempt, record_count)"
                            " VALUES (%s, %s, %s, %s, 'apply', 0)"
                        ).format(marker),
                        [pipeline, epoch, sink, APPLY_TASK],
                    )
                    truncated = conn.execute(
                        sql.SQL("SELECT count(*) FROM {} s WHERE {} AND s._op = 't'").format(staging, scope),
                        values,
                    ).fetchone()
                    if truncated is not None and truncated[0]:
                        conn.execute(sql.SQL("DELETE FROM {}").format(target))
                    conn.execute(
                        sql.SQL(
                            "DELETE FROM {target} t USING ({last}) l WHERE l._op = 'd' AND {on_key}"
                        ).format(target=target, last=last, on_key=on_key),
                        values,
                    )
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {target} ({names}) SELECT {names} FROM ({last}) l WHERE l._op <> 'd'"
                            " ON CONFLICT ({keys}) {upsert}"
                        ).format(
                            target=target, names=column_list(names), last=last, keys=keys, upsert=upsert_set
                        ),
                        values,
                    )
                    conn.execute(sql.SQL("DELETE FROM {} s WHERE {}").format(staging, scope), values)
            except errors.UniqueViolation:
                return  # applied before: a repeated commit applies nothing twice


def _columns(config: Mapping[str, Any]) -> list[str]:
    """The rows this sink takes: the target's columns and the change's op and source position."""
    from onceflow.sinks.registry import configured_columns

    return [*(configured_columns(config) or []), *(n for n, _ in CHANGE_COLUMNS)]


def _plan_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    """Only a change stream has ops to apply; then both tables get PostgreSQL's checks."""
    from onceflow.pipeline import AvroFormat, JsonFormat

    if not isinstance(spec.format, JsonFormat | AvroFormat) or spec.format.changes is None:
        names = [str(c["name"]) for c in configs]
        raise ConfigError(
            f"sinks {names} ({KIND}) apply change events by key: give the format changes=Debezium(...), "
            "or use postgres_2pc or postgres_upsert for records"
        )
    _target_checks(spec, configs, parallel_tasks, apply)
    _staging_checks(spec, configs, parallel_tasks, apply)


# The target gets the checks (and new columns) of any PostgreSQL table; the staging table too, and the
# room for the tasks' prepared transactions.
_target_checks = pg_plan_checks(lambda config: _as_config(config).target, prepares=False)
_staging_checks = pg_plan_checks(lambda config: _as_config(config).staging.table, prepares=True)


SINK_KIND = SinkKind(
    name=KIND,
    writer=PostgresChangesWriter,
    committer=PostgresChangesCommitter,
    guarantee="exactly_once",
    defaults=pg_defaults,
    columns=_columns,
    plan_checks=_plan_checks,
    settings=(
        *PG_TABLE_SETTINGS,
        SinkSetting(
            "key_columns",
            "names",
            "the columns that identify a row: the target's primary key, what changes are applied by",
            required=True,
        ),
        SinkSetting(
            "staging_table",
            "string",
            "where tasks stage their changes until the commit applies them",
            default_from="`<table>_onceflow_changes`",
        ),
        SinkSetting(
            "marker_table", "string", "table of commit and apply markers", default="onceflow_markers"
        ),
        SinkSetting(
            "lock_timeout_ms",
            "integer",
            "how long a task attempt waits for another attempt of the same task that holds its marker",
            default=10_000,
            minimum=1,
        ),
    ),
)
