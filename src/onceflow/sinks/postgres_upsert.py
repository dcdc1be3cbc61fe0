"""Idempotent PostgreSQL sink: ``INSERT ... ON CONFLICT (key columns) DO UPDATE`` during ``write()``.

Exactly-once by idempotence, not by transactions: a replayed epoch writes the same rows for the same
keys, so duplicates collapse. The price: rows are visible before the epoch commits, and an aborted epoch's
rows stay until its replay overwrites them. Commit and abort therefore have nothing to do.

With ``changes`` it applies a change stream (`onceflow.pipeline.Debezium`) the same way: a task keeps
the last change of each key in source order and, when it pre-commits, deletes the keys whose last change
is a delete and upserts the others, in one transaction, so an attempt that dies applies nothing and a
replayed task applies the same last changes again: deletes are idempotent too. Order between the changes
of one key holds only inside a task, so the plan asks that each partition's range be read by one task
(``max_records_per_task`` at least ``max_records_per_partition``; Debezium writes a key to one
partition); a truncate is refused in one line (`postgres_changes` applies it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.sinks._changes import CHANGE_COLUMNS
from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import (
    PG_TABLE_SETTINGS,
    DirectWriterBase,
    NothingToCommit,
    PgTableConfig,
    insert_rows,
    insert_statement,
)
from onceflow.sinks._pg_checks import pg_plan_checks
from onceflow.sinks.base import Committable, Row
from onceflow.sinks.errors import RowError
from onceflow.sinks.registry import SinkKind, SinkSetting, configured_columns, pg_defaults

if TYPE_CHECKING:
    from onceflow.pipeline import Pipeline

KIND = "postgres_upsert"


@dataclass(frozen=True)
class UpsertConfig:
    """``dsn`` (default: the stack's), ``table``, ``columns`` (name -> SQL type), ``key_columns`` (the
    conflict target; the created table's primary key), ``create_table``, ``batch_size``, ``name``."""

    table: PgTableConfig
    key_columns: tuple[str, ...]
    changes: bool = False

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> UpsertConfig:
        reader = ConfigReader(KIND, config)
        table = PgTableConfig.read(reader)
        keys = table.key_columns(reader)
        changes = reader.boolean("changes", False)
        reader.finish()
        clash = [c for c in CHANGE_COLUMNS if c in table.column_names]
        if changes and clash:
            raise ConfigError(f"{KIND} sink config columns: {clash} are the changes' own, not the table's")
        return cls(table=table, key_columns=keys, changes=changes)


def _as_config(config: UpsertConfig | Mapping[str, Any]) -> UpsertConfig:
    return config if isinstance(config, UpsertConfig) else UpsertConfig.from_mapping(config)


def collapse_by_key(
    values: Iterable[tuple[Any, ...]], columns: tuple[str, ...], key_columns: tuple[str, ...]
) -> list[tuple[Any, ...]]:
    """Keep the last row per key, in first-seen key order.

    One ``INSERT ... ON CONFLICT DO UPDATE`` may not touch a row twice, and the last write wins anyway.
    """
    positions = [columns.index(k) for k in key_columns]
    latest: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for v in values:
        latest[tuple(v[p] for p in positions)] = v
    return list(latest.values())


class UpsertWriter(DirectWriterBase):
    kind = KIND

    def __init__(self, config: UpsertConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        super().__init__(self.config.table, self.config.key_columns)
        # With ``changes``: per key, the last change so far: ((partition, offset), op, the row's values).
        self._last: dict[tuple[Any, ...], tuple[tuple[int, int], str, tuple[Any, ...]]] = {}

    def write(self, rows: Iterable[Row]) -> None:
        if self.config.changes:
            self._keep_last(rows)
            return
        values = self._values(rows)
        conn = self._conn
        assert conn is not None  # checked by _values
        statement = insert_statement(self.table, self.key_columns)
        names = self.table.column_names
        for start in range(0, len(values), self.table.batch_size):
            batch = values[start : start + self.table.batch_size]
            insert_rows(conn, statement, collapse_by_key(batch, names, self.key_columns))

    def _keep_last(self, rows: Iterable[Row]) -> None:
        where = f"{KIND} sink table {self.table.table}"
        changes: list[tuple[tuple[int, int], str]] = []
        images: list[dict[str, Any]] = []
        for row in rows:
            if not isinstance(row, Mapping) or any(c not in row for c in CHANGE_COLUMNS):
                raise RowError(f"{where}: a change's row needs {list(CHANGE_COLUMNS)}, got {row!r}")
            op = str(row["_op"])
            if op == "t":
                raise RowError(
                    f"{where}: a truncate is not applied by {KIND}; use the postgres_changes sink, which "
                    "applies it at the commit"
                )
            changes.append(((int(row["_partition"]), int(row["_offset"])), op))
            images.append({k: v for k, v in row.items() if k not in CHANGE_COLUMNS})
        positions = [self.table.column_names.index(k) for k in self.key_columns]
        for (place, op), values in zip(changes, self._values(images), strict=True):
            key = tuple(values[p] for p in positions)
            if None in key:
                raise RowError(
                    f"{where}: a change without its key {dict(zip(self.key_columns, key, strict=True))}"
                )
            kept = self._last.get(key)
            if kept is None or kept[0] < place:
                self._last[key] = (place, op, values)

    def pre_commit(self) -> Committable:
        if self.config.changes and self._conn is not None:
            self._apply()
        return super().pre_commit()

    def _apply(self) -> None:
        """The task's last change per key, in one transaction: deletes, then upserts."""
        from psycopg import sql

        from onceflow.sinks._pg import column_list, table_identifier

        conn = self._conn
        assert conn is not None
        deletes = [values for _, op, values in self._last.values() if op == "d"]
        upserts = [values for _, op, values in self._last.values() if op != "d"]
        positions = [self.table.column_names.index(k) for k in self.key_columns]
        delete = sql.SQL("DELETE FROM {} WHERE ({}) = ({})").format(
            table_identifier(self.table.table),
            column_list(self.key_columns),
            sql.SQL(", ").join(sql.Placeholder() * len(self.key_columns)),
        )
        with conn.transaction(), conn.cursor() as cur:
            if deletes:
                cur.executemany(delete, [tuple(v[p] for p in positions) for v in deletes])
            if upserts:
                cur.executemany(insert_statement(self.table, self.key_columns), upserts)
        self._last.clear()


class UpsertCommitter(NothingToCommit):
    """Nothing to commit or abort: every write was already final and idempotent."""

    def __init__(self, config: UpsertConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)


def _columns(config: Mapping[str, Any]) -> list[str] | None:
    """The table's columns, and with ``changes`` each change's op and source position."""
    columns = configured_columns(config)
    if columns is None or not config.get("changes"):
        return columns
    return [*columns, *CHANGE_COLUMNS]


_table_checks = pg_plan_checks(lambda config: _as_config(config).table, prepares=False)


def _plan_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    """With ``changes``: a change stream, read one task per partition and epoch; then the table's checks."""
    applying = [str(c["name"]) for c in configs if _as_config(c).changes]
    if applying:
        if getattr(spec.format, "changes", None) is None:
            raise ConfigError(
                f"sinks {applying} ({KIND}, changes=true) apply change events: give the format "
                "changes=Debezium(...), or leave changes out to upsert records"
            )
        if spec.max_records_per_task < spec.max_records_per_partition:
            raise ConfigError(
                f"sinks {applying} ({KIND}, changes=true) keep changes of a key in order only inside a read "
                f"task, and a partition's range may be split into tasks of {spec.max_records_per_task} "
                f"offsets: set max_records_per_task >= max_records_per_partition "
                f"({spec.max_records_per_partition}), or use postgres_changes, which orders them at commit"
            )
    _table_checks(spec, configs, parallel_tasks, apply)


SINK_KIND = SinkKind(
    name=KIND,
    writer=UpsertWriter,
    committer=UpsertCommitter,
    guarantee="exactly_once",
    direct=True,
    replaceable=True,
    defaults=pg_defaults,
    columns=_columns,
    plan_checks=_plan_checks,
    settings=(
        *PG_TABLE_SETTINGS,
        SinkSetting(
            "key_columns",
            "names",
            "the key among `columns`: a row overwrites the row with the same key (the created table's "
            "primary key)",
            required=True,
        ),
        SinkSetting(
            "changes",
            "boolean",
            "apply a change stream's ops: per task the last change of each key, deletes deleted, in one "
            "transaction at pre-commit (each partition read by one task per epoch; a truncate is refused)",
            default=False,
        ),
    ),
)
