"""The Delta sink's writer: a task attempt's rows staged as Parquet files in the table's folder.

The files are in no table version (the log does not name them) until the epoch's commit adds them.
The table is opened, or created from the declared columns or the first rows, at the first write; its
schema is the contract: a column the table lacks is refused, a column the rows lack is written as nulls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from onceflow.errors import ConfigError
from onceflow.sinks._arrow import as_declared, unique_names
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.delta import evolution, layout
from onceflow.sinks.delta.config import (
    DeltaConfig,
    as_config,
    check_partitions,
    declared_schema,
    plain_schema,
)
from onceflow.sinks.errors import RowError, WriterStateError

log = logging.getLogger(__name__)


def table_layout(config: DeltaConfig) -> tuple[Any, tuple[str, ...]] | None:
    """The table's Arrow schema and partition columns, or None when there is no Delta table at its path."""
    import pyarrow as pa

    if not config.is_table():
        return None
    table = config.open_table()
    return pa.schema(table.schema().to_arrow()), tuple(table.metadata().partition_columns)


def ensure_table(config: DeltaConfig, schema: Any) -> tuple[Any, tuple[str, ...]]:
    """The table's schema and partition columns, after creating the table from ``schema`` when it does
    not exist; two tasks that create it at once both end with the one that won."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    found = table_layout(config)
    if found is not None:
        return found
    if not config.create_table:
        raise RowError(f"{config.where}: there is no Delta table there, and create_table is false")
    check_partitions(schema, config.partition_by, config.where)
    try:
        DeltaTable.create(
            config.path,
            schema,
            mode="ignore",
            partition_by=list(config.partition_by) or None,
            configuration=dict(config.properties) or None,
            storage_options=config.storage_options,
        )
    except DeltaError:
        if table_layout(config) is None:  # not another task's creation: a real failure
            raise
    created = table_layout(config)
    assert created is not None
    return created


def check_table(config: DeltaConfig, columns: tuple[tuple[str, str], ...] | None, apply: bool) -> None:
    """The plan-time check of one sink's table: a missing table that may not be created, one partitioned
    otherwise than configured, one whose transactions expire, or one whose column would change type is
    refused in one line; a missing table whose columns are known is created, and new columns and nested
    fields are added to an existing one (`evolution`; refused with ``create_table`` false). A preview
    (``apply`` false) creates and adds nothing."""
    existing = table_layout(config)
    if existing is not None:
        check_transactions_kept(config)
    if existing is None and not config.create_table:
        raise ConfigError(f"{config.where}: there is no Delta table there, and create_table is false")
    if existing is not None and config.partition_by and config.partition_by != existing[1]:
        raise ConfigError(
            f"{config.where}: the table is partitioned by {list(existing[1])}, not by the "
            f"configured {list(config.partition_by)}"
        )
    if columns is None:
        return
    wanted = declared_schema(columns, config.where)
    if existing is None:
        if apply:
            ensure_table(config, wanted)
        return
    added = evolution.widenings(existing[0], wanted, config.where)
    if not added:
        return
    if not config.create_table:
        raise ConfigError(
            f"{config.where}: the table lacks the columns or fields of {[f.name for f in added]}, and "
            "create_table is false: add them to the table first"
        )
    if apply:
        evolution.widen(config.open_table(), added, config.where)
        log.info("%s: added or widened the columns %s", config.where, [f.name for f in added])


# Delta drops an app's ``txn`` version from the table's state after this long when it is set; a commit
# retried after that would not find its epoch there and would add its files again.
TRANSACTION_RETENTION = "delta.setTransactionRetentionDuration"


def check_transactions_kept(config: DeltaConfig) -> None:
    """Refuse a table that expires transaction versions: they are how a repeated commit is recognised."""
    expiring = config.open_table().metadata().configuration.get(TRANSACTION_RETENTION)
    if expiring:
        raise ConfigError(
            f"{config.where}: the table sets {TRANSACTION_RETENTION}={expiring}; onceflow recognises a "
            "repeated commit by its transaction version, which must never expire: unset it"
        )


class DeltaWriter:
    """Stages a task's output as Parquet files of its attempt, ``rows_per_file`` rows at a time."""

    def __init__(self, config: DeltaConfig | Mapping[str, Any]) -> None:
        self.config = as_config(config, check_types=False)  # the plan checked them
        self._task: TaskContext | None = None
        self._store = self.config.store()
        self._schema: Any = None
        self._partition_by: tuple[str, ...] = ()  # the table's, whatever a config of it says
        self._pending: list[Any] = []
        self._pending_rows = 0
        self._files: list[dict[str, Any]] = []
        self._count = 0
        self._done = False

    def begin(self, task: TaskContext) -> None:
        if self._task is not None:
            raise WriterStateError(f"delta writer: begin() called twice (for {task.txn_id})")
        self._task = task
        self._store.delete_dir(layout.attempt_dir(self.config.path, task))  # never mix two runs
        started = Committable.for_task(task, handle={"incomplete": True})
        self._store.write(layout.marker_uri(self.config.path, task), started.to_json().encode())

    def _require(self) -> TaskContext:
        if self._task is None or self._done:
            raise WriterStateError("delta writer: write/pre_commit needs begin() first and no pre_commit()")
        return self._task

    def _schema_for(self, inferred: Any) -> Any:
        """The table's schema, which the plan made or widened; only a table the plan could not make (its
        columns known from the rows alone) is made here, from the declared columns or these rows."""
        if self._schema is None:
            found = table_layout(self.config)
            if found is None:
                wanted = (
                    declared_schema(self.config.columns, self.config.where)
                    if self.config.columns
                    else plain_schema(inferred())
                )
                found = ensure_table(self.config, wanted)
            self._schema, self._partition_by = self._staged(*found)
        return self._schema

    def _staged(self, schema: Any, partition_by: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """The columns a task stages and the columns its files are split by, for a table of ``schema``
        partitioned by ``partition_by``: the table's own, as the commit adds the files as they are."""
        return schema, partition_by

    def write(self, rows: Iterable[Row]) -> None:
        import pyarrow as pa

        self._require()
        chunk = list(rows)
        for row in chunk:
            if not isinstance(row, Mapping):
                raise RowError(f"{self.config.where}: a row must be a mapping, got {type(row).__name__}")
        if not chunk:
            return

        def inferred() -> Any:
            try:
                return pa.Table.from_pylist(chunk).schema
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                raise RowError(
                    f"{self.config.where}: the table's columns cannot be inferred from the rows ({exc}); "
                    "declare `columns`"
                ) from exc

        schema = self._schema_for(inferred)
        unknown = sorted(set().union(*chunk).difference(schema.names))
        if unknown:
            raise RowError(f"{self.config.where}: columns {unknown} are not in the table")
        try:
            self._add(pa.Table.from_pylist(chunk, schema=schema))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RowError(f"{self.config.where}: rows do not fit the table's schema: {exc}") from exc

    def write_batch(self, batch: Any) -> None:
        """Stage an Arrow record batch as `write` stages its rows, column by column."""
        import pyarrow as pa

        self._require()
        if batch.num_rows == 0:
            return
        names = unique_names(batch, self.config.where)
        schema = self._schema_for(lambda: batch.schema)
        unknown = [n for n in names if n not in schema.names]
        if unknown:
            raise RowError(f"{self.config.where}: columns {unknown} are not in the table")
        columns = [
            as_declared(batch.column(f.name), f.type, self.config.where)
            if f.name in names
            else pa.nulls(batch.num_rows, f.type)
            for f in schema
        ]
        self._add(pa.Table.from_arrays(columns, schema=schema))

    def _add(self, arrow: Any) -> None:
        self._pending.append(arrow)
        self._pending_rows += arrow.num_rows
        self._count += arrow.num_rows
        if self._pending_rows >= self.config.rows_per_file:
            self._flush(final=False)

    def _flush(self, final: bool = True) -> None:
        """Write pending rows as files of ``rows_per_file`` rows, one partition's rows per file; unless
        ``final``, a last part smaller than that stays pending."""
        import pyarrow as pa

        size = self.config.rows_per_file
        if self._pending_rows < (1 if final else size):
            return
        arrow = pa.concat_tables(self._pending)
        start = 0
        while arrow.num_rows - start >= (1 if final else size):
            part = arrow.slice(start, size)
            start += part.num_rows
            for values, rows in _partitions(part, self._partition_by):
                self._write_file(values, rows)
        rest = arrow.slice(start)
        self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def _write_file(self, values: dict[str, str | None], rows: Any) -> None:
        import pyarrow.parquet as pq

        task = self._require()
        uri = f"{layout.attempt_dir(self.config.path, task)}/part-{len(self._files):05d}.parquet"
        path = self._store.path(uri)
        if self._store.local:  # a bucket has no folders to make
            self._store.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        pq.write_table(rows, path, filesystem=self._store.fs)
        layout.make_durable(uri)
        info = self._store.fs.get_file_info(path)
        mtime = info.mtime.timestamp() if info.mtime is not None else time.time()
        self._files.append(
            {
                "path": layout.relative(self.config.path, self._store, uri),
                "size": int(info.size),
                "partition": values,
                "rows": rows.num_rows,
                "mtime_ms": int(mtime * 1000),
            }
        )

    def pre_commit(self) -> Committable:
        task = self._require()
        self._flush()
        committable = Committable.for_task(
            task,
            handle={"path": self.config.path, "files": list(self._files)},
            record_count=self._count,
            checksum=hashlib.sha256(json.dumps(self._files, sort_keys=True).encode()).hexdigest(),
        )
        self._store.write(layout.marker_uri(self.config.path, task), committable.to_json().encode())
        self._done = True
        return committable

    def abort(self) -> None:
        if self._task is None:
            return
        self._store.delete_dir(layout.attempt_dir(self.config.path, self._task))
        self._store.delete_file(layout.marker_uri(self.config.path, self._task))


def _partitions(rows: Any, partition_by: tuple[str, ...]) -> list[tuple[dict[str, str | None], Any]]:
    """The rows of each partition value set, without the partition columns (Delta keeps their values
    in the add action, not in the file)."""
    import pyarrow.compute as pc

    if not partition_by:
        return [({}, rows)]
    keys = rows.select(list(partition_by)).group_by(list(partition_by)).aggregate([]).to_pylist()
    data = rows.drop_columns(list(partition_by))
    found = []
    for key in keys:
        mask = None
        for column, value in key.items():
            test = pc.is_null(rows[column]) if value is None else pc.equal(rows[column], value)
            test = pc.fill_null(test, False)
            mask = test if mask is None else pc.and_(mask, test)
        found.append(({c: layout.partition_text(v) for c, v in key.items()}, data.filter(mask)))
    return found
