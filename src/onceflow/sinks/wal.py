"""Write-ahead-log sink (after Flink's ``GenericWriteAheadSink``): at-least-once, on purpose.

Pre-commit keeps the task's rows durably in a staged JSON-lines file (standing in for the state backend);
commit pushes them into a plain PostgreSQL table with ordinary inserts, then deletes the log. The target
has no marker, so a crash after the push and before the delete pushes the rows again on recovery: this
sink exists to show that gap in the consistency table. Flat values must be JSON types (str, int, float,
bool, None); PostgreSQL casts them to the column types on insert.

Nested values (structs, arrays, maps) are stored as the other PostgreSQL sinks store them
(`onceflow.sinks._pg.NestedValues`): ``jsonb`` (and ``json``, text, an unknown type) as their JSON,
PostgreSQL arrays and composite types field by field. The log holds each nested value as that JSON
(`json_text`: timestamps ISO-8601, decimals exact numbers, bytes base64, maps objects), read back with
exact decimals; the writer checks the value against the table's column types as the other sinks do
(a value that does not fit fails the task, not the commit), and the commit turns it into the column's
value with the same code. A table without nested values is never asked for its types.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.faults import crash_point
from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import (
    PG_TABLE_SETTINGS,
    NestedValues,
    PgTableConfig,
    RowDigest,
    create_table_if_missing,
    insert_rows,
    insert_statement,
    is_nested,
    json_text,
    row_values,
    table_identifier,
    table_types,
)
from onceflow.sinks._pg_checks import pg_plan_checks
from onceflow.sinks.base import Committable, Row
from onceflow.sinks.errors import RowError, StagedOutputCorrupt, StagedOutputLost
from onceflow.sinks.registry import SinkKind, SinkSetting, pg_defaults
from onceflow.sinks.staging import LocalStaging, StagedFileWriter, sha256_file
from onceflow.storage.s3 import is_s3

if TYPE_CHECKING:
    import psycopg

    from onceflow.schemas import SchemaType

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
        if is_s3(config.get("root")):
            raise ConfigError(
                f"{KIND} sink config root={config['root']!r}: the write-ahead log is kept in a local "
                "folder only (an s3:// root is for the kafka sink's staging); give a local path"
            )
        parsed = cls(root=reader.path("root"), table=PgTableConfig.read(reader))
        reader.finish()
        return parsed


def _as_config(config: WalConfig | Mapping[str, Any]) -> WalConfig:
    return config if isinstance(config, WalConfig) else WalConfig.from_mapping(config)


def encode_row(
    values: tuple[Any, ...],
    where: str,
    names: Sequence[str] = (),
    row_types: Mapping[str, SchemaType] | None = None,
) -> bytes:
    """One log line: the row's values as a JSON array, a nested value as its JSON (`json_text`, with
    the column's row type when the sink's columns give one); ``names`` are the columns, in order."""
    if not any(is_nested(v) for v in values):
        try:
            return json.dumps(list(values), allow_nan=False, separators=(",", ":")).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            raise RowError(
                f"{where}: values must be JSON types (str, int, float, bool, None): {exc}"
            ) from exc
    types = row_types or {}
    parts = []
    for at, value in enumerate(values):
        name = names[at] if at < len(names) else str(at)
        if is_nested(value):
            parts.append(json_text(value, name, where, types.get(name)))
            continue
        try:
            parts.append(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise RowError(
                f"{where} column {name}: values must be JSON types (str, int, float, bool, None): {exc}"
            ) from exc
    return ("[" + ",".join(parts) + "]\n").encode()


class LoggedNumber(Decimal):
    """A number with a fraction or an exponent as the log holds it: its exact value, and the text it was
    written as, which `json_text` writes again (a decimal keeps its digits and scale, a float its
    shortest text, so the column gets the JSON the other sinks give it)."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> LoggedNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number

    def __str__(self) -> str:
        return self.text


def decode_row(line: bytes) -> tuple[Any, ...]:
    """A log line's values: numbers inside nested values exact (`LoggedNumber`), a flat number as it
    was written (a float is the float ``json.dumps`` wrote)."""
    values = json.loads(line, parse_float=LoggedNumber)
    return tuple(float(v) if isinstance(v, Decimal) else v for v in values)


def nested_values(conn: psycopg.Connection[Any], table: PgTableConfig, where: str) -> NestedValues:
    """What turns a row's nested values into the table's column values (its types read on ``conn``,
    which also dumps its composite types); the log's values are JSON already, so no row types."""
    return NestedValues(
        table.column_names, table_types(conn, table_identifier(table.table).as_string(conn)), where
    )


class WalWriter(StagedFileWriter):
    """Appends the task's rows to its log file; pre-commit fsyncs it and writes the manifest."""

    kind = KIND
    file_name = LOG

    def __init__(self, config: WalConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        super().__init__(LocalStaging(Path(self.config.root)))
        self._digest = RowDigest()
        self._nested: NestedValues | None = None  # the table's types, read at the first nested value

    def write(self, rows: Iterable[Row]) -> None:
        out = self._out()
        table = self.config.table
        where = f"{KIND} sink table {table.table}"
        row_types = dict(table.row_types)
        for row in rows:
            values = row_values(row, table.column_names, where)
            if any(is_nested(v) for v in values):
                self._checks().row(values)  # a value that does not fit fails here, as in the other sinks
            out.write(encode_row(values, where, table.column_names, row_types))
            self._digest.add(values)

    def _checks(self) -> NestedValues:
        """The table's column types, read once (the table made first, as the commit would make it)."""
        if self._nested is None:
            import psycopg

            table = self.config.table
            with psycopg.connect(table.dsn, autocommit=True) as conn:
                if table.create_table:
                    create_table_if_missing(conn, table)
                types = table_types(conn, table_identifier(table.table).as_string(conn))
            self._nested = NestedValues(
                table.column_names, types, f"{KIND} sink table {table.table}", dict(table.row_types)
            )
        return self._nested

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
            rows.append(decode_row(line))
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
        self._area = LocalStaging(Path(self.config.root))
        self._hook = crash_hook or crash_point

    def commit(self, committables: Sequence[Committable]) -> None:
        """A missing log counts as pushed: it is deleted only after a push (the at-least-once side)."""
        import psycopg

        table = self.config.table
        with psycopg.connect(table.dsn, autocommit=True) as conn:
            if table.create_table:
                create_table_if_missing(conn, table)
            statement = insert_statement(table)
            nested: NestedValues | None = None
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
                    if any(is_nested(v) for row in rows for v in row):
                        nested = nested or nested_values(conn, table, f"{KIND} sink table {table.table}")
                        rows = [nested.row(row) for row in rows]
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
            "root",
            "path",
            "local folder where tasks keep their rows until the commit pushes them",
            required=True,
        ),
        *PG_TABLE_SETTINGS,
    ),
)
