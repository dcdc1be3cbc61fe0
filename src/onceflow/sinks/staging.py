"""Durable staging shared by the file-based sinks (files, kafka, wal): one layout, two backends.

Layout: ``{root}/_staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}/``. An attempt folder
holds the staged data and, written last, ``manifest.json`` (the attempt's committable as JSON): a folder
without a manifest is an attempt that crashed before pre-commit finished. `StagingArea` holds what both
backends share (the layout, the sweep for orphans); they differ in how the bytes are kept:

* `LocalStaging`, a local folder: every file and folder on the way is fsynced, because pre-commit
  promises the coordinator that the output survives a crash. No path under the root is followed through
  a symbolic link (`no_links`): a link planted in the staging or the table would make a rename or a
  delete act outside the root.
* `ObjectStaging`, an ``s3://bucket/prefix`` root, for a committer on another host than the tasks: the
  staged data is streamed into one object (shown only once it is whole), the manifest is one put after
  it. An attempt killed before its data object was whole leaves no object to sweep (at most an unfinished
  multipart upload, which the bucket's ``AbortIncompleteMultipartUpload`` lifecycle rule removes).
  Deletes name each object of the attempt, so no other attempt's object is ever touched, and no folder
  marker is left behind (pyarrow's deletes make one for the emptied parent).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from onceflow import redact
from onceflow.names import check_name
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import UnsafePath, WriterStateError
from onceflow.storage import s3

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
    with open(path, "rb") as f:
        return sha256_of(f)


def sha256_of(f: Any) -> str:
    """The SHA-256 of what a binary file-like object holds from where it stands, read in blocks."""
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def staging_area(root: str, settings: s3.S3Settings | None = None) -> StagingArea[Any]:
    """The staging under ``root``: in a bucket for an ``s3://`` root (reached with ``settings``), in a
    local folder otherwise."""
    if s3.is_s3(root):
        return ObjectStaging(root, settings or s3.S3Settings())
    return LocalStaging(Path(root))


Location = TypeVar("Location")


class StagedOutput:
    """The file a task appends its encoded data to, hashed as it is written: the committable's checksum
    without reading the file (or the object) back."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._digest = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> None:
        self._digest.update(data)
        self.stream.write(data)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


@dataclass(frozen=True)
class StagedAttempt:
    """One attempt folder found by a sweep: where it is in the layout, and its manifest if it has one."""

    sink: str
    epoch: str  # the folder's ``epoch=N`` name
    task: str
    attempt: str  # the folder's ``attempt-X`` name
    manifest: str | None


class StagingArea(ABC, Generic[Location]):
    """Where one sink's attempts are staged: the layout and the sweep, whichever backend keeps the bytes
    (``Location`` is how the backend names a folder or a file: a `Path`, an ``s3://`` URL)."""

    @staticmethod
    def attempt_names(pipeline: str, sink: str, epoch: int, task: str, attempt: str) -> tuple[str, ...]:
        """The attempt folder's path below the root, each name checked."""
        for what, value in (("pipeline", pipeline), ("sink", sink), ("task", task), ("attempt", attempt)):
            check_name(what, value)
        return (STAGING, pipeline, sink, f"epoch={epoch}", task, f"attempt-{attempt}")

    @abstractmethod
    def attempt_dir(self, pipeline: str, sink: str, epoch: int, task: str, attempt: str) -> Location: ...

    def for_task(self, task: TaskContext) -> Location:
        return self.attempt_dir(task.pipeline, task.sink, task.epoch, task.task, task.attempt)

    def for_committable(self, c: Committable) -> Location:
        return self.attempt_dir(c.pipeline, c.sink, c.epoch, c.task, c.attempt)

    @abstractmethod
    def file(self, folder: Location, name: str) -> Location:
        """The file ``name`` of an attempt folder."""

    @abstractmethod
    def open_output(self, folder: Location, name: str) -> StagedOutput:
        """A fresh attempt folder's file ``name``, open for appending."""

    @abstractmethod
    def seal(self, output: StagedOutput, folder: Location) -> None:
        """Make what was written to ``output`` durable and whole (it is closed after)."""

    @abstractmethod
    def discard(self, output: StagedOutput) -> None:
        """Close ``output`` of an attempt being aborted (what it holds is removed with its folder)."""

    @abstractmethod
    def write_manifest(self, folder: Location, committable: Committable) -> None: ...

    @abstractmethod
    def exists(self, location: Location) -> bool: ...

    @abstractmethod
    def open_input(self, location: Location) -> contextlib.AbstractContextManager[Any]:
        """A staged file open for reading (``read(n)`` as a binary file has it)."""

    def checksum(self, location: Location) -> str:
        """The SHA-256 of a staged file, read in blocks."""
        with self.open_input(location) as f:
            return sha256_of(f)

    @abstractmethod
    def remove(self, folder: Location) -> None:
        """Delete an attempt folder and what it holds; nothing when it is gone already."""

    @abstractmethod
    def _attempts(self, pipeline: str, sink: str | None) -> Iterator[StagedAttempt]:
        """Every attempt folder of the pipeline (of one sink if given), in layout order."""

    def orphans(self, pipeline: str, sink: str | None = None) -> list[Committable]:
        """Every staged attempt of the pipeline (of one sink if given), complete or not.

        A complete attempt is described by its manifest. An incomplete one (no manifest) is rebuilt from
        its path with ``slice=-1`` and ``handle={"incomplete": True}``: enough for abort, never for commit.
        """
        check_name("pipeline", pipeline)
        if sink is not None:
            check_name("sink", sink)
        found: list[Committable] = []
        for staged in self._attempts(pipeline, sink):
            if staged.manifest is not None:
                found.append(Committable.from_json(staged.manifest))
                continue
            epoch_part = staged.epoch.removeprefix("epoch=")
            if not epoch_part.isdigit():
                continue
            found.append(
                Committable(
                    pipeline=pipeline,
                    epoch=int(epoch_part),
                    slice=-1,
                    task=staged.task,
                    attempt=staged.attempt.removeprefix("attempt-"),
                    sink=staged.sink,
                    handle={"incomplete": True},
                )
            )
        return found


@dataclass(frozen=True)
class LocalStaging(StagingArea[Path]):
    """Attempts staged in a local folder ``root``, fsynced on the way."""

    root: Path

    def attempt_dir(self, pipeline: str, sink: str, epoch: int, task: str, attempt: str) -> Path:
        folder = self.root.joinpath(*self.attempt_names(pipeline, sink, epoch, task, attempt))
        return no_links(self.root, folder, "staging folder")

    def file(self, folder: Path, name: str) -> Path:
        return folder / name

    def open_output(self, folder: Path, name: str) -> StagedOutput:
        make_dirs_durable(folder)
        return StagedOutput(open(folder / name, "wb"))  # closed by seal or discard

    def seal(self, output: StagedOutput, folder: Path) -> None:
        output.stream.flush()
        os.fsync(output.stream.fileno())
        output.stream.close()
        fsync_dir(folder)

    def discard(self, output: StagedOutput) -> None:
        if not output.stream.closed:
            output.stream.close()

    def write_manifest(self, folder: Path, committable: Committable) -> None:
        write_durably(folder / MANIFEST, committable.to_json().encode())

    def exists(self, location: Path) -> bool:
        return location.exists()

    def open_input(self, location: Path) -> contextlib.AbstractContextManager[Any]:
        return open(location, "rb")

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

    def _attempts(self, pipeline: str, sink: str | None) -> Iterator[StagedAttempt]:
        base = self.root / STAGING / pipeline
        sink_dirs = [base / sink] if sink else sorted(p for p in base.glob("*") if p.is_dir())
        for sink_dir in sink_dirs:
            for folder in sorted(sink_dir.glob("epoch=*/*/attempt-*")):
                manifest = folder / MANIFEST
                yield StagedAttempt(
                    sink=sink_dir.name,
                    epoch=folder.parent.parent.name,
                    task=folder.parent.name,
                    attempt=folder.name,
                    manifest=manifest.read_text() if manifest.exists() else None,
                )


class ObjectStaging(StagingArea[str]):
    """Attempts staged under an ``s3://bucket/prefix`` root: a data object streamed through pyarrow's
    S3 file system, then the manifest in one put (see the module's docstring)."""

    def __init__(self, root: str, settings: s3.S3Settings) -> None:
        from onceflow.storage.store import Store

        self.root = root.rstrip("/")
        self.settings = settings
        self.store = Store.for_location(self.root, settings)
        self._client: Any = None  # boto3's, for deletes; made at the first one

    def __repr__(self) -> str:
        return f"ObjectStaging({self.root!r})"

    def attempt_dir(self, pipeline: str, sink: str, epoch: int, task: str, attempt: str) -> str:
        return s3.join(self.root, *self.attempt_names(pipeline, sink, epoch, task, attempt))

    def file(self, folder: str, name: str) -> str:
        return s3.join(folder, safe_name("staged file", name))

    def open_output(self, folder: str, name: str) -> StagedOutput:
        path = self.store.path(self.file(folder, name))
        return StagedOutput(self._call("write", folder, lambda: self.store.fs.open_output_stream(path)))

    def seal(self, output: StagedOutput, folder: str) -> None:
        self._call("write", folder, output.stream.close)  # the upload completes: the object is whole

    def discard(self, output: StagedOutput) -> None:
        if not output.stream.closed:
            with contextlib.suppress(OSError):
                output.stream.close()

    def write_manifest(self, folder: str, committable: Committable) -> None:
        manifest = self.file(folder, MANIFEST)
        self._call("write", manifest, lambda: self.store.write(manifest, committable.to_json().encode()))

    def exists(self, location: str) -> bool:
        return bool(self._call("read", location, lambda: self.store.exists(location)))

    def open_input(self, location: str) -> contextlib.AbstractContextManager[Any]:
        path = self.store.path(location)
        return self._call(  # type: ignore[no-any-return]
            "read",
            location,
            lambda: self.store.fs.open_input_stream(path, compression=None, buffer_size=1 << 20),
        )

    def remove(self, folder: str) -> None:
        """Delete each object of the attempt folder by name (`s3.delete_objects`: no folder marker left)."""
        found = self._call("list", folder, lambda: self.store.files_under(folder))
        if found:
            if self._client is None:
                self._client = self.settings.client()
            self._call("delete", folder, lambda: s3.delete_objects(self.settings, found, self._client))

    def _attempts(self, pipeline: str, sink: str | None) -> Iterator[StagedAttempt]:
        base = s3.join(self.root, STAGING, pipeline, sink or "")
        found: dict[tuple[str, ...], set[str]] = {}
        for uri in self._call("list", base, lambda: self.store.files_under(base)):
            parts = uri[len(s3.join(self.root, STAGING, pipeline)) + 1 :].split("/")
            if len(parts) == 5 and parts[1].startswith("epoch=") and parts[3].startswith("attempt-"):
                found.setdefault(tuple(parts[:4]), set()).add(parts[4])
        for (sink_name, epoch, task, attempt), names in sorted(found.items()):
            manifest = None
            if MANIFEST in names:
                where = s3.join(self.root, STAGING, pipeline, sink_name, epoch, task, attempt, MANIFEST)
                manifest = self._call("read", where, partial(self.store.read, where)).decode()
            yield StagedAttempt(sink_name, epoch, task, attempt, manifest)

    def _call(self, what: str, where: str, call: Any) -> Any:
        """``call()``, an error of the store said in one line that names the object, never a credential."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call()
        except FileNotFoundError:
            raise
        except (OSError, BotoCoreError, ClientError) as exc:
            raise OSError(f"staging {what} at {where} failed: {redact.text(exc)}") from None


class StagedFileWriter:
    """Base of the writers that append a task's encoded rows to one staged file (Kafka, write-ahead log).

    ``begin`` opens a fresh attempt folder, subclasses append through ``_out()``, and ``pre_commit``
    calls ``_seal()`` (the file made durable and whole: flushed and fsynced with its folder, or its
    object's upload completed) then ``_publish()`` (the manifest, written last, is what makes the attempt
    complete for the committer and the sweeper).
    """

    kind = "staged"
    file_name = "data"

    def __init__(self, area: StagingArea[Any]) -> None:
        self._area = area
        self._task: TaskContext | None = None
        self._dir: Any = None
        self._file: StagedOutput | None = None
        self._sealed = False
        self._done = False

    def begin(self, task: TaskContext) -> None:
        if self._task is not None:
            raise WriterStateError(f"{self.kind} writer: begin() called twice (for {task.txn_id})")
        folder = self._area.for_task(task)
        self._area.remove(folder)
        self._task, self._dir = task, folder
        self._file = self._area.open_output(folder, self.file_name)

    def _out(self) -> StagedOutput:
        if self._file is None or self._sealed:
            raise WriterStateError(f"{self.kind} writer: write needs begin() first and no pre_commit()")
        return self._file

    def _seal(self) -> tuple[TaskContext, Any]:
        """Seal the staged file; returns the task and its attempt folder (as the area names it)."""
        if self._file is None or self._task is None or self._dir is None or self._sealed:
            raise WriterStateError(f"{self.kind} writer: pre_commit needs begin() first and only once")
        self._sealed = True
        self._area.seal(self._file, self._dir)
        return self._task, self._dir

    def _sha256(self) -> str:
        """The SHA-256 of everything written to the staged file."""
        assert self._file is not None
        return self._file.hexdigest()

    def _publish(self, committable: Committable) -> Committable:
        assert self._dir is not None
        self._area.write_manifest(self._dir, committable)
        self._done = True
        return committable

    def abort(self) -> None:
        if self._file is not None:
            self._area.discard(self._file)
        if self._dir is not None:
            self._area.remove(self._dir)
