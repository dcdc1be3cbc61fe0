"""Idempotent PostgreSQL sink: ``INSERT ... ON CONFLICT (key columns) DO UPDATE`` during ``write()``.

Exactly-once by idempotence, not by transactions: a replayed epoch writes the same rows for the same
keys, so duplicates collapse. The price: rows are visible before the epoch commits, and an aborted epoch's
rows stay until its replay overwrites them. Commit and abort therefore have nothing to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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
from onceflow.sinks.base import Row
from onceflow.sinks.registry import SinkKind, SinkSetting, pg_defaults

KIND = "postgres_upsert"


@dataclass(frozen=True)
class UpsertConfig:
    """``dsn`` (default: the stack's), ``table``, ``columns`` (name -> SQL type), ``key_columns`` (the
    conflict target; the created table's primary key), ``create_table``, ``batch_size``, ``name``."""

    table: PgTableConfig
    key_columns: tuple[str, ...]

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> UpsertConfig:
        reader = ConfigReader(KIND, config)
        table = PgTableConfig.read(reader)
        keys = table.key_columns(reader)
        reader.finish()
        return cls(table=table, key_columns=keys)


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

    def write(self, rows: Iterable[Row]) -> None:
        values = self._values(rows)
        conn = self._conn
        assert conn is not None  # checked by _values
        statement = insert_statement(self.table, self.key_columns)
        names = self.table.column_names
        for start in range(0, len(values), self.table.batch_size):
            batch = values[start : start + self.table.batch_size]
            insert_rows(conn, statement, collapse_by_key(batch, names, self.key_columns))


class UpsertCommitter(NothingToCommit):
    """Nothing to commit or abort: every write was already final and idempotent."""

    def __init__(self, config: UpsertConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)


SINK_KIND = SinkKind(
    name=KIND,
    writer=UpsertWriter,
    committer=UpsertCommitter,
    guarantee="exactly_once",
    direct=True,
    replaceable=True,
    defaults=pg_defaults,
    plan_checks=pg_plan_checks(lambda config: _as_config(config).table, prepares=False),
    settings=(
        *PG_TABLE_SETTINGS,
        SinkSetting(
            "key_columns",
            "names",
            "the key among `columns`: a row overwrites the row with the same key (the created table's "
            "primary key)",
            required=True,
        ),
    ),
)
