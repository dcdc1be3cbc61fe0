"""Where the Delta sink keeps its files, and how an epoch's staged files become Delta add actions.

Under the table's folder (``path``):

* data: ``onceflow/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}/part-{k}.parquet``, the layout of
  the Iceberg sink's data. Delta finds a table's files through its log only, so a staged file is in
  no table version until the epoch's commit adds it; the folder is not hidden, so that ``VACUUM``
  reclaims files that later commits remove;
* markers: ``_onceflow/onceflow-staging/{pipeline}/{sink}/epoch={n}/{task}/attempt-{attempt}.json``,
  as for the Iceberg sink: an attempt's committable, written when it starts and again by its
  pre-commit; what the sweeper lists. A folder starting with ``_`` is one that ``VACUUM`` leaves alone.

Partition columns are not stored in a Delta data file: their values, one set per file, go in the add
action (as strings, Delta's partition value form).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from onceflow.committables import Committable, TaskContext
from onceflow.sinks.iceberg import files

Store = files.Store
make_durable = files.make_durable
take_s3 = files.take_s3


def local_or_uri(path: str) -> str:
    """A table URI as delta-rs takes it: a local path made absolute, any other URI as it is."""
    import os

    if path.startswith("file://"):
        return os.path.abspath(path.removeprefix("file://"))
    return path if "://" in path else os.path.abspath(path)


def markers_location(table_uri: str) -> str:
    return f"{table_uri.rstrip('/')}/_onceflow"


def attempt_dir(table_uri: str, c: TaskContext | Committable) -> str:
    return files.attempt_data_dir(table_uri, c)


def marker_uri(table_uri: str, c: TaskContext | Committable) -> str:
    return files.marker_uri(markers_location(table_uri), c)


def list_markers(store: files.Store, table_uri: str, pipeline: str, sink: str | None) -> list[Committable]:
    return files.list_markers(store, markers_location(table_uri), pipeline, sink)


def relative(table_uri: str, store: files.Store, uri: str) -> str:
    """A data file's path relative to the table's root, as a Delta add action names it."""
    root = store.path(table_uri).rstrip("/") + "/"
    path = store.path(uri)
    if not path.startswith(root):
        raise ValueError(f"{uri} is not under the table {table_uri}")
    return path[len(root) :]


def partition_text(value: Any) -> str | None:
    """A partition value as Delta writes it in an add action (null stays null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def add_action(spec: Mapping[str, Any]) -> Any:
    """The delta-rs add action for one staged file of a committable."""
    from deltalake.transaction import AddAction

    return AddAction(
        path=str(spec["path"]),
        size=int(spec["size"]),
        partition_values=dict(spec["partition"]),
        modification_time=int(spec["mtime_ms"]),
        data_change=True,
        stats=json.dumps({"numRecords": int(spec["rows"])}),
    )
