"""Where the Iceberg sink keeps its files, and its data files' Iceberg metadata as plain JSON.

Layout, under the table's data location (``write.data.path``, by default ``<table location>/data``):

* data: ``onceflow/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}/[partition path/]*.parquet``;

and under the table location:

* markers: ``onceflow-staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}.json``: written when
  an attempt starts (an incomplete committable) and rewritten by its pre-commit (the full committable).
  A marker is what makes an attempt's files "staged": the committer deletes it once the files are in a
  snapshot, abort deletes it with the files, and the sweeper lists what is left.

Paths are URIs that pyarrow's file systems understand (``file://``, ``s3://``, …); local files are fsynced,
because a pre-commit promises that the staged output survives a crash.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.committables import Committable, TaskContext
from onceflow.names import check_name

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata

MARKERS = "onceflow-staging"
DATA = "onceflow"


def _local(uri: str) -> str | None:
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
    path = _local(uri)
    if path is not None and os.path.exists(path):
        _fsync(path)
        _fsync(os.path.dirname(path))


@dataclass(frozen=True)
class Store:
    """A pyarrow file system over one table's locations."""

    fs: Any
    scheme: str  # what `uri` puts back in front of a file system path

    @classmethod
    def for_location(cls, location: str) -> Store:
        from pyarrow import fs as pafs

        local = _local(location)
        if local is not None:
            return cls(pafs.LocalFileSystem(), "file://")
        filesystem, _ = pafs.FileSystem.from_uri(location)
        return cls(filesystem, location.split("://", 1)[0] + "://")

    def path(self, uri: str) -> str:
        local = _local(uri)
        return local if local is not None else uri.split("://", 1)[1]

    def uri(self, path: str) -> str:
        return self.scheme + path

    def exists(self, uri: str) -> bool:
        from pyarrow import fs as pafs

        return bool(self.fs.get_file_info(self.path(uri)).type != pafs.FileType.NotFound)

    def write(self, uri: str, data: bytes) -> None:
        """Write all of ``data`` or nothing under its name (a temporary name, then a rename)."""
        path = self.path(uri)
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.{path.rsplit('/', 1)[1]}.tmp-{os.getpid()}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        make_durable(self.uri(tmp))
        self.fs.move(tmp, path)
        make_durable(uri)

    def read(self, uri: str) -> bytes:
        with self.fs.open_input_stream(self.path(uri)) as stream:
            return bytes(stream.read())

    def delete_file(self, uri: str) -> None:
        if self.exists(uri):
            self.fs.delete_file(self.path(uri))

    def delete_dir(self, uri: str) -> None:
        if self.exists(uri):
            self.fs.delete_dir(self.path(uri))

    def files_under(self, uri: str) -> list[str]:
        """Every file below ``uri`` (recursively), as URIs; nothing when it does not exist."""
        from pyarrow import fs as pafs

        if not self.exists(uri):
            return []
        selector = pafs.FileSelector(self.path(uri), recursive=True)
        return sorted(
            self.uri(i.path) for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File
        )


def data_root(data_path: str, pipeline: str, sink: str) -> str:
    return f"{data_path.rstrip('/')}/{DATA}/{check_name('pipeline', pipeline)}/{check_name('sink', sink)}"


def epoch_data_dir(data_path: str, pipeline: str, sink: str, epoch: int) -> str:
    return f"{data_root(data_path, pipeline, sink)}/epoch={epoch}"


def attempt_data_dir(data_path: str, c: TaskContext | Committable) -> str:
    check_name("task", c.task)
    check_name("attempt", c.attempt)
    return f"{epoch_data_dir(data_path, c.pipeline, c.sink, c.epoch)}/{c.task}/attempt-{c.attempt}"


def marker_root(location: str, pipeline: str, sink: str) -> str:
    return f"{location.rstrip('/')}/{MARKERS}/{check_name('pipeline', pipeline)}/{check_name('sink', sink)}"


def marker_uri(location: str, c: TaskContext | Committable) -> str:
    check_name("task", c.task)
    check_name("attempt", c.attempt)
    return f"{marker_root(location, c.pipeline, c.sink)}/epoch={c.epoch}/{c.task}/attempt-{c.attempt}.json"


def list_markers(store: Store, location: str, pipeline: str, sink: str | None) -> list[Committable]:
    """Every attempt of the pipeline (of one sink if given) that has a marker: its committable, or an
    incomplete one rebuilt from the path (a marker cut short by a crash)."""
    found: list[Committable] = []
    root = f"{location.rstrip('/')}/{MARKERS}/{check_name('pipeline', pipeline)}"
    if sink is not None:
        root += f"/{check_name('sink', sink)}"
    prefix = store.uri(store.path(root))
    for uri in store.files_under(root):
        parts = uri[len(prefix) :].strip("/").split("/")
        if sink is not None:
            parts = [sink, *parts]
        if len(parts) != 4:
            continue
        sink_name, epoch_part, task, name = parts
        if not (epoch_part.startswith("epoch=") and epoch_part[6:].isdigit()):
            continue
        if not (name.startswith("attempt-") and name.endswith(".json")):
            continue
        try:
            found.append(Committable.from_json(store.read(uri).decode()))
        except (ValueError, KeyError):
            found.append(
                Committable(
                    pipeline=pipeline,
                    epoch=int(epoch_part[6:]),
                    slice=-1,
                    task=task,
                    attempt=name.removeprefix("attempt-").removesuffix(".json"),
                    sink=sink_name,
                    handle={"incomplete": True},
                )
            )
    return found


# ----------------------------------------------------------------------------- data file metadata


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _counts(values: Mapping[int, int] | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in (values or {}).items()}


def _bounds(values: Mapping[int, bytes] | None) -> dict[str, str]:
    return {str(k): _b64(v) for k, v in (values or {}).items()}


def data_file_to_json(data_file: DataFile, metadata: TableMetadata) -> dict[str, Any]:
    """A data file's Iceberg metadata (counts, size, column stats, partition values) as plain JSON;
    partition values in Iceberg's single-value binary form, so every type round-trips exactly."""
    from pyiceberg.conversions import to_bytes

    try:
        spec_id = data_file.spec_id
    except AttributeError:  # pyiceberg's writer leaves it unset: files are written with the default spec
        spec_id = metadata.default_spec_id
    partition_type = metadata.specs()[spec_id].partition_type(metadata.schema())
    partition = [
        None if data_file.partition[i] is None else _b64(to_bytes(field.field_type, data_file.partition[i]))  # type: ignore[arg-type]
        for i, field in enumerate(partition_type.fields)
    ]
    return {
        "path": data_file.file_path,
        "format": data_file.file_format.value,
        "spec_id": spec_id,
        "partition": partition,
        "record_count": data_file.record_count,
        "file_size_in_bytes": data_file.file_size_in_bytes,
        "column_sizes": _counts(data_file.column_sizes),
        "value_counts": _counts(data_file.value_counts),
        "null_value_counts": _counts(data_file.null_value_counts),
        "nan_value_counts": _counts(data_file.nan_value_counts),
        "lower_bounds": _bounds(data_file.lower_bounds),
        "upper_bounds": _bounds(data_file.upper_bounds),
        "split_offsets": list(data_file.split_offsets or []),
    }


def data_file_from_json(spec: Mapping[str, Any], metadata: TableMetadata) -> DataFile:
    """The `DataFile` that `data_file_to_json` described, for a snapshot of the table."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    partition_type = metadata.specs()[int(spec["spec_id"])].partition_type(metadata.schema())
    values = [
        None if raw is None else from_bytes(field.field_type, base64.b64decode(raw))  # type: ignore[arg-type]
        for raw, field in zip(spec["partition"], partition_type.fields, strict=True)
    ]
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=spec["path"],
        file_format=FileFormat(spec["format"]),
        partition=Record(*values),
        record_count=int(spec["record_count"]),
        file_size_in_bytes=int(spec["file_size_in_bytes"]),
        column_sizes={int(k): int(v) for k, v in spec["column_sizes"].items()},
        value_counts={int(k): int(v) for k, v in spec["value_counts"].items()},
        null_value_counts={int(k): int(v) for k, v in spec["null_value_counts"].items()},
        nan_value_counts={int(k): int(v) for k, v in spec["nan_value_counts"].items()},
        lower_bounds={int(k): base64.b64decode(v) for k, v in spec["lower_bounds"].items()},
        upper_bounds={int(k): base64.b64decode(v) for k, v in spec["upper_bounds"].items()},
        split_offsets=list(spec["split_offsets"]) or None,
        sort_order_id=None,
        spec_id=int(spec["spec_id"]),
        equality_ids=None,
        key_metadata=None,
    )
    data_file.spec_id = int(spec["spec_id"])
    return data_file
