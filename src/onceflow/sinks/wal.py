"""Write-ahead-log sink (after Flink's ``GenericWriteAheadSink``): at-least-once, on purpose.

Pre-commit keeps the task's rows durably in a staged JSON-lines file (standing in for the state backend);
commit pushes them into a plain PostgreSQL table with ordinary inserts, then deletes the log. The target
has no marker, so a crash after the push and before the delete pushes the rows again on recovery: this
sink exists to show that gap in the consistency table. Values must be JSON types (str, int, float, bool,
None); PostgreSQL casts them to the column types on insert.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.faults import crash_point
from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import (
    PG_TABLE_SETTINGS,
    PgTableConfig,
    RowDigest,
    create_table_if_missing,
    insert_rows,
    insert_statement,
    row_values,
)
from onceflow.sinks._pg_checks import pg_plan_checks
from onceflow.sinks.base import Committable, Row
from onceflow.sinks.errors import RowError, StagedOutputCorrupt, StagedOutputLost
from onceflow.sinks.registry import SinkKind, SinkSetting, pg_defaults
from onceflow.sinks.staging import StagedFileWriter, StagingArea, sha256_file

KIND = "wal"
LOG = "rows.jsonl"


@dataclass(frozen=True)
class WalConfig:
    """``root`` (folder for the logs), ``dsn`` (default: the stack's), ``table``, ``columns`` (name -> SQL
    type), ``create_table``, ``batch_size``, ``name``."""

    root: str
    table: PgTableConfig

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> WalConfig:
        reader = ConfigReader(KIND, config)
        parsed = cls(root=reader.path("root"), table=PgTableConfig.read(reader))
        reader.finish()
        return parsed


def _as_config(config: WalConfig | Mapping[str, Any]) -> WalConfig:
    return config if isinstance(config, WalConfig) else WalConfig.from_mapping(config)


def encode_row(values: tuple[Any, ...], where: str) -> bytes:
    try:
        return json.dumps(list(values), allow_nan=False, separators=(",", ":")).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        raise RowError(f"{where}: values must be JSON types (str, int, float, bool, None): {exc}") from exc


class WalWriter(StagedFileWriter):
    """Appends the task's rows to its log file; pre-commit fsyncs it and writes the manifest."""

    kind = KIND
    file_name = LOG

    def __init__(self, config: WalConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        super().__init__(Path(self.config.root))
        self._digest = RowDigest()

    def write(self, rows: Iterable[Row]) -> None:
        out = self._out()
        where = f"{KIND} sink table {self.config.table.table}"
        for row in rows:
            values = row_values(row, self.config.table.column_names, where)
            out.write(encode_row(values, where))
            self._digest.add(values)

    def pre_commit(self) -> Committable:
        task, folder = self._seal()
        return self._publish(
            Committable.for_task(
                task,
                handle={"file": LOG, "sha256": sha256_file(folder / LOG)},
                record_count=self._digest.count,
                checksum=self._digest.hexdigest(),
            )
        )


def _batches(path: Path, size: int) -> Iterator[list[tuple[Any, ...]]]:
    """A task log's rows, ``size`` at a time: the log is read as it is pushed, never held whole (a
    task's log is as large as its output, which the coordinator's memory need not be)."""
    with open(path, "rb") as log:
        rows: list[tuple[Any, ...]] = []
        for line in log:
            rows.append(tuple(json.loads(line)))
            if len(rows) == size:
                yield rows
                rows = []
        if rows:
            yield rows


class WalCommitter:
    """Pushes each log into the table, then deletes it. ``crash_hook("wal.pushed")`` runs in between
    (by default `onceflow.faults.crash_point`, inert unless a fault test arms it)."""

    def __init__(
        self, config: WalConfig | Mapping[str, Any], crash_hook: Callable[[str], None] | None = None
    ) -> None:
        self.config = _as_config(config)
        self._area = StagingArea(Path(self.config.root))
        self._hook = crash_hook or crash_point

    def commit(self, committables: Sequence[Committable]) -> None:
        """A missing log counts as pushed: it is deleted only after a push (the at-least-once side)."""
        import psycopg

        table = self.config.table
        with psycopg.connect(table.dsn, autocommit=True) as conn:
            if table.create_table:
                create_table_if_missing(conn, table)
            statement = insert_statement(table)
            for c in committables:
                if c.handle.get("incomplete"):
                    raise StagedOutputLost(f"{KIND}: {c.sink} epoch {c.epoch} {c.task} never pre-committed")
                folder = self._area.for_committable(c)
                path = folder / LOG
                if not path.exists():
                    continue
                if sha256_file(path) != c.handle.get("sha256"):
                    raise StagedOutputCorrupt(f"{KIND}: {path} does not match its pre-commit checksum")
                for rows in _batches(path, table.batch_size):
                    insert_rows(conn, statement, rows)
                self._hook("wal.pushed")
                self._area.remove(folder)

    def abort(self, committables: Sequence[Committable]) -> None:
        for c in committables:
            self._area.remove(self._area.for_committable(c))

    def orphans(self, pipeline: str) -> list[Committable]:
        return self._area.orphans(pipeline, self.config.table.name)


SINK_KIND = SinkKind(
    name=KIND,
    writer=WalWriter,
    committer=WalCommitter,
    guarantee="at_least_once",
    defaults=pg_defaults,
    plan_checks=pg_plan_checks(lambda config: _as_config(config).table, prepares=False),
    settings=(
        SinkSetting(
            "root", "path", "folder where tasks keep their rows until the commit pushes them", required=True
        ),
        *PG_TABLE_SETTINGS,
    ),
)
