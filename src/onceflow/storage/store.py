"""One file system over a sink's locations, local or in a bucket, through pyarrow's file systems.

Locations are URIs (``file://…``, a plain path, ``s3://bucket/…``). What a protocol step needs of them:
whole-or-nothing writes (`Store.write`), a write that only the first writer wins (`Store.create`, the
commit point of a log kept in a bucket), listings and deletes. Local files are fsynced, because a
pre-commit promises that the staged output survives a crash; an object store holds an object durably
once its put has completed, and shows it whole or not at all.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from onceflow.storage import s3 as s3_store


def local_path(uri: str) -> str | None:
    """The local path of a ``file:`` URI or a plain path, or None for any other scheme."""
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    if uri.startswith("file:"):
        return uri.removeprefix("file:")
    if "://" not in uri:
        return uri
    return None


def _fsync(path: str) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable(uri: str) -> None:
    """fsync a local file and its folder (remote stores are durable once a write completes)."""
    path = local_path(uri)
    if path is not None and os.path.exists(path):
        _fsync(path)
        _fsync(os.path.dirname(path))


@dataclass(frozen=True)
class Store:
    """A pyarrow file system over one table's locations."""

    fs: Any
    scheme: str  # what `uri` puts back in front of a file system path
    s3: s3_store.S3Settings | None = None

    @classmethod
    def for_location(cls, location: str, s3: s3_store.S3Settings | None = None) -> Store:
        """The store of ``location``: an ``s3://`` one through ``s3`` (else the AWS SDK's own chain)."""
        from pyarrow import fs as pafs

        if local_path(location) is not None:
            return cls(pafs.LocalFileSystem(), "file://")
        if s3_store.is_s3(location):
            settings = s3 if s3 is not None else s3_store.S3Settings()
            return cls(settings.filesystem(), s3_store.SCHEME, settings)
        filesystem, _ = pafs.FileSystem.from_uri(location)
        return cls(filesystem, location.split("://", 1)[0] + "://")

    @property
    def local(self) -> bool:
        return self.scheme == "file://"

    def path(self, uri: str) -> str:
        local = local_path(uri)
        return local if local is not None else uri.split("://", 1)[1]

    def uri(self, path: str) -> str:
        return self.scheme + path

    def exists(self, uri: str) -> bool:
        from pyarrow import fs as pafs

        return bool(self.fs.get_file_info(self.path(uri)).type != pafs.FileType.NotFound)

    def write(self, uri: str, data: bytes) -> None:
        """Write all of ``data`` or nothing under its name: a temporary name then a rename on a local
        disk; one put in an object store, which shows an object only once it is whole."""
        path = self.path(uri)
        parent = path.rsplit("/", 1)[0]
        if not self.local:
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            return
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.{path.rsplit('/', 1)[1]}.tmp-{os.getpid()}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        make_durable(self.uri(tmp))
        self.fs.move(tmp, path)
        make_durable(uri)

    def create(self, uri: str, data: bytes) -> None:
        """Write ``data`` at ``uri`` only if nothing is there, else `ObjectExists`: of two writers of one
        name, exactly one wins. A hard link of a fsynced temporary file on a local disk (link fails
        when the name exists); a put with ``If-None-Match: *`` in an S3 bucket."""
        if self.s3 is not None:
            s3_store.put_if_absent(self.s3, uri, data)
            return
        if not self.local:
            raise NotImplementedError(f"{uri}: a create-only write needs a local folder or an s3:// bucket")
        path = self.path(uri)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/.{os.path.basename(path)}.tmp-{os.getpid()}"
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise s3_store.ObjectExists(uri) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync(parent)

    def read(self, uri: str) -> bytes:
        with self.fs.open_input_stream(self.path(uri)) as stream:
            return bytes(stream.read())

    def delete_file(self, uri: str) -> None:
        if self.s3 is not None:  # by name: pyarrow would leave a folder object where the file was
            s3_store.delete_objects(self.s3, [uri])
        elif self.exists(uri):
            self.fs.delete_file(self.path(uri))

    def delete_dir(self, uri: str) -> None:
        if self.s3 is not None:
            s3_store.delete_objects(self.s3, self.files_under(uri))
        elif self.exists(uri):
            self.fs.delete_dir(self.path(uri))

    def files_under(self, uri: str) -> list[str]:
        """Every file below ``uri`` (recursively), as URIs; nothing when it does not exist."""
        from pyarrow import fs as pafs

        if not self.local:  # a prefix with no object is no folder to an object store
            selector = pafs.FileSelector(self.path(uri), recursive=True, allow_not_found=True)
        elif not self.exists(uri):
            return []
        else:
            selector = pafs.FileSelector(self.path(uri), recursive=True)
        return sorted(
            self.uri(i.path) for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File
        )
