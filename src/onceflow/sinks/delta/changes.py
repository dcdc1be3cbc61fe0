"""Delta mirror of a change stream: upserts and deletes applied by key, exactly once, one Delta commit per
epoch.

Changes of one key can be in several tasks of an epoch (a partition's range is split into read tasks),
so no task can decide what the table holds; the halves split as in `iceberg_changes`:

* a **task** stages its changes, the rows with their op and source position (``_op``, ``_partition``,
  ``_offset``), as Parquet files of its attempt in the table's folder (the `delta` sink's layout and
  markers), each file kept to the last change per key (and every truncate) of its rows. The log does
  not name them: no reader sees them, and no commit ever adds them;
* the **commit** reads the epoch's staged changes and keeps per key the last in source order (the
  highest offset of its partition; Debezium writes one key to one partition); a truncate drops the
  changes before it in its partition. It applies them in **one** Delta commit through delta-rs's merge
  on the key columns: a delete removes the key's row, any other change inserts or replaces it, and a
  truncate also deletes every row no remaining change names (``when_not_matched_by_source_delete``), so
  that the emptied table and the changes after the truncate are one version. The commit carries the
  `delta` sink's ``txn`` action ``(appId = "<pipeline>:<sink>", version = epoch)``: a repeated or
  recovered commit finds its epoch in the log and applies nothing. A merge that changes no row makes no
  version of its own; a commit of the ``txn`` action alone then records the epoch. The staged files are
  deleted after the commit, and by abort and the sweeper.

``_op`` and the source position are not columns of the table.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.sinks._changes import (
    OFFSET,
    OP,
    PARTITION,
    applicable,
    change_columns,
    change_settings,
    check_key,
    check_key_names,
    last_changes,
    stream_key,
)
from onceflow.sinks._config import ConfigReader
from onceflow.sinks.base import Committable
from onceflow.sinks.delta import SINK_KIND as APPEND_KIND
from onceflow.sinks.delta import layout
from onceflow.sinks.delta.committer import DeltaCommitter, committed_epoch
from onceflow.sinks.delta.config import DeltaConfig, declared_schema
from onceflow.sinks.delta.writer import DeltaWriter, check_table
from onceflow.sinks.errors import RowError
from onceflow.sinks.iceberg.changes import _fit
from onceflow.sinks.registry import SinkKind

if TYPE_CHECKING:
    import pyarrow as pa

    from onceflow.pipeline import Pipeline

KIND = "delta_changes"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeltaChangesConfig:
    """The target table's settings (as the `delta` sink reads them, ``columns`` required) and the key
    columns the changes are applied by."""

    table: DeltaConfig
    key_columns: tuple[str, ...]

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any], check_types: bool = True) -> DeltaChangesConfig:
        config, s3 = layout.take_s3(config, KIND)
        reader = ConfigReader(KIND, config)
        table = DeltaConfig.read(reader, columns_required=True, check_types=check_types, s3=s3)
        keys = reader.string_list("key_columns")
        reader.finish()
        check_key_names(table.where, [n for n, _ in table.columns], keys)
        if not check_types:
            return cls(table, keys)
        import pyarrow as pa

        schema = declared_schema(table.columns, table.where)
        nested = [k for k in keys if pa.types.is_nested(schema.field(k).type)]
        if nested:
            raise ConfigError(f"{table.where}: key_columns {nested} are not flat values")
        return cls(table, keys)

    @property
    def where(self) -> str:
        return self.table.where


def _as_config(
    config: DeltaChangesConfig | Mapping[str, Any], check_types: bool = True
) -> DeltaChangesConfig:
    if isinstance(config, DeltaChangesConfig):
        return config
    return DeltaChangesConfig.from_mapping(config, check_types)


def staging_schema(table_schema: pa.Schema) -> pa.Schema:
    """A staged change's columns: the table's, then the op and the source position."""
    import pyarrow as pa

    return pa.schema(
        [
            *table_schema,
            pa.field(OP, pa.string()),
            pa.field(PARTITION, pa.int32()),
            pa.field(OFFSET, pa.int64()),
        ]
    )


# ----------------------------------------------------------------------------------------- writer


class DeltaChangesWriter(DeltaWriter):
    """Stages a task's changes as the `delta` writer stages rows (same files, markers and abort), each
    file kept to the last change per key (and the truncates) of its rows, unsplit by partition."""

    def __init__(self, config: DeltaChangesConfig | Mapping[str, Any]) -> None:
        self.changes = _as_config(config, check_types=False)  # the plan checked them
        super().__init__(self.changes.table)

    def _staged(self, schema: Any, partition_by: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        return staging_schema(schema), ()

    def _add(self, arrow: Any) -> None:
        import pyarrow.compute as pc

        from onceflow.decoding.debezium import OPS

        if arrow[OP].null_count or arrow[OFFSET].null_count or arrow[PARTITION].null_count:
            raise RowError(f"{self.config.where}: a change without its op or source position")
        unknown = sorted(set(pc.unique(arrow[OP]).to_pylist()) - set(OPS))
        if unknown:
            raise RowError(f"{self.config.where}: ops {unknown} are not change ops ({', '.join(OPS)})")
        applied = arrow.filter(pc.not_equal(arrow[OP], "t"))
        keyless = [k for k in self.changes.key_columns if applied[k].null_count]
        if keyless:
            raise RowError(f"{self.config.where}: a change without a value of its key columns {keyless}")
        super()._add(arrow)

    def _flush(self, final: bool = True) -> None:
        """Pending changes as one file of the last change per key, once there are ``rows_per_file`` of
        them (or any, when ``final``)."""
        import pyarrow as pa

        if self._pending_rows < (1 if final else self.config.rows_per_file):
            return
        changes = last_changes(pa.concat_tables(self._pending), self.changes.key_columns)
        self._write_file({}, changes)
        self._pending, self._pending_rows = [], 0


# -------------------------------------------------------------------------------------- committer


def merge_predicate(keys: Sequence[str]) -> str:
    """The merge's join: the key columns equal (quoted, so any column name is taken as it is)."""
    return " AND ".join(f'target."{k}" = source."{k}"' for k in keys)


class DeltaChangesCommitter(DeltaCommitter):
    """Applies each epoch's staged changes in one Delta commit, once; aborts by deleting staged files."""

    def __init__(self, config: DeltaChangesConfig | Mapping[str, Any]) -> None:
        self.changes = _as_config(config)
        super().__init__(self.changes.table)

    staged_what = "staged change files"

    def _write(self, table: Any, epoch: int, group: list[Committable], specs: list[dict[str, Any]]) -> None:
        """The epoch's changes merged into ``table`` in one commit that holds its txn action; when the
        merge changes nothing (and so commits nothing), the txn action alone."""
        paths = [s["path"] for s in specs]
        changes, truncated = applicable(self._read_staged(table, paths), self.changes.key_columns)
        source = changes.drop_columns([PARTITION, OFFSET])
        properties = self._commit_properties(epoch, group)
        if source.num_rows or truncated:
            merger = table.merge(
                source,
                merge_predicate(self.changes.key_columns),
                source_alias="source",
                target_alias="target",
                commit_properties=properties,
            )
            applied = f"source.{OP} <> 'd'"
            merger = (
                merger.when_matched_delete(f"source.{OP} = 'd'")
                .when_matched_update_all(applied, except_cols=[OP])
                .when_not_matched_insert_all(applied, except_cols=[OP])
            )
            if truncated:
                merger = merger.when_not_matched_by_source_delete()
            merger.execute()
            table = self._load()
            assert table is not None
            if committed_epoch(table, group[0].pipeline, group[0].sink) >= epoch:
                return
        super()._write(table, epoch, group, [])  # no file: the txn action alone

    def _read_staged(self, table: Any, paths: Sequence[str]) -> pa.Table:
        """The staged changes, in the table's current columns (columns added since as nulls)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = staging_schema(pa.schema(table.schema().to_arrow()))
        parts = [
            _fit(pq.read_table(self._store.path(self._uri(p)), filesystem=self._store.fs), schema)
            for p in paths
        ]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _forget(self, group: Sequence[Committable]) -> None:
        """The attempts' staged files and markers: the log never names them, so they simply go."""
        for c in group:
            self._store.delete_dir(layout.attempt_dir(self.config.path, c))
            self._store.delete_file(layout.marker_uri(self.config.path, c))

    def abort(self, committables: Sequence[Committable]) -> None:
        """Delete the attempts' staged files and markers (no table version ever references them)."""
        self._forget(committables)


# ------------------------------------------------------------------------------------ plan checks


def plan_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    """Only a change stream has ops to apply, by the key it is partitioned by; then each table is
    created, or checked, as the `delta` sink does."""
    key = stream_key(spec, configs, KIND, "delta")
    for mapping in configs:
        config = DeltaChangesConfig.from_mapping(mapping)
        check_key(config.where, config.key_columns, key)
        check_table(config.table, config.table.columns, apply)


SINK_KIND = SinkKind(
    name=KIND,
    writer=DeltaChangesWriter,
    committer=DeltaChangesCommitter,
    guarantee="exactly_once",
    columns=change_columns,
    plan_checks=plan_checks,
    settings=change_settings(APPEND_KIND.settings),
)
