"""Where the Iceberg sink keeps its files, and its data files' Iceberg metadata as plain JSON.

Layout, under the table's data location (``write.data.path``, by default ``<table location>/data``):

* data: ``onceflow/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}/[partition path/]*.parquet``;

and under the table location:

* markers: ``onceflow-staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}.json``: written when
  an attempt starts (an incomplete committable) and rewritten by its pre-commit (the full committable).
  A marker is what makes an attempt's files "staged": the committer deletes it once the files are in a
  snapshot, abort deletes it with the files, and the sweeper lists what is left.

Paths are URIs that `onceflow.storage.store.Store` understands (``file://``, ``s3://``, …). A table in
a bucket is reached with the object-store settings that onceflow puts in the sink's config under ``s3``
(`take_s3`); every Store of such a table is built with them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from onceflow.committables import Committable, TaskContext
from onceflow.names import check_name
from onceflow.sinks import _markers as markers
from onceflow.sinks._config import take_s3
from onceflow.storage.s3 import S3Settings
from onceflow.storage.store import Store, make_durable

__all__ = ["S3Settings", "Store", "make_durable", "take_s3"]

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata

MARKERS = "onceflow-staging"
DATA = "onceflow"


def data_root(data_path: str, pipeline: str, sink: str) -> str:
    return f"{data_path.rstrip('/')}/{DATA}/{check_name('pipeline', pipeline)}/{check_name('sink', sink)}"


def epoch_data_dir(data_path: str, pipeline: str, sink: str, epoch: int) -> str:
    return f"{data_root(data_path, pipeline, sink)}/epoch={epoch}"


def attempt_data_dir(data_path: str, c: TaskContext | Committable) -> str:
    check_name("task", c.task)
    check_name("attempt", c.attempt)
    return f"{epoch_data_dir(data_path, c.pipeline, c.sink, c.epoch)}/{c.task}/attempt-{c.attempt}"


def marker_root(location: str, pipeline: str, sink: str) -> str:
    return markers.marker_root(location, MARKERS, pipeline, sink)


def marker_uri(location: str, c: TaskContext | Committable) -> str:
    return markers.marker_uri(location, MARKERS, c)


def list_markers(store: Store, location: str, pipeline: str, sink: str | None) -> list[Committable]:
    return markers.list_markers(store, location, MARKERS, pipeline, sink)


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
