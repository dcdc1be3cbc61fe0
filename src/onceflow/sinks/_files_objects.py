"""The `files` sink on an ``s3://bucket/prefix`` root: task files written in place, a create-only log
entry as the commit point.

An object store has no rename: moving a staged file into the table would be a copy of every byte and a
delete, and a copy is no atomic step that a crash can be repaired around. So each attempt writes its
Parquet file once, straight to a name of its own in the table, and nothing but the commit log decides
whether a reader sees it. Layout under the root:

* data: ``{table}/epoch={n}/{pipeline}/{sink}/{task}-{attempt}.parquet``, streamed through pyarrow's S3
  file system: the attempt is in the name because attempts of one task write side by side, the pipeline
  and sink because the name is final, so no other writer of the table may ever write over it;
* markers: ``_staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}.json`` (the local staging's
  folder, `staging.STAGING`; `_markers`): written when an attempt begins (an
  incomplete committable) and rewritten by its pre-commit (the full one); what the sweeper lists;
* log: ``{table}/_onceflow_log/{n:020d}.json``, one entry per committed epoch (`CommitLogEntry`).

The commit puts the epoch's entry with ``If-None-Match: *``: of two committers of one epoch exactly one
wins, and an entry already there is either this commit made before (same pipeline and sink, naming
every file this commit adds: nothing to do) or another's (`ConflictingAttempt`). Markers go after the
entry, so a crash in between leaves markers that the next commit, or the sweeper, deletes. Abort
deletes an attempt's file and marker unless the epoch's entry names the file. Compaction deletes the
files the previous entry removed.

Tasks import this module (the writer), so it imports no ledger or coordinator code. Data and markers
go through pyarrow's S3 file system; boto3 only makes the create-only put and the deletes by name (in a
task, only when it aborts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from onceflow import redact
from onceflow.errors import ConfigError
from onceflow.faults import crash_point
from onceflow.names import check_name
from onceflow.sinks._files_parquet import EMPTY_SHA256, ParquetTaskWriter
from onceflow.sinks._files_table import (
    KIND,
    LOG_DIR,
    CommitLogEntry,
    FilesConfig,
    as_config,
    by_epoch,
    is_log_entry_name,
    live_files,
    log_entry_name,
    removes_for,
)
from onceflow.sinks._markers import list_markers, marker_uri
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import AlreadyCommitted, StagedOutputCorrupt, StagedOutputLost
from onceflow.sinks.staging import STAGING
from onceflow.storage.s3 import ObjectExists, S3Settings, delete_objects, join
from onceflow.storage.store import Store


def data_name(c: TaskContext | Committable) -> str:
    """An attempt's file, relative to the table: ``epoch={n}/{pipeline}/{sink}/{task}-{attempt}.parquet``.
    Pipeline and sink are in the path because the file is written at its final name: another writer of
    the table (a misconfigured second pipeline, whose commit will be refused) must never overwrite it."""
    parts = (("pipeline", c.pipeline), ("sink", c.sink), ("task", c.task), ("attempt", c.attempt))
    pipeline, sink, task, attempt = (check_name(what, value) for what, value in parts)
    return f"epoch={int(c.epoch)}/{pipeline}/{sink}/{task}-{attempt}.parquet"


def marker_of(root: str, c: TaskContext | Committable) -> str:
    """An attempt's marker: ``{root}/_staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}.json``."""
    return marker_uri(root, STAGING, c)


def log_uri(table_uri: str, epoch: int) -> str:
    return join(table_uri, LOG_DIR, log_entry_name(epoch))


@contextlib.contextmanager
def _said(what: str, where: str) -> Iterator[None]:
    """A store's error in one line naming the object, never a credential; a missing object stays
    `FileNotFoundError`."""
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception as exc:
        if not _store_error(exc):
            raise
        raise OSError(f"{KIND} sink: {what} {where} failed: {redact.text(exc)}") from None


def _store_error(exc: Exception) -> bool:
    """pyarrow's errors are `OSError`s; boto3's (the committer's) are imported only when one happens,
    so that tasks never import botocore."""
    if isinstance(exc, OSError):
        return True
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return False
    return isinstance(exc, BotoCoreError | ClientError)


def _entry_uris(store: Store, table_uri: str) -> list[str]:
    """The log's entries in epoch order (names are zero-padded epochs)."""
    log = join(table_uri, LOG_DIR)
    with _said("listing", log):
        uris = store.files_under(log)
    return [u for u in uris if "/" not in u[len(log) + 1 :] and is_log_entry_name(u.rsplit("/", 1)[1])]


def _read_entry(store: Store, uri: str) -> CommitLogEntry:
    with _said("reading", uri):
        return CommitLogEntry.from_json(store.read(uri).decode())


def read_object_log(table_uri: str, s3: S3Settings | None = None) -> list[CommitLogEntry]:
    """The entries of the table at ``table_uri`` (``s3://bucket/prefix/table``), in epoch order."""
    store = Store.for_location(table_uri, s3)
    return [_read_entry(store, uri) for uri in _entry_uris(store, table_uri)]


def committed_objects(table_uri: str, s3: S3Settings | None = None) -> list[str]:
    """The table's live objects as ``s3://`` URLs: the reader rule (`live_files`) over its log."""
    return [join(table_uri, name) for name in live_files(read_object_log(table_uri, s3))]


def _bucket_config(config: FilesConfig | Mapping[str, Any]) -> FilesConfig:
    parsed = as_config(config)
    if not parsed.in_bucket:
        raise ConfigError(f"{KIND} sink root {parsed.root}: not an s3:// root (see files_writer)")
    return parsed


class ObjectFilesWriter(ParquetTaskWriter):
    """Writes the task's Parquet file straight to its attempt's name in the table (see the module).

    Same rows, schema and row groups as the local writer (`ParquetTaskWriter`). The committable names
    the file relative to the table, with its rows, size and SHA-256 (computed as the bytes stream out:
    content-defined, unlike an ETag, which for a multipart upload depends on the part size and the
    server); its checksum is that SHA-256 (``sha256(b"")`` for a task without rows, which writes no
    file).
    """

    def __init__(self, config: FilesConfig | Mapping[str, Any]) -> None:
        super().__init__(_bucket_config(config))
        self._store = Store.for_location(self.config.root, self.config.s3)

    def begin(self, task: TaskContext) -> None:
        uri = join(self.config.table_uri, data_name(task))
        self._start(task, self._store.fs, self._store.path(uri))
        marker = marker_of(self.config.root, task)
        with _said("writing", marker):  # first, so that the sweeper finds an attempt that dies
            self._store.write(
                marker, Committable.for_task(task, handle={"incomplete": True}).to_json().encode()
            )

    def pre_commit(self) -> Committable:
        task = self._require()
        with _said("writing", join(self.config.table_uri, data_name(task))):
            written = self._finish()
        files: list[dict[str, Any]] = []
        if written is not None:
            files.append(
                {
                    "name": data_name(task),
                    "rows": written.rows,
                    "size": written.size,
                    "sha256": written.sha256,
                }
            )
        checksum = written.sha256 if written is not None else EMPTY_SHA256
        committable = self._committable({"table": self.config.table, "files": files}, checksum)
        marker = marker_of(self.config.root, task)
        with _said("writing", marker):
            self._store.write(marker, committable.to_json().encode())
        self._done = True
        return committable

    def abort(self) -> None:
        self._drop_file()
        if self._task is None:
            return
        for uri in (
            join(self.config.table_uri, data_name(self._task)),
            marker_of(self.config.root, self._task),
        ):
            with _said("deleting", uri):
                self._store.delete_file(uri)


class ObjectFilesCommitter:
    """Commits an epoch with one create-only log entry; aborts by deleting attempts' files and markers."""

    def __init__(self, config: FilesConfig | Mapping[str, Any]) -> None:
        self.config = _bucket_config(config)
        self._store = Store.for_location(self.config.root, self.config.s3)
        self._table = self.config.table_uri

    def commit(self, committables: Sequence[Committable]) -> None:
        """Per epoch: 1. if its entry exists, judge it (`check_done_by`); else 2. check every named
        file is there whole (`StagedOutputLost`, `StagedOutputCorrupt`), 3. put the entry create-only (a
        lost race is judged as in 1.); then 4. delete the markers and 5. the files the previous entry
        removed. A crash anywhere is repaired by calling commit again."""
        for epoch, group in by_epoch(committables).items():
            first = group[0]
            specs = [self._spec(c) for c in group]
            adds = tuple(sorted(spec["name"] for spec in specs if spec))
            proposed = CommitLogEntry(epoch, first.pipeline, first.sink, adds)
            found = self._entry(epoch)
            if found is None:
                self._check_files([s for s in specs if s], epoch)
                earlier = self._entries_before(epoch) if self._needs_history(first) else []
                entry = CommitLogEntry(
                    epoch=epoch,
                    pipeline=first.pipeline,
                    sink=first.sink,
                    adds=adds,
                    removes=removes_for(earlier, self.config.mode, first.replaces),
                    record_count=sum(c.record_count for c in group),
                )
                try:
                    with _said("writing", log_uri(self._table, epoch)):
                        self._store.create(log_uri(self._table, epoch), entry.to_json().encode())
                    crash_point("files.logged")
                except ObjectExists:
                    found = self._entry(epoch)
            if found is not None:
                proposed.check_done_by(found, self.config.table)
            self._delete([marker_of(self.config.root, c) for c in group])
            self._compact(epoch)

    def _spec(self, c: Committable) -> Mapping[str, Any] | None:
        """The attempt's one file as its committable names it (None: no rows), checked to be its own."""
        if c.handle.get("incomplete"):
            raise StagedOutputLost(f"{KIND}: {c.sink} epoch {c.epoch} {c.task} never pre-committed")
        specs = list(c.handle.get("files", []))
        if not specs:
            return None
        spec: Mapping[str, Any] = specs[0]
        if len(specs) > 1 or spec.get("name") != data_name(c):
            raise StagedOutputCorrupt(
                f"{KIND}: {c.sink} epoch {c.epoch} {c.task} attempt {c.attempt} names files "
                f"{[s.get('name') for s in specs]}, not its own {data_name(c)}"
            )
        return spec

    def _check_files(self, specs: Sequence[Mapping[str, Any]], epoch: int) -> None:
        """Every file about to be committed exists, with the size its writer saw: a reader of the
        entry must find what it names."""
        import pyarrow.fs as pafs

        paths = [self._store.path(join(self._table, s["name"])) for s in specs]
        with _said("checking", f"epoch {epoch}'s files in {self._table}"):
            infos = self._store.fs.get_file_info(paths) if paths else []
        for spec, info in zip(specs, infos, strict=True):
            uri = join(self._table, spec["name"])
            if info.type != pafs.FileType.File:
                raise StagedOutputLost(f"{KIND}: {uri} is gone: epoch {epoch}'s output is lost")
            if info.size != int(spec["size"]):
                raise StagedOutputCorrupt(
                    f"{KIND}: {uri} holds {info.size} bytes, not the {spec['size']} its writer wrote"
                )

    def _needs_history(self, first: Committable) -> bool:
        """Whether the entry removes anything, which only the earlier entries tell."""
        return self.config.mode == "replace" or bool(first.replaces)

    def _entry(self, epoch: int) -> CommitLogEntry | None:
        try:
            return _read_entry(self._store, log_uri(self._table, epoch))
        except FileNotFoundError:
            return None

    def _entries_before(self, epoch: int) -> list[CommitLogEntry]:
        return [e for e in read_object_log(self._table, self.config.s3) if e.epoch < epoch]

    def _compact(self, epoch: int) -> None:
        """Delete the files removed by the entry before ``epoch``'s: a reader that listed the log before
        this commit has had them until now. Names hold their epoch and attempt, so none comes back; a
        crash before this step is repaired by the commit's retry, which does it again."""
        uris = _entry_uris(self._store, self._table)
        before = [u for u in uris if u < log_uri(self._table, epoch)]
        if before:
            removed = _read_entry(self._store, before[-1]).removes
            self._delete([join(self._table, name) for name in removed])

    def _delete(self, uris: Sequence[str]) -> None:
        """Delete objects by name (`delete_objects`: no folder object left behind in ``_staging/``)."""
        if uris:
            assert self.config.s3 is not None
            delete_objects(self.config.s3, list(uris))

    def abort(self, committables: Sequence[Committable]) -> None:
        """Delete the attempts' files and markers; refuse (`AlreadyCommitted`) when the epoch's entry
        names the attempt's file. The name comes from the attempt's identity, not from its handle, so an
        incomplete committable (rebuilt from a marker's path) is aborted the same way."""
        entries: dict[int, CommitLogEntry | None] = {}
        doomed: list[str] = []
        for c in committables:
            if c.epoch not in entries:
                entries[c.epoch] = self._entry(c.epoch)
            entry = entries[c.epoch]
            if entry is not None and data_name(c) in entry.adds:
                raise AlreadyCommitted(
                    f"{KIND}: {join(self._table, data_name(c))} is committed (epoch {c.epoch} log entry)"
                )
            doomed += [join(self._table, data_name(c)), marker_of(self.config.root, c)]
        self._delete(doomed)

    def orphans(self, pipeline: str) -> list[Committable]:
        """Every attempt of the pipeline with a marker (of this sink, when it is named)."""
        with _said("listing", f"{self.config.root}/{STAGING}/{pipeline}"):
            return list_markers(self._store, self.config.root, STAGING, pipeline, self.config.name)
