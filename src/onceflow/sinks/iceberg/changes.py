"""Iceberg mirror of a change stream: upserts and deletes applied by key, exactly once, one snapshot per
epoch.

Changes of one key can be in several tasks of an epoch (a partition's range is split into read tasks),
so no task can decide what the table holds; the two halves split as in `postgres_changes`:

* a **task** stages its changes, the rows with their op and source position (``_op``, ``_partition``,
  ``_offset``), as Parquet files of its attempt beside the table's data (the append sink's layout and
  markers, `files`), kept to the last change per key (and every truncate) of the task. No snapshot
  references them: the table is untouched;
* the **commit** reads the epoch's staged changes and keeps per key the last in source order (the
  highest offset of its partition; Debezium writes one key to one partition); a truncate empties the
  table before the changes after it in its partition. It then makes one copy-on-write snapshot: the
  data files that may hold a changed key (by the key columns' bounds) are read, and those that do are
  replaced by a file of their other rows and the epoch's upserted rows. The same metadata commit sets
  the append sink's committed-epoch property, so a repeated or recovered commit applies nothing twice;
  the staged files are deleted after it.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.decoding.debezium import OPS
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
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.errors import RowError, StagedOutputLost, WriterStateError
from onceflow.sinks.iceberg import (
    SINK_KIND as APPEND_KIND,
)
from onceflow.sinks.iceberg import (
    SUMMARY_ATTEMPT,
    SUMMARY_EPOCH,
    SUMMARY_PARTICIPANTS,
    SUMMARY_PIPELINE,
    SUMMARY_SINK,
    IcebergConfig,
    _by_epoch,
    _data_path,
    _single_try,
    _with_retries,
    committed_property,
    default_catalog_properties,
    drop_attempt,
    files,
    finish_attempt,
    fitted,
    is_committed,
    nested,
    start_attempt,
)
from onceflow.sinks.iceberg import table as tables
from onceflow.sinks.registry import SinkKind

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

    from onceflow.config import Settings
    from onceflow.pipeline import Pipeline

KIND = "iceberg_changes"
SUMMARY_DELETED_KEYS = "onceflow.deleted-keys"
SUMMARY_UPSERTED_KEYS = "onceflow.upserted-keys"
SUMMARY_TRUNCATED = "onceflow.truncated"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangesConfig:
    """The target table's settings (as the append sink reads them, ``columns`` required) and the key
    columns the changes are applied by."""

    table: IcebergConfig
    key_columns: tuple[str, ...]

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ChangesConfig:
        config, s3 = files.take_s3(config, KIND)
        reader = ConfigReader(KIND, config)
        table = IcebergConfig(
            table=reader.string("table"),
            catalog=reader.string("catalog", "onceflow"),
            catalog_properties=reader.columns("catalog_properties", required=False),
            columns=reader.columns(),
            partition_by=reader.columns("partition_by", required=False),
            properties=reader.columns("properties", required=False),
            rows_per_file=reader.integer("rows_per_file", 100_000, minimum=1),
            commit_retries=reader.integer("commit_retries", 10, minimum=0),
            name=reader.optional_string("name"),
            kind=KIND,
            s3=s3,
        )
        keys = reader.string_list("key_columns")
        reader.finish()
        tables.identifier(table.table)
        schema = tables.schema_of(table.columns, table.where)
        check_key_names(table.where, [n for n, _ in table.columns], keys)
        nested_keys = [k for k in keys if not schema.find_field(k).field_type.is_primitive]
        if nested_keys:
            raise ConfigError(f"{KIND} sink config key_columns: {nested_keys} are not flat values")
        return cls(table, keys)

    @property
    def where(self) -> str:
        return self.table.where


def _as_config(config: ChangesConfig | Mapping[str, Any]) -> ChangesConfig:
    return config if isinstance(config, ChangesConfig) else ChangesConfig.from_mapping(config)


def _ensure_table(config: ChangesConfig) -> Table:
    cat = config.table.open_catalog()
    wanted = tables.schema_of(config.table.columns, config.where)
    table: Table = _with_retries(
        lambda: tables.ensure_table(
            cat,
            config.table.table,
            wanted,
            config.table.partition_by,
            dict(config.table.properties),
            config.where,
        )
    )
    return table


def staging_schema(table: Table) -> pa.Schema:
    """A staged change's columns: the table's, then the op and the source position."""
    import pyarrow as pa

    schema = table.schema().as_arrow()
    return pa.schema(
        [*schema, pa.field(OP, pa.string()), pa.field(PARTITION, pa.int32()), pa.field(OFFSET, pa.int64())]
    )


# ----------------------------------------------------------------------------------------- writer


class IcebergChangesWriter:
    """Stages a task's changes as Parquet files of its attempt, ``rows_per_file`` rows at a time, each
    file kept to the last change per key (and the truncates) of its rows."""

    def __init__(self, config: ChangesConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        self._task: TaskContext | None = None
        self._table: Table | None = None
        self._store: files.Store | None = None
        self._schema: Any = None
        self._pending: list[Any] = []
        self._pending_rows = 0
        self._files: list[dict[str, Any]] = []
        self._count = 0
        self._done = False

    def begin(self, task: TaskContext) -> None:
        if self._task is not None:
            raise WriterStateError(f"{KIND} writer: begin() called twice (for {task.txn_id})")
        self._task = task
        # The plan check made the table; a writer creates it only when driven without one.
        table = tables.load(self.config.table.open_catalog(), self.config.table.table)
        table = table if table is not None else _ensure_table(self.config)
        self._table, self._schema = table, staging_schema(table)
        self._store = start_attempt(table, task, self.config.table.store(table.location()))

    def _require(self) -> TaskContext:
        if self._task is None or self._done:
            raise WriterStateError(f"{KIND} writer: write/pre_commit needs begin() first and no pre_commit()")
        return self._task

    def write(self, rows: Iterable[Row]) -> None:
        import pyarrow as pa

        self._require()
        chunk = list(rows)
        if not chunk:
            return
        for row in chunk:
            if not isinstance(row, Mapping):
                raise RowError(f"{self.config.where}: a row must be a mapping, got {type(row).__name__}")
        unknown = sorted(set().union(*chunk).difference(self._schema.names))
        if unknown:
            raise RowError(f"{self.config.where}: columns {unknown} are not in the table")
        nested.check_keys(chunk, self._schema, self.config.where)
        try:
            arrow = pa.Table.from_pylist(chunk, schema=self._schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RowError(f"{self.config.where}: rows do not fit the table's schema: {exc}") from exc
        self._add(arrow)

    def write_batch(self, batch: Any) -> None:
        """Stage an Arrow record batch as `write` stages its rows."""
        self._require()
        if batch.num_rows == 0:
            return
        unknown = [n for n in batch.schema.names if n not in self._schema.names]
        if unknown:
            raise RowError(f"{self.config.where}: columns {unknown} are not in the table")
        self._add(fitted(batch, self._schema, self.config.where))

    def _add(self, arrow: Any) -> None:
        import pyarrow.compute as pc

        if arrow[OP].null_count or arrow[OFFSET].null_count or arrow[PARTITION].null_count:
            raise RowError(f"{self.config.where}: a change without its op or source position")
        unknown = sorted(set(pc.unique(arrow[OP]).to_pylist()) - set(OPS))
        if unknown:
            raise RowError(f"{self.config.where}: ops {unknown} are not change ops ({', '.join(OPS)})")
        self._pending.append(arrow)
        self._pending_rows += arrow.num_rows
        self._count += arrow.num_rows
        if self._pending_rows >= self.config.table.rows_per_file:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        task = self._require()
        if not self._pending_rows or self._table is None or self._store is None:
            return
        changes = last_changes(pa.concat_tables(self._pending), self.config.key_columns)
        folder = files.attempt_data_dir(_data_path(self._table), task)
        uri = f"{folder}/changes-{len(self._files):05d}.parquet"
        if self._store.local:  # a bucket has no folders to make
            self._store.fs.create_dir(self._store.path(folder), recursive=True)
        with self._store.fs.open_output_stream(self._store.path(uri)) as out:
            pq.write_table(changes, out)
        files.make_durable(uri)
        self._files.append({"path": uri, "rows": changes.num_rows})
        self._pending, self._pending_rows = [], 0

    def pre_commit(self) -> Committable:
        task = self._require()
        self._flush()
        self._done = True
        table, staged = self.config.table.table, self._files
        return finish_attempt(task, table, staged, self._count, self._table, self._store)

    def abort(self) -> None:
        drop_attempt(self._task, self._table, self._store)


# -------------------------------------------------------------------------------------- committer


@dataclass
class _Plan:
    """What one epoch does to the table: data files it deletes, rows it writes, and its counts."""

    deleted: list[DataFile]
    rows: Any  # an Arrow table in the table's schema
    summary: dict[str, str]


class IcebergChangesCommitter:
    """Applies each epoch's staged changes in one snapshot, once; aborts by deleting staged files."""

    def __init__(self, config: ChangesConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)

    def _load(self) -> Table | None:
        return tables.load(self.config.table.open_catalog(), self.config.table.table)

    def commit(self, committables: Sequence[Committable]) -> None:
        for epoch, group in _by_epoch(committables).items():
            for c in group:
                if c.handle.get("incomplete"):
                    raise StagedOutputLost(f"{KIND}: {c.sink} epoch {c.epoch} {c.task} never pre-committed")
            table = self._commit_epoch(epoch, group)
            if table is not None:
                self._forget(table, group)

    def _commit_epoch(self, epoch: int, group: list[Committable]) -> Table | None:
        """1. re-read the table; if its marker holds the epoch, stop; 2. read the staged changes (all
        there, or the epoch is lost); 3. plan and write the epoch's files, then one metadata commit of
        the snapshot and the marker; a conflict goes back to 1."""
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        first = group[0]
        staged = [spec["path"] for c in group for spec in c.handle.get("files", [])]
        for attempt in range(1, self.config.table.commit_retries + 2):
            table = self._load()
            if table is None:
                if staged:
                    raise StagedOutputLost(
                        f"{self.config.where}: the table is gone, with epoch {epoch}'s changes"
                    )
                return None
            if is_committed(table, first.pipeline, first.sink, epoch):
                return table
            store = self.config.table.store(table.location())
            missing = [p for p in staged if not store.exists(p)]
            if missing:
                raise StagedOutputLost(
                    f"{self.config.where}: epoch {epoch} is not in the table and {len(missing)} of its "
                    f"staged change files are gone (e.g. {missing[0]})"
                )
            # The commit attempt's own folder of new data files (no task is named so).
            epoch_dir = files.epoch_data_dir(_data_path(table), first.pipeline, first.sink, epoch)
            folder = f"{epoch_dir}/apply-{uuid.uuid4().hex[:12]}"
            try:
                self._one_commit(table, epoch, group, staged, folder, attempt)
                return self._load()
            except CommitFailedException as exc:
                store.delete_dir(folder)  # surely not in the table
                if attempt > self.config.table.commit_retries:
                    raise
                log.info("%s: epoch %s commit conflicted (%s); retrying", self.config.where, epoch, exc)
            except CommitStateUnknownException as exc:
                if attempt > self.config.table.commit_retries:
                    raise
                log.info("%s: epoch %s commit state unknown (%s); re-reading", self.config.where, epoch, exc)
            time.sleep(min(0.05 * (2 ** (attempt - 1)), 2.0) * (1 + random.random()))
        return None

    def _one_commit(
        self, table: Table, epoch: int, group: list[Committable], staged: list[str], folder: str, attempt: int
    ) -> None:
        first = group[0]
        plan = self._plan(table, _read_staged(table, staged, self.config.table.store(table.location())))
        new_files = _write_data_files(table, plan.rows, folder)
        summary = {
            SUMMARY_PIPELINE: first.pipeline,
            SUMMARY_SINK: first.sink,
            SUMMARY_EPOCH: str(epoch),
            SUMMARY_ATTEMPT: str(attempt),
            SUMMARY_PARTICIPANTS: str(len(group)),
            **plan.summary,
        }
        transaction = _single_try(table).transaction()
        transaction.set_properties({committed_property(first.pipeline, first.sink): str(epoch)})
        if plan.deleted or new_files:
            with transaction.update_snapshot(snapshot_properties=summary).overwrite() as producer:
                for data_file in plan.deleted:
                    producer.delete_data_file(data_file)
                for data_file in new_files:
                    producer.append_data_file(data_file)
        transaction.commit_transaction()

    def _plan(self, table: Table, staged: pa.Table) -> _Plan:
        """The last change per key, truncates applied; the files holding changed keys, and the rows that
        replace them: their unchanged rows and the upserted ones."""
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = list(self.config.key_columns)
        target = table.schema().as_arrow()
        live, truncates = applicable(staged, keys)
        upserts = live.filter(pc.not_equal(live[OP], "d"))
        changed = live.select(keys)
        tasks = list(table.scan().plan_files())
        deleted: list[DataFile] = []
        kept: list[pa.Table] = []
        if truncates:
            deleted = [task.file for task in tasks]
        elif changed.num_rows:
            for task in tasks:
                if not _may_hold(task.file, table, changed, keys):
                    continue
                rows = _read_data_file(table, task)
                rest = _without_keys(rows, changed, keys)
                if rest.num_rows < rows.num_rows:
                    deleted.append(task.file)
                    kept.append(rest)
        rows = pa.concat_tables([_fit(t, target) for t in (*kept, upserts.select([f.name for f in target]))])
        summary = {
            SUMMARY_UPSERTED_KEYS: str(upserts.num_rows),
            SUMMARY_DELETED_KEYS: str(live.num_rows - upserts.num_rows),
            SUMMARY_TRUNCATED: str(truncates).lower(),
        }
        return _Plan(deleted, rows, summary)

    def _forget(self, table: Table, group: list[Committable]) -> None:
        """The applied epoch's staged files and markers: no longer staged output."""
        store = self.config.table.store(table.location())
        for c in group:
            store.delete_dir(files.attempt_data_dir(_data_path(table), c))
            store.delete_file(files.marker_uri(table.location(), c))

    def abort(self, committables: Sequence[Committable]) -> None:
        """Delete the attempts' staged files and markers (no snapshot ever references them)."""
        table = self._load()
        if table is not None:
            self._forget(table, list(committables))

    def orphans(self, pipeline: str) -> list[Committable]:
        table = self._load()
        if table is None:
            return []
        store = self.config.table.store(table.location())
        return files.list_markers(store, table.location(), pipeline, self.config.table.name)


def _read_staged(table: Table, paths: Sequence[str], store: files.Store) -> pa.Table:
    """The staged changes, in the table's current schema (columns added since as nulls)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = staging_schema(table)
    parts = [pq.read_table(store.path(p), filesystem=store.fs) for p in paths]
    return pa.concat_tables([_fit(p, schema) for p in parts]) if parts else schema.empty_table()


def _fit(arrow: pa.Table, schema: pa.Schema) -> pa.Table:
    """``arrow`` with ``schema``'s columns and types (a missing column as nulls)."""
    import pyarrow as pa

    columns = [
        arrow.column(f.name).cast(f.type)
        if f.name in arrow.schema.names
        else pa.nulls(arrow.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _may_hold(data_file: DataFile, table: Table, changed: pa.Table, keys: Sequence[str]) -> bool:
    """Whether some changed key lies within the file's bounds of every key column (True when a bound
    is unknown or cannot be compared)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.conversions import from_bytes

    schema = table.schema()
    inside = pa.array([True] * changed.num_rows)
    for key in keys:
        field = schema.find_field(key)
        lower = (data_file.lower_bounds or {}).get(field.field_id)
        upper = (data_file.upper_bounds or {}).get(field.field_id)
        if lower is None or upper is None:
            continue
        column = changed[key]
        try:
            key_type: Any = field.field_type  # a flat type: the config allows no other key
            low = pa.scalar(from_bytes(key_type, lower), column.type)
            high = pa.scalar(from_bytes(key_type, upper), column.type)
            within = pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError):
            continue
        inside = pc.and_(inside, pc.fill_null(within, False))
    return bool(pc.any(inside).as_py())


def _read_data_file(table: Table, task: FileScanTask) -> pa.Table:
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    return ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table([task])


def _without_keys(rows: pa.Table, changed: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``rows`` whose key is not among ``changed``'s (only the keys take part in the join)."""
    import pyarrow as pa

    index = rows.select(list(keys)).append_column("_row", pa.array(range(rows.num_rows), pa.int64()))
    probe = pa.Table.from_arrays(
        [changed[k].cast(index.schema.field(k).type) for k in keys], names=list(keys)
    )
    rest = index.join(probe, keys=list(keys), join_type="left anti", use_threads=False)
    return rows.take(rest["_row"].combine_chunks().sort())


def _write_data_files(table: Table, rows: pa.Table, folder: str) -> list[DataFile]:
    """The rows as data files of the table's partition spec, under ``folder``."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.table import TableProperties

    if rows.num_rows == 0:
        return []
    nested.keep_null_lists()
    properties = {
        k: v
        for k, v in table.metadata.properties.items()
        if k != TableProperties.WRITE_PY_LOCATION_PROVIDER_IMPL
    }
    properties[TableProperties.WRITE_DATA_PATH] = folder
    properties[TableProperties.OBJECT_STORE_ENABLED] = "false"
    metadata = table.metadata.model_copy(update={"properties": properties})
    written = list(_dataframe_to_data_files(metadata, rows, table.io, uuid.uuid4(), itertools.count(0)))
    for data_file in written:
        files.make_durable(data_file.file_path)
    return written


# ------------------------------------------------------------------------------------ plan checks


def plan_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    """Only a change stream has ops to apply, by the key it is partitioned by; then each table is
    created, or checked (and given new columns), as the append sink does."""
    key = stream_key(spec, configs, KIND, "iceberg")
    for mapping in configs:
        config = ChangesConfig.from_mapping(mapping)
        check_key(config.where, config.key_columns, key)
        if apply:
            _ensure_table(config)
            continue
        found = tables.load(config.table.open_catalog(), config.table.table)
        if found is not None:
            tables.new_fields(found, tables.schema_of(config.table.columns, config.where), config.where)


def _defaults(settings: Settings) -> dict[str, Any]:
    return {"catalog_properties": default_catalog_properties(settings.home)}


SINK_KIND = SinkKind(
    name=KIND,
    writer=IcebergChangesWriter,
    committer=IcebergChangesCommitter,
    guarantee="exactly_once",
    columns=change_columns,
    plan_checks=plan_checks,
    defaults=_defaults,
    settings=change_settings(APPEND_KIND.settings),
)
