"""Parquet files sink: one Parquet file per task attempt, made visible by a commit-log entry per epoch.

The commit log, not the folder listing, defines the table: a reader (`read_committed_table`) lists
``{table}/_onceflow_log/``, applies its entries in epoch order (each entry's ``adds`` minus what later
entries ``remove``) and reads only the files that leaves, so a staged or half-committed epoch is never
read. In ``mode: append`` (the default) commits only add; in ``mode: replace`` each epoch's entry
removes every file live before it, so the table always holds the last committed epoch's output (how
keyed state snapshots are kept), and files removed by an entry are deleted when the next one is written,
so a reader that listed the table just before a commit can still read them. A table belongs to one
(pipeline, sink).

``root`` is a local folder or an ``s3://bucket/prefix`` URL:

* a folder: tasks stage under ``_staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}/``
  (``part-00000.parquet`` and ``manifest.json``, see `staging`); the commit moves each file with an
  atomic rename to ``{table}/epoch={n}/{task}.parquet`` and writes the entry
  ``{table}/_onceflow_log/{n:020d}.json``. Nothing under the root is reached through a symbolic link
  (`staging.no_links`);
* a bucket (`_files_objects`): an object store has no rename (a copy would move every byte again), so
  tasks write straight to ``{table}/epoch={n}/{pipeline}/{sink}/{task}-{attempt}.parquet``, unseen
  until an entry names it, and the commit point is the entry itself, put create-only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from onceflow.errors import ConfigError
from onceflow.names import check_name
from onceflow.sinks._arrow import utc_times
from onceflow.sinks._files_objects import (
    ObjectFilesCommitter,
    ObjectFilesWriter,
    committed_objects,
    read_object_log,
)
from onceflow.sinks._files_parquet import EMPTY_SHA256, ParquetTaskWriter
from onceflow.sinks._files_table import (
    KIND,
    LOG_DIR,
    MODES,
    CommitLogEntry,
    FilesConfig,
    by_epoch,
    is_log_entry_name,
    live_files,
    log_entry_name,
    removes_for,
)
from onceflow.sinks._files_table import as_config as _as_config
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import AlreadyCommitted, ConflictingAttempt, StagedOutputCorrupt, StagedOutputLost
from onceflow.sinks.registry import SinkKind, SinkSetting
from onceflow.sinks.staging import (
    LocalStaging,
    fsync_dir,
    fsync_file,
    make_dirs_durable,
    no_links,
    safe_name,
    sha256_file,
    write_durably,
)
from onceflow.storage.s3 import S3Settings, is_s3

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "KIND",
    "LOG_DIR",
    "MODES",
    "PART",
    "SINK_KIND",
    "CommitLogEntry",
    "FilesCommitter",
    "FilesConfig",
    "FilesWriter",
    "ObjectFilesCommitter",
    "ObjectFilesWriter",
    "committed_files",
    "committed_path",
    "files_committer",
    "files_writer",
    "log_entry_path",
    "read_commit_log",
    "read_committed_table",
]

PART = "part-00000.parquet"


def committed_path(table_dir: Path, epoch: int, task: str) -> Path:
    return table_dir / f"epoch={int(epoch)}" / f"{safe_name(f'{KIND}: epoch {epoch} task', task)}.parquet"


def log_entry_path(table_dir: Path, epoch: int) -> Path:
    return table_dir / LOG_DIR / log_entry_name(epoch)


def read_commit_log(table_dir: str | os.PathLike[str], s3: S3Settings | None = None) -> list[CommitLogEntry]:
    """The entries of the table at ``table_dir`` (a folder, or an ``s3://`` URL reached with ``s3``) in
    epoch order; temporary files of an interrupted log write are not entries."""
    if is_s3(table_dir):
        return read_object_log(str(table_dir), s3)
    log = Path(table_dir) / LOG_DIR
    if not log.is_dir():
        return []
    return [
        CommitLogEntry.from_json(p.read_text()) for p in sorted(log.iterdir()) if is_log_entry_name(p.name)
    ]


@overload
def committed_files(table_dir: Path, s3: None = None) -> list[Path]: ...


@overload
def committed_files(table_dir: str, s3: S3Settings | None = None) -> list[str]: ...


def committed_files(table_dir: str | Path, s3: S3Settings | None = None) -> list[Path] | list[str]:
    """The table's live files: every log entry's adds minus later removes, in commit order. Given a
    `Path`, local paths; given a string (a folder, or an ``s3://`` URL reached with ``s3``), strings."""
    if is_s3(table_dir):
        return committed_objects(str(table_dir), s3)
    found = [Path(table_dir) / name for name in live_files(read_commit_log(table_dir))]
    return found if isinstance(table_dir, Path) else [str(p) for p in found]


def read_committed_table(root: str | os.PathLike[str], table: str, s3: S3Settings | None = None) -> pa.Table:
    """The committed content of ``table`` under ``root`` (a folder, or an ``s3://`` URL reached with
    ``s3``): only files named in its commit log, never staged ones."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_name("table", table)
    filesystem: Any = None
    if is_s3(root):
        from onceflow.storage.store import Store

        store = Store.for_location(str(root), s3)
        filesystem = store.fs
        paths = [store.path(uri) for uri in committed_objects(f"{str(root).rstrip('/')}/{table}", s3)]
    else:
        paths = [str(p) for p in committed_files(Path(root) / table)]
    if not paths:
        return pa.table({})
    # Files of one table may differ where a task's rows never showed a type (an empty list is list<null>
    # there): "permissive" unifies them at any depth.
    tables = [pq.read_table(p, filesystem=filesystem) for p in paths]
    return pa.concat_tables(utc_times(tables), promote_options="permissive")


def _local(config: FilesConfig, other: str) -> FilesConfig:
    """``config`` when its root is a folder; an ``s3://`` root is written by another class."""
    if config.in_bucket:
        raise ConfigError(f"{KIND} sink root {config.root}: an s3:// root is {other}'s (see files_writer)")
    return config


def _local_fs() -> Any:
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


class FilesWriter(ParquetTaskWriter):
    """Stages the task's output as one Parquet file in the attempt's staging folder of a local root.

    Rows and batches become the file as `ParquetTaskWriter` writes them. The committable's checksum is
    the file's SHA-256, so it says what was staged whichever way it came (``sha256(b"")`` for a task
    without rows). An ``s3://`` root is `ObjectFilesWriter`'s (`files_writer` picks the one that fits).
    """

    def __init__(self, config: FilesConfig | Mapping[str, Any]) -> None:
        super().__init__(_local(_as_config(config), "ObjectFilesWriter"))
        self._area = LocalStaging(Path(self.config.root))
        self._dir: Path | None = None

    def begin(self, task: TaskContext) -> None:
        folder = self._area.for_task(task)
        self._start(task, _local_fs(), str(folder / PART))
        self._area.remove(folder)  # a leftover of the same attempt id is never mixed into this one
        make_dirs_durable(folder)
        self._dir = folder

    def pre_commit(self) -> Committable:
        self._require()
        assert self._dir is not None
        written = self._finish()
        files: list[dict[str, Any]] = []
        checksum = EMPTY_SHA256
        if written is not None:
            fsync_file(self._dir / PART)
            fsync_dir(self._dir)
            checksum = written.sha256
            files.append({"name": PART, "rows": written.rows, "sha256": checksum})
        committable = self._committable({"table": self.config.table, "files": files}, checksum)
        self._area.write_manifest(self._dir, committable)
        self._done = True
        return committable

    def abort(self) -> None:
        self._drop_file()
        if self._dir is not None:
            self._area.remove(self._dir)


class FilesCommitter:
    """Moves staged files into the table with ``os.replace``, then appends the epoch's log entry."""

    def __init__(self, config: FilesConfig | Mapping[str, Any]) -> None:
        self.config = _local(_as_config(config), "ObjectFilesCommitter")
        self._area = LocalStaging(Path(self.config.root))

    def commit(self, committables: Sequence[Committable]) -> None:
        """Steps per epoch: 1. move every task's file (skipping files already moved), 2. write the log
        entry atomically, 3. delete the staging. A crash anywhere is repaired by calling commit again."""
        table_dir = self.config.table_dir
        for epoch, group in by_epoch(committables).items():
            moved = {id(c): self._move(c, table_dir) for c in group}
            first = group[0]
            earlier = [e for e in read_commit_log(table_dir) if e.epoch < epoch]
            path = self._inside(log_entry_path(table_dir, epoch), "commit log entry")
            kept: tuple[str, ...] = ()
            kept_rows = 0
            if path.exists():
                # The entry of an epoch committed before: this commit adds its files to it and drops
                # none (the sweeper re-commits a committed epoch's winners one at a time).
                existing = CommitLogEntry.from_json(path.read_text())
                kept, kept_rows = existing.adds, existing.record_count
            new = [c for c in group if not set(moved[id(c)]) <= set(kept)]
            entry = CommitLogEntry(
                epoch=epoch,
                pipeline=first.pipeline,
                sink=first.sink,
                adds=tuple(sorted({*kept, *(name for c in group for name in moved[id(c)])})),
                removes=removes_for(earlier, self.config.mode, first.replaces),
                record_count=kept_rows + sum(c.record_count for c in new),
            )
            if path.exists():
                entry.check_owner(existing, self.config.table)
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


def files_writer(config: FilesConfig | Mapping[str, Any]) -> FilesWriter | ObjectFilesWriter:
    """The writer for ``config``'s root: a folder's (`FilesWriter`) or a bucket's (`ObjectFilesWriter`)."""
    parsed = _as_config(config)
    return ObjectFilesWriter(parsed) if parsed.in_bucket else FilesWriter(parsed)


def files_committer(config: FilesConfig | Mapping[str, Any]) -> FilesCommitter | ObjectFilesCommitter:
    """The committer for ``config``'s root: a folder's (`FilesCommitter`) or a bucket's."""
    parsed = _as_config(config)
    return ObjectFilesCommitter(parsed) if parsed.in_bucket else FilesCommitter(parsed)


def _delete_removed(
    table_dir: Path, entries: Sequence[CommitLogEntry], inside: Callable[[Path, str], Path]
) -> None:
    """Compaction: delete the files that ``entries`` removed and that no entry brought back (each
    checked by ``inside`` first)."""
    live = set(live_files(entries))
    for entry in entries:
        for name in entry.removes:
            if name not in live:
                inside(table_dir / name, "removed file").unlink(missing_ok=True)


SINK_KIND = SinkKind(
    name=KIND,
    writer=files_writer,
    committer=files_committer,
    guarantee="exactly_once",
    replaceable=True,
    settings=(
        SinkSetting(
            "root",
            "path",
            "folder that holds the table, and the staging under `_staging/`; or an `s3://bucket/prefix` URL "
            "(kept as it is), reached with the `AWS_*` settings: tasks then write their files in place and "
            "each commit is a create-only log entry",
            required=True,
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
