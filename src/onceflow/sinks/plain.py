"""Plain PostgreSQL sink: rows are inserted during ``write()`` and are visible at once.

No staging and no transaction spanning the epoch: a replayed epoch inserts its rows again, so this sink
is at-least-once by design (it fills the "plain sink" row of the consistency table).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import PG_TABLE_SETTINGS, DirectWriterBase, NothingToCommit, PgTableConfig, copy_rows
from onceflow.sinks._pg_checks import pg_plan_checks
from onceflow.sinks.base import Row
from onceflow.sinks.registry import SinkKind, pg_defaults

KIND = "plain"


@dataclass(frozen=True)
class PlainConfig:
    """``dsn`` (default: the stack's), ``table``, ``columns`` (name -> SQL type), ``create_table``,
    ``batch_size``, ``name``."""

    table: PgTableConfig

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> PlainConfig:
        reader = ConfigReader(KIND, config)
        parsed = cls(table=PgTableConfig.read(reader))
        reader.finish()
        return parsed


def _as_config(config: PlainConfig | Mapping[str, Any]) -> PlainConfig:
    return config if isinstance(config, PlainConfig) else PlainConfig.from_mapping(config)


class PlainWriter(DirectWriterBase):
    kind = KIND

    def __init__(self, config: PlainConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        super().__init__(self.config.table)

    def write(self, rows: Iterable[Row]) -> None:
        values = self._values(rows)
        conn = self._conn
        assert conn is not None  # checked by _values
        for start in range(0, len(values), self.table.batch_size):
            copy_rows(conn, self.table, values[start : start + self.table.batch_size])


class PlainCommitter(NothingToCommit):
    """Nothing to do: the rows were visible as soon as they were written."""

    def __init__(self, config: PlainConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)


SINK_KIND = SinkKind(
    name=KIND,
    writer=PlainWriter,
    committer=PlainCommitter,
    guarantee="at_least_once",
    direct=True,
    defaults=pg_defaults,
    plan_checks=pg_plan_checks(lambda config: _as_config(config).table, prepares=False),
    settings=PG_TABLE_SETTINGS,
)
