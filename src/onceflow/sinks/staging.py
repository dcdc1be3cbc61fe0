"""Durable local staging shared by the file-based sinks (files, kafka, wal).

Layout: ``{root}/_staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}/``. An attempt folder
holds the staged data and, written last, ``manifest.json`` (the attempt's committable as JSON): a folder
without a manifest is an attempt that crashed before pre-commit finished. Every file and folder on the
way is fsynced, because pre-commit promises the coordinator that the output survives a crash.
No path under the root is followed through a symbolic link (`no_links`): a link planted in the staging
or the table would make a rename or a delete act outside the root.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from onceflow.names import check_name
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import UnsafePath, WriterStateError

MANIFEST = "manifest.json"
STAGING = "_staging"


def safe_name(what: str, name: object) -> str:
    """``name`` when it is one file or folder name: not empty, no separator, not ``.`` or ``..``."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise UnsafePath(f"{what} {name!r}: expected a single file or folder name (no '/', not '..')")
    return name


def safe_relative(what: str, name: object) -> str:
    """``name`` when it is a relative path that stays inside its folder: ``/``-separated names, none of
    them empty, ``.`` or ``..``."""
    if (
        not isinstance(name, str)
        or any(c in name for c in "\\\0")
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise UnsafePath(
            f"{what} {name!r}: expected a relative path inside its folder (no '..', not absolute)"
        )
    return name


def no_links(root: Path, path: Path, what: str) -> Path:
    """``path`` when it lies under ``root`` and none of its parts below ``root`` is a symbolic link (the
    root itself may be one: it is the deployment's choice). Checked before each write, rename or delete,
    since ``..`` and absolute names are refused by name, but a link is only seen on the filesystem."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise UnsafePath(f"{what} {path}: not under its root {root}") from None
    current = root
    for part in parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break  # nothing below it exists yet: the folders made next are real ones
        if stat.S_ISLNK(mode):
            raise UnsafePath(
                f"{what} {path}: {current} is a symbolic link, which could lead outside {root}: refused"
            )
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def make_dirs_durable(path: Path) -> None:
    """Create ``path`` and its missing parents, fsyncing each parent so the new entries survive a crash."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
        fsync_dir(folder.parent)


def write_durably(path: Path, data: bytes) -> None:
    """Write to a temporary name, fsync, rename over ``path`` and fsync the folder: all or nothing."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class StagingArea:
    """Where one sink's attempts are staged under ``root``."""

    root: Path

    def attempt_dir(self, pipeline: str, sink: str, epoch: int, task: str, attempt: str) -> Path:
        for what, value in (("pipeline", pipeline), ("sink", sink), ("task", task), ("attempt", attempt)):
            check_name(what, value)
        folder = self.root / STAGING / pipeline / sink / f"epoch={epoch}" / task / f"attempt-{attempt}"
        return no_links(self.root, folder, "staging folder")

    def for_task(self, task: TaskContext) -> Path:
        return self.attempt_dir(task.pipeline, task.sink, task.epoch, task.task, task.attempt)

    def for_committable(self, c: Committable) -> Path:
        return self.attempt_dir(c.pipeline, c.sink, c.epoch, c.task, c.attempt)

    def write_manifest(self, folder: Path, committable: Committable) -> None:
        write_durably(folder / MANIFEST, committable.to_json().encode())

    def remove(self, folder: Path) -> None:
        """Delete an attempt folder, then prune its emptied parents up to the pipeline folder."""
        no_links(self.root, folder, "staging folder")
        if folder.exists():
            shutil.rmtree(folder)
            fsync_dir(folder.parent)
        stop = self.root / STAGING
        parent = folder.parent
        while parent != stop and parent.is_relative_to(stop) and parent.exists():
            try:
                parent.rmdir()
            except OSError:
                break
            fsync_dir(parent.parent)
            parent = parent.parent

    def orphans(self, pipeline: str, sink: str | None = None) -> list[Committable]:
        """Every staged attempt of the pipeline (of one sink if given), complete or not.

        A complete attempt is described by its manifest. An incomplete one (no manifest) is rebuilt from
        its path with ``slice=-1`` and ``handle={"incomplete": True}``: enough for abort, never for commit.
        """
        base = self.root / STAGING / check_name("pipeline", pipeline)
        sink_dirs = (
            [base / check_name("sink", sink)] if sink else sorted(p for p in base.glob("*") if p.is_dir())
        )
        found: list[Committable] = []
        for sink_dir in sink_dirs:
            for folder in sorted(sink_dir.glob("epoch=*/*/attempt-*")):
                manifest = folder / MANIFEST
                if manifest.exists():
                    found.append(Committable.from_json(manifest.read_text()))
                    continue
                epoch_part = folder.parent.parent.name.removeprefix("epoch=")
                if not epoch_part.isdigit():
                    continue
                found.append(
                    Committable(
                        pipeline=pipeline,
                        epoch=int(epoch_part),
                        slice=-1,
                        task=folder.parent.name,
                        attempt=folder.name.removeprefix("attempt-"),
                        sink=sink_dir.name,
                        handle={"incomplete": True},
                    )
                )
        return found


class StagedFileWriter:
    """Base of the writers that append a task's encoded rows to one staged file (Kafka, write-ahead log).

    ``begin`` opens a fresh attempt folder, subclasses append through ``_out()``, and ``pre_commit``
    calls ``_seal()`` (flush, fsync the file and its folder) then ``_publish()`` (the manifest, written
    last, is what makes the attempt complete for the committer and the sweeper).
    """

    kind = "staged"
    file_name = "data"

    def __init__(self, root: Path) -> None:
        self._area = StagingArea(root)
        self._task: TaskContext | None = None
        self._dir: Path | None = None
        self._file: IO[bytes] | None = None
        self._done = False

    def begin(self, task: TaskContext) -> None:
        if self._task is not None:
            raise WriterStateError(f"{self.kind} writer: begin() called twice (for {task.txn_id})")
        folder = self._area.for_task(task)
        self._area.remove(folder)
        make_dirs_durable(folder)
        self._task, self._dir = task, folder
        self._file = open(folder / self.file_name, "wb")  # noqa: SIM115 - closed in pre_commit or abort

    def _out(self) -> IO[bytes]:
        if self._file is None or self._done:
            raise WriterStateError(f"{self.kind} writer: write needs begin() first and no pre_commit()")
        return self._file

    def _seal(self) -> tuple[TaskContext, Path]:
        if self._file is None or self._task is None or self._dir is None or self._done:
            raise WriterStateError(f"{self.kind} writer: pre_commit needs begin() first and only once")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        fsync_dir(self._dir)
        return self._task, self._dir

    def _publish(self, committable: Committable) -> Committable:
        assert self._dir is not None
        self._area.write_manifest(self._dir, committable)
        self._done = True
        return committable

    def abort(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._dir is not None:
            self._area.remove(self._dir)
