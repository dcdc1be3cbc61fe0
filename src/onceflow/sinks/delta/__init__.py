"""Delta Lake sink: Parquet files staged per task attempt, one Delta commit per epoch, readable by any engine.

* The **writer** (in a Spark task) writes its attempt's rows as Parquet files in the table's folder,
  one partition value set per file (`writer`). The log does not name them, so no reader sees them.
* The **committer** adds every participant's files of an epoch in **one** Delta commit through
  delta-rs (``create_write_transaction``, no data rewritten), with a ``txn`` action
  ``(appId = "<pipeline>:<sink>", version = epoch)``: a repeated commit finds its epoch in the log
  and does nothing (`committer`). Another writer's appends in between are kept.
* **Abort** and the sweeper delete an attempt's files and marker; files the log holds are never deleted.

The table is created (``create_table``) from the sink's ``columns``, or the pipeline's decoded rows when
it has no transform, at plan time, or else from the first rows a writer sees. Struct, list and map
columns nest as the Iceberg sink's do; partition columns are flat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.sinks.delta.committer import DeltaCommitter
from onceflow.sinks.delta.config import KIND, DeltaConfig
from onceflow.sinks.delta.writer import DeltaWriter, check_table
from onceflow.sinks.registry import SinkKind, SinkSetting, configured_columns

if TYPE_CHECKING:
    from onceflow.pipeline import Pipeline

__all__ = ["SINK_KIND", "DeltaCommitter", "DeltaConfig", "DeltaWriter"]


def wanted_columns(spec: Pipeline, config: DeltaConfig) -> tuple[tuple[str, str], ...] | None:
    """The table's columns as known before anything runs: declared, or the decoded rows' when there is
    no transform (nor state); None when only the transform's output will tell."""
    if config.columns:
        return config.columns
    from onceflow.pipeline import AvroFormat

    if isinstance(spec.format, AvroFormat) and not spec.format.pinned:
        return None
    if spec.transform is None and spec.state is None:
        from onceflow.decoding.records import row_columns
        from onceflow.sinks.iceberg import table as tables

        columns = row_columns(spec.format)
        unmapped = [f"{n} ({t})" for n, t, _ in columns if tables.row_type(t) is None]
        if unmapped:
            raise ConfigError(f"{config.where}: the decoded rows' columns {unmapped} have no Delta type yet")
        return tuple((n, str(tables.row_type(t))) for n, t, _ in columns)
    return None


def plan_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    """Create each sink's table when its columns are known (and ``create_table``), or check that an
    existing table has them; a missing table that may not be created is refused in one line. A preview
    (``apply`` false) creates nothing."""
    for mapping in configs:
        config = DeltaConfig.from_mapping(mapping)
        check_table(config, wanted_columns(spec, config), apply)


def _columns(config: Mapping[str, Any]) -> list[str] | None:
    return configured_columns(config)


SINK_KIND = SinkKind(
    name=KIND,
    writer=DeltaWriter,
    committer=DeltaCommitter,
    guarantee="exactly_once",
    columns=_columns,
    plan_checks=plan_checks,
    settings=(
        SinkSetting(
            "path",
            "string",
            "the table's folder or URI (a local path is made absolute), or an `s3://bucket/prefix/table` URL "
            "reached with the `AWS_*` settings (each version's log entry a put-if-absent: concurrent "
            "writers are safe); created with the table",
            required=True,
        ),
        SinkSetting(
            "columns",
            "columns",
            "the table's columns, `{name: type}`, with the `iceberg` sink's type names (`string`, `long`, "
            "`int`, `double`, `timestamp` (Delta's `timestamp_ntz`), `timestamptz`, `decimal(p,s)`, … or a "
            "row type's text such as `array<struct<sku:string,qty:int>>`); columns nullable",
            default_from="the decoded rows without a transform, else the first rows written",
        ),
        SinkSetting(
            "partition_by",
            "columns",
            "the partition columns of a new table, `{column: identity}` (string, integer, boolean or date "
            "columns)",
            default_from="unpartitioned",
        ),
        SinkSetting(
            "properties",
            "columns",
            "table configuration of a new table (`delta.*` keys)",
            default_from="none",
        ),
        SinkSetting("create_table", "boolean", "create the table when it does not exist", default=True),
        SinkSetting(
            "rows_per_file",
            "integer",
            "rows in one data file, at most (a task holds up to this many in memory)",
            default=100_000,
            minimum=1,
        ),
        SinkSetting(
            "commit_retries",
            "integer",
            "times a commit that conflicts with another writer of the table is retried",
            default=10,
        ),
    ),
)
