"""Parquet files sink: staged per task attempt, committed by atomic rename plus a commit-log entry.

Layout under ``root``:

* staging: ``_staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}/part-00000.parquet`` and
  ``manifest.json`` (see `staging`);
* table: ``{table}/epoch={n}/{task}.parquet``, made visible by ``{table}/_onceflow_log/{n:020d}.json``.

The commit log, not the folder listing, defines the table: a reader (`read_committed_table`) reads only
files named by log entries, so a staged or half-moved epoch is never read. A log entry lists the files
it ``adds`` and the files it ``removes``. In ``mode: append`` (the default) commits only add; in
``mode: replace`` each epoch's entry removes every file live before it, so the table always holds the
last committed epoch's output (how keyed state snapshots are kept), and files removed by older entries
are deleted one epoch later, so a reader that listed the table just before a commit can still read them.
A table belongs to one (pipeline, sink). Nothing under ``root`` is reached through a symbolic link
(`staging.no_links`): the table, its ``epoch=N`` folders, files and log are real paths under the root.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.names import check_name
from onceflow.sinks._arrow import (
    as_declared,
    as_inferred,
    declared_type,
    exact_columns,
    merged_type,
    unique_names,
    utc_times,
    widened_decimals,
)
from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import row_values
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.errors import (
    AlreadyCommitted,
    ConflictingAttempt,
    RowError,
    StagedOutputCorrupt,
    StagedOutputLost,
    WriterStateError,
)
from onceflow.sinks.registry import SinkKind, SinkSetting
from onceflow.sinks.staging import (
    StagingArea,
    fsync_dir,
    fsync_file,
    make_dirs_durable,
    no_links,
    safe_name,
    safe_relative,
    sha256_file,
    write_durably,
)

if TYPE_CHECKING:
    import pyarrow as pa

KIND = "files"
PART = "part-00000.parquet"
LOG_DIR = "_onceflow_log"
MODES = ("append", "replace")


@dataclass(frozen=True)
class FilesConfig:
    """``root`` (folder), ``table`` (folder name under root), ``columns`` (optional name -> Arrow type
    alias such as ``int64`` or ``string``, or a type text of `onceflow.schemas` such as
    ``array<struct<sku:string,qty:int>>`` or ``map<string,int>?``; inferred from the rows when absent;
    an alias keeps Arrow's meaning, so ``float`` there is Arrow's float32), ``batch_size`` (rows per
    Parquet row group), ``mode`` ("append" or "replace": whether an epoch's commit keeps or replaces
    what the table holds), ``name`` (the sink name, narrowing ``orphans``)."""

    root: str
    table: str
    columns: tuple[tuple[str, str], ...] = ()
    batch_size: int = 10_000
    mode: str = "append"
    name: str | None = None

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> FilesConfig:
        reader = ConfigReader(KIND, config)
        parsed = cls(
            root=reader.path("root"),
            table=check_name("files sink config table", reader.string("table")),
            columns=reader.columns(required=False),
            batch_size=reader.integer("batch_size", 10_000, minimum=1),
            mode=reader.string("mode", "append"),
            name=reader.optional_string("name"),
        )
        if parsed.mode not in MODES:
            raise ConfigError(f"files sink config mode={parsed.mode!r}: expected one of {MODES}")
        parsed.arrow_schema()
        reader.finish()
        return parsed

    def arrow_schema(self) -> pa.Schema | None:
        if not self.columns:
            return None
        import pyarrow as pa

        where = "files sink config columns"
        return pa.schema([pa.field(n, declared_type(text, f"{where}: {n}")) for n, text in self.columns])

    @property
    def table_dir(self) -> Path:
        return Path(self.root) / self.table


def _as_config(config: FilesConfig | Mapping[str, Any]) -> FilesConfig:
    return config if isinstance(config, FilesConfig) else FilesConfig.from_mapping(config)


def committed_path(table_dir: Path, epoch: int, task: str) -> Path:
    return table_dir / f"epoch={int(epoch)}" / f"{safe_name(f'{KIND}: epoch {epoch} task', task)}.parquet"


def log_entry_path(table_dir: Path, epoch: int) -> Path:
    return table_dir / LOG_DIR / f"{epoch:020d}.json"


@dataclass(frozen=True)
class CommitLogEntry:
    """One committed epoch of a table: files (relative to the table folder) it adds and removes."""

    epoch: int
    pipeline: str
    sink: str
    adds: tuple[str, ...]
    removes: tuple[str, ...] = ()
    record_count: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "epoch": self.epoch,
                "pipeline": self.pipeline,
                "sink": self.sink,
                "adds": list(self.adds),
                "removes": list(self.removes),
                "record_count": self.record_count,
            },
            sort_keys=True,
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> CommitLogEntry:
        """An entry as written by `to_json`; a file name that would lead outside the table (``..``, an
        absolute path) is refused, since readers open and compaction deletes the files named."""
        data = json.loads(text)
        epoch = int(data["epoch"])
        where = f"{KIND}: commit log entry of epoch {epoch}"
        return cls(
            epoch=epoch,
            pipeline=data["pipeline"],
            sink=data["sink"],
            adds=tuple(safe_relative(f"{where} adds", name) for name in data["adds"]),
            removes=tuple(safe_relative(f"{where} removes", name) for name in data.get("removes", ())),
            record_count=int(data.get("record_count", 0)),
        )


def read_commit_log(table_dir: Path) -> list[CommitLogEntry]:
    """Entries in epoch order; temporary files of an interrupted log write are not entries."""
    log = table_dir / LOG_DIR
    if not log.is_dir():
        return []
    return [CommitLogEntry.from_json(p.read_text()) for p in sorted(log.glob("[0-9]*.json"))]


def _live(entries: Iterable[CommitLogEntry]) -> list[str]:
    """Every entry's adds minus later removes, in commit order (relative names)."""
    live: dict[str, None] = {}
    for entry in entries:
        for name in entry.removes:
            live.pop(name, None)
        for name in entry.adds:
            live[name] = None
    return list(live)


def committed_files(table_dir: Path) -> list[Path]:
    """The table's live files: every log entry's adds minus later removes, in commit order."""
    return [table_dir / name for name in _live(read_commit_log(table_dir))]


def read_committed_table(root: str | os.PathLike[str], table: str) -> pa.Table:
    """The committed content of ``table``: only files named in its commit log, never staged ones."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = committed_files(Path(root) / check_name("table", table))
    if not files:
        return pa.table({})
    # Files of one table may differ where a task's rows never showed a type (an empty list is list<null>
    # there): "permissive" unifies them at any depth.
    return pa.concat_tables(utc_times([pq.read_table(f) for f in files]), promote_options="permissive")


class FilesWriter:
    """Stages the task's output as one Parquet file in the attempt's staging folder.

    Rows (``write``) and Arrow batches (``write_batch``) become the same file: row groups of exactly
    ``batch_size`` rows (the last one smaller), the declared schema or else the one the data infers,
    nullable columns. An inferred schema grows where earlier data had no type (an empty list, an
    all-null field: `merged_type`), rewriting the row groups already written, which is rare and keeps one
    file per task; any other change is an error that asks for `columns`. The committable's checksum is
    the file's SHA-256, so it says what was staged whichever way it came (``sha256(b"")`` for a task
    without rows).
    """

    def __init__(self, config: FilesConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        self._area = StagingArea(Path(self.config.root))
        self._task: TaskContext | None = None
        self._dir: Path | None = None
        self._schema = self.config.arrow_schema()
        self._declared = self._schema is not None
        self._rows: list[Row] = []  # rows not yet in Arrow form: converted batch_size at a time
        self._pending: list[pa.Table] = []  # Arrow data not yet in a row group
        self._pending_rows = 0
        self._parquet: Any = None
        self._count = 0
        self._done = False
        self._where = f"{KIND} sink table {self.config.table}"

    def begin(self, task: TaskContext) -> None:
        if self._task is not None:
            raise WriterStateError(f"{KIND} writer: begin() called twice (for {task.txn_id})")
        folder = self._area.for_task(task)
        self._area.remove(folder)  # a leftover of the same attempt id is never mixed into this one
        make_dirs_durable(folder)
        self._task, self._dir = task, folder

    def write(self, rows: Iterable[Row]) -> None:
        task = self._require()
        names = tuple(n for n, _ in self.config.columns)
        where = f"{KIND} sink {task.sink} table {self.config.table}"
        for row in rows:
            if not isinstance(row, Mapping):
                raise RowError(f"{where}: a row must be a mapping, got {type(row).__name__}")
            if names:
                row_values(row, names, where)
            self._rows.append(row)
            self._count += 1
            if len(self._rows) + self._pending_rows >= self.config.batch_size:
                self._rows_to_arrow()
                self._write_full_groups()

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Stage an Arrow batch as `write` stages its rows, without a Python object per value."""
        import pyarrow as pa

        self._require()
        self._rows_to_arrow()
        if not self._declared:
            names = unique_names(batch, self._where)
            arrays = [as_inferred(c, self._where) for c in batch.columns]
            inferred = pa.Table.from_arrays(arrays, names=names)
            if self._schema is None or inferred.schema == self._schema:
                self._add(inferred)
                self._count += batch.num_rows
                self._write_full_groups()
                return
            self._grow(inferred.schema)
            batch = pa.RecordBatch.from_arrays(arrays, names=names)
        assert self._schema is not None
        names = list(self._schema.names)
        batch = exact_columns(batch, tuple(names), self._where)
        types = [f.type for f in self._schema]
        arrays = [as_declared(c, t, self._where) for c, t in zip(batch.columns, types, strict=True)]
        self._add(pa.Table.from_arrays(arrays, names=names))
        self._count += batch.num_rows
        self._write_full_groups()

    def _require(self) -> TaskContext:
        if self._task is None or self._done:
            raise WriterStateError(f"{KIND} writer: write/pre_commit needs begin() first and no pre_commit()")
        return self._task

    def _rows_to_arrow(self) -> None:
        """Buffered rows as one Arrow table, typed by the declared or established schema if any."""
        import pyarrow as pa

        if not self._rows:
            return
        rows, self._rows = self._rows, []
        try:
            if self._declared:
                table = pa.Table.from_pylist(rows, schema=self._schema)
            else:
                table = self._inferred(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise RowError(f"{self._where}: rows do not fit: {exc}") from exc
        self._add(table)

    def _inferred(self, rows: list[Row]) -> pa.Table:
        """Rows as Arrow data of the schema their values infer, grown into the established one."""
        import pyarrow as pa

        try:
            table = widened_decimals(pa.Table.from_pylist(rows))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if self._schema is None:
                raise
            # e.g. a map as (key, value) pairs, which only a known map type reads
            return pa.Table.from_pylist(rows, schema=self._schema)
        if self._schema is None or table.schema == self._schema:
            return table
        self._grow(table.schema)
        return pa.Table.from_pylist(rows, schema=self._schema)

    def _grow(self, found: pa.Schema) -> None:
        """Make the established schema hold data of schema ``found`` too (`merged_type`): pending data is
        cast, and a file already begun is rewritten in the same row groups; else a `RowError`."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self._schema is not None
        merged = merged_type(pa.struct(list(self._schema)), pa.struct(list(found)))
        if merged is None:
            raise RowError(
                f"{self._where}: rows changed schema from {_one_line(self._schema)} to {_one_line(found)}; "
                "declare `columns` in the sink config (nested types as text, e.g. map<string,int> for "
                "a dict of varying keys)"
            )
        target = pa.schema([merged.field(i) for i in range(merged.num_fields)])
        if target == self._schema:
            return
        self._pending = [t.cast(target) for t in self._pending]
        if self._parquet is not None:  # every group written so far is a full one: the same groups again
            assert self._dir is not None
            self._parquet.close()
            part, rewritten = self._dir / PART, self._dir / f"{PART}.grown"
            written = pq.read_table(part, schema=self._schema).cast(target)
            self._parquet = pq.ParquetWriter(rewritten, target)
            for start in range(0, written.num_rows, self.config.batch_size):
                self._parquet.write_table(written.slice(start, self.config.batch_size))
            os.replace(rewritten, part)
        self._schema = target

    def _add(self, table: pa.Table) -> None:
        if self._schema is None:
            self._schema = table.schema
        elif table.schema != self._schema:
            raise RowError(
                f"{self._where}: rows changed schema from {self._schema} to {table.schema}; "
                "declare `columns` in the sink config"
            )
        self._pending.append(table)
        self._pending_rows += table.num_rows

    def _write_full_groups(self, final: bool = False) -> None:
        """Write pending data in row groups of ``batch_size`` rows; with ``final``, the rest too."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        size = self.config.batch_size
        if self._pending_rows < (1 if final else size):
            return
        assert self._dir is not None and self._schema is not None
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self._dir / PART, self._schema)
        start = 0
        while table.num_rows - start >= size or (final and start < table.num_rows):
            self._parquet.write_table(table.slice(start, size))
            start += size
        rest = table.slice(start)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def pre_commit(self) -> Committable:
        task = self._require()
        assert self._dir is not None
        self._rows_to_arrow()
        self._write_full_groups(final=True)
        files: list[dict[str, Any]] = []
        checksum = hashlib.sha256().hexdigest()
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
            part = self._dir / PART
            fsync_file(part)
            fsync_dir(self._dir)
            checksum = sha256_file(part)
            files.append({"name": PART, "rows": self._count, "sha256": checksum})
        committable = Committable.for_task(
            task,
            handle={"table": self.config.table, "files": files},
            record_count=self._count,
            checksum=checksum,
        )
        self._area.write_manifest(self._dir, committable)
        self._done = True
        return committable

    def abort(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._dir is not None:
            self._area.remove(self._dir)


def _one_line(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


class FilesCommitter:
    """Moves staged files into the table with ``os.replace``, then appends the epoch's log entry."""

    def __init__(self, config: FilesConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        self._area = StagingArea(Path(self.config.root))

    def commit(self, committables: Sequence[Committable]) -> None:
        """Steps per epoch: 1. move every task's file (skipping files already moved), 2. write the log
        entry atomically, 3. delete the staging. A crash anywhere is repaired by calling commit again."""
        table_dir = self.config.table_dir
        for epoch, group in _by_epoch(committables).items():
            adds: list[str] = []
            for c in group:
                adds.extend(self._move(c, table_dir))
            first = group[0]
            earlier = [e for e in read_commit_log(table_dir) if e.epoch < epoch]
            live = _live(earlier)
            # Replace mode drops everything; a replacement of earlier epochs (a re-run data interval)
            # drops what those epochs added.
            replaced = {name for e in earlier if e.epoch in first.replaces for name in e.adds}
            entry = CommitLogEntry(
                epoch=epoch,
                pipeline=first.pipeline,
                sink=first.sink,
                adds=tuple(sorted(adds)),
                removes=tuple(live if self.config.mode == "replace" else [n for n in live if n in replaced]),
                record_count=sum(c.record_count for c in group),
            )
            path = self._inside(log_entry_path(table_dir, epoch), "commit log entry")
            if path.exists():
                existing = CommitLogEntry.from_json(path.read_text())
                if (existing.pipeline, existing.sink) != (entry.pipeline, entry.sink):
                    raise ConflictingAttempt(
                        f"{KIND}: table {self.config.table} epoch {epoch} was committed by "
                        f"{existing.pipeline}/{existing.sink}, not {entry.pipeline}/{entry.sink}"
                    )
            make_dirs_durable(path.parent)
            write_durably(path, entry.to_json().encode())
            for c in group:
                self._area.remove(self._area.for_committable(c))
            _delete_removed(table_dir, earlier, self._inside)

    def _inside(self, path: Path, what: str) -> Path:
        """``path`` when no part of it below the root is a symbolic link: a linked ``epoch=N`` folder
        would make the commit's rename (or an abort's delete) act outside the root."""
        return no_links(Path(self.config.root), path, f"{KIND} sink table {self.config.table}: {what}")

    def _move(self, c: Committable, table_dir: Path) -> list[str]:
        if c.handle.get("incomplete"):
            raise StagedOutputLost(f"{KIND}: {c.sink} epoch {c.epoch} {c.task} never pre-committed")
        staged_dir = self._area.for_committable(c)
        moved = []
        for spec in c.handle.get("files", []):
            source = staged_dir / safe_name(
                f"{KIND}: {c.sink} epoch {c.epoch} {c.task} staged file", spec["name"]
            )
            target = self._inside(committed_path(table_dir, c.epoch, c.task), "committed file")
            if source.exists():
                if sha256_file(source) != spec["sha256"]:
                    raise StagedOutputCorrupt(f"{KIND}: {source} does not match its pre-commit checksum")
                make_dirs_durable(target.parent)
                os.replace(source, target)
                fsync_dir(target.parent)
                fsync_dir(source.parent)
            elif target.exists():
                if sha256_file(target) != spec["sha256"]:
                    raise ConflictingAttempt(f"{KIND}: {target} is another attempt's, not {c.attempt}'s")
            else:
                raise StagedOutputLost(f"{KIND}: neither {source} nor {target} exists: staged output is gone")
            moved.append(target.relative_to(table_dir).as_posix())
        return moved

    def abort(self, committables: Sequence[Committable]) -> None:
        """Delete the attempts' staging; refuse when the epoch's log entry names their files."""
        table_dir = self.config.table_dir
        for c in committables:
            target = self._inside(committed_path(table_dir, c.epoch, c.task), "committed file")
            entry_path = log_entry_path(table_dir, c.epoch)
            specs = c.handle.get("files", [])
            if specs and target.exists() and sha256_file(target) == specs[0]["sha256"]:
                logged = entry_path.exists() and target.relative_to(table_dir).as_posix() in (
                    CommitLogEntry.from_json(entry_path.read_text()).adds
                )
                if logged:
                    raise AlreadyCommitted(f"{KIND}: {target} is committed (epoch {c.epoch} log entry)")
                target.unlink()  # moved by an interrupted commit but never logged: not visible, undo it
                fsync_dir(target.parent)
            self._area.remove(self._area.for_committable(c))

    def orphans(self, pipeline: str) -> list[Committable]:
        return self._area.orphans(pipeline, self.config.name)


def _delete_removed(
    table_dir: Path, entries: Sequence[CommitLogEntry], inside: Callable[[Path, str], Path]
) -> None:
    """Compaction: delete the files that ``entries`` removed and that no entry brought back (each
    checked by ``inside`` first)."""
    live = set(_live(entries))
    for entry in entries:
        for name in entry.removes:
            if name not in live:
                inside(table_dir / name, "removed file").unlink(missing_ok=True)


def _by_epoch(committables: Sequence[Committable]) -> dict[int, list[Committable]]:
    groups: dict[int, list[Committable]] = {}
    for c in sorted(committables, key=lambda c: (c.epoch, c.task)):
        groups.setdefault(c.epoch, []).append(c)
    return groups


SINK_KIND = SinkKind(
    name=KIND,
    writer=FilesWriter,
    committer=FilesCommitter,
    guarantee="exactly_once",
    replaceable=True,
    settings=(
        SinkSetting(
            "root", "path", "folder that holds the table, and the staging under `_staging/`", required=True
        ),
        SinkSetting(
            "table",
            "string",
            "the table's folder under `root` (letters, digits, `_`, `.`, `-`)",
            required=True,
        ),
        SinkSetting(
            "columns",
            "columns",
            "the Parquet schema, `{name: type}`: an Arrow type such as `int64`, `double`, `string`, `bool` "
            "(Arrow's meaning: `float` is float32), or a row type's text such as "
            "`array<struct<sku:string,qty:int>>`, `map<string,int>?`, `decimal(10,2)`, `timestamp` (UTC); "
            "all nullable",
            default_from="inferred from the rows",
        ),
        SinkSetting("batch_size", "integer", "rows per Parquet row group", default=10_000, minimum=1),
        SinkSetting(
            "mode",
            "string",
            "`append`: each commit adds the epoch's files; `replace`: each commit replaces what the table "
            "holds",
            default="append",
            choices=MODES,
        ),
    ),
)
