"""One task's rows as one Parquet file, written through a pyarrow file system: the `files` sink's writers'
common part.

The local writer (`onceflow.sinks.files.FilesWriter`) writes the file in its attempt's staging folder,
the object-store one (`onceflow.sinks._files_objects.ObjectFilesWriter`) streams it straight to its
final name in the bucket; both get the same rows, schema and row groups from here, and the file's
SHA-256 and size as its bytes go out (no second read, which in a bucket would be a second download).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.sinks._arrow import (
    as_declared,
    as_inferred,
    exact_columns,
    merged_type,
    unique_names,
    widened_decimals,
)
from onceflow.sinks._files_table import KIND, FilesConfig
from onceflow.sinks._pg import row_values
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.errors import RowError, WriterStateError

if TYPE_CHECKING:
    import pyarrow as pa

# Bytes gathered before the digest and the file system see them: few Python calls per row group.
_BUFFER = 1 << 20
EMPTY_SHA256 = hashlib.sha256().hexdigest()


@dataclass(frozen=True)
class WrittenFile:
    """What a finished task file holds: rows, bytes and the SHA-256 of those bytes."""

    rows: int
    size: int
    sha256: str


class _Digesting:
    """A binary output that hashes and counts what passes through it to another stream."""

    def __init__(self, out: Any) -> None:
        self._out = out
        self._digest = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._digest.update(view)
        self._out.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._out.close()  # an object store completes the upload here: errors surface now

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()


class ParquetTaskWriter:
    """Turns rows (``write``) and Arrow batches (``write_batch``) into one Parquet file at ``_path`` of
    ``_fs``, which a subclass's ``begin`` sets (`_start`).

    Row groups hold exactly ``batch_size`` rows (the last one fewer); the schema is the declared one, or
    else the one the data infers, columns nullable. An inferred schema grows where earlier data had no
    type (an empty list, an all-null field: `merged_type`), rewriting the row groups already written,
    which is rare and keeps one file per task; any other change is an error that asks for `columns`.
    """

    def __init__(self, config: FilesConfig) -> None:
        self.config = config
        self._task: TaskContext | None = None
        self._fs: Any = None
        self._path: str | None = None
        self._schema = config.arrow_schema()
        self._declared = self._schema is not None
        self._rows: list[Row] = []  # rows not yet in Arrow form: converted batch_size at a time
        self._pending: list[pa.Table] = []  # Arrow data not yet in a row group
        self._pending_rows = 0
        self._parquet: Any = None
        self._out: _Digesting | None = None
        self._stream: Any = None
        self._count = 0
        self._done = False
        self._where = config.where

    def _start(self, task: TaskContext, filesystem: Any, path: str) -> None:
        if self._task is not None:
            raise WriterStateError(f"{KIND} writer: begin() called twice (for {task.txn_id})")
        self._task, self._fs, self._path = task, filesystem, path

    def write(self, rows: Iterable[Row]) -> None:
        task = self._require()
        names = tuple(n for n, _ in self.config.columns)
        where = f"{KIND} sink {task.sink} table {self.config.table}"
        for row in rows:
            if not isinstance(row, Mapping):
                raise RowError(f"{where}: a row must be a mapping, got {type(row).__name__}")
            if names:
                row_values(row, names, where)
            self._rows.append(row)
            self._count += 1
            if len(self._rows) + self._pending_rows >= self.config.batch_size:
                self._rows_to_arrow()
                self._write_full_groups()

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Write an Arrow batch as `write` writes its rows, without a Python object per value."""
        import pyarrow as pa

        self._require()
        self._rows_to_arrow()
        if not self._declared:
            names = unique_names(batch, self._where)
            arrays = [as_inferred(c, self._where) for c in batch.columns]
            inferred = pa.Table.from_arrays(arrays, names=names)
            if self._schema is None or inferred.schema == self._schema:
                self._add(inferred)
                self._count += batch.num_rows
                self._write_full_groups()
                return
            self._grow(inferred.schema)
            batch = pa.RecordBatch.from_arrays(arrays, names=names)
        assert self._schema is not None
        names = list(self._schema.names)
        batch = exact_columns(batch, tuple(names), self._where)
        types = [f.type for f in self._schema]
        arrays = [as_declared(c, t, self._where) for c, t in zip(batch.columns, types, strict=True)]
        self._add(pa.Table.from_arrays(arrays, names=names))
        self._count += batch.num_rows
        self._write_full_groups()

    def _require(self) -> TaskContext:
        if self._task is None or self._done:
            raise WriterStateError(f"{KIND} writer: write/pre_commit needs begin() first and no pre_commit()")
        return self._task

    def _rows_to_arrow(self) -> None:
        """Buffered rows as one Arrow table, typed by the declared or established schema if any."""
        import pyarrow as pa

        if not self._rows:
            return
        rows, self._rows = self._rows, []
        try:
            if self._declared:
                table = pa.Table.from_pylist(rows, schema=self._schema)
            else:
                table = self._inferred(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise RowError(f"{self._where}: rows do not fit: {exc}") from exc
        self._add(table)

    def _inferred(self, rows: list[Row]) -> pa.Table:
        """Rows as Arrow data of the schema their values infer, grown into the established one."""
        import pyarrow as pa

        try:
            table = widened_decimals(pa.Table.from_pylist(rows))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if self._schema is None:
                raise
            # e.g. a map as (key, value) pairs, which only a known map type reads
            return pa.Table.from_pylist(rows, schema=self._schema)
        if self._schema is None or table.schema == self._schema:
            return table
        self._grow(table.schema)
        return pa.Table.from_pylist(rows, schema=self._schema)

    def _grow(self, found: pa.Schema) -> None:
        """Make the established schema hold data of schema ``found`` too (`merged_type`): pending data is
        cast, and a file already begun is read back and written again in the same row groups under the
        same name (the attempt's own, which nothing reads before its commit); else a `RowError`."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self._schema is not None
        merged = merged_type(pa.struct(list(self._schema)), pa.struct(list(found)))
        if merged is None:
            raise RowError(
                f"{self._where}: rows changed schema from {_one_line(self._schema)} to {_one_line(found)}; "
                "declare `columns` in the sink config (nested types as text, e.g. map<string,int> for "
                "a dict of varying keys)"
            )
        target = pa.schema([merged.field(i) for i in range(merged.num_fields)])
        if target == self._schema:
            return
        self._pending = [t.cast(target) for t in self._pending]
        if self._parquet is not None:  # every group written so far is a full one: the same groups again
            self._close_file()
            written = pq.read_table(self._path, schema=self._schema, filesystem=self._fs).cast(target)
            self._open_file(target)
            for start in range(0, written.num_rows, self.config.batch_size):
                self._parquet.write_table(written.slice(start, self.config.batch_size))
        self._schema = target

    def _add(self, table: pa.Table) -> None:
        if self._schema is None:
            self._schema = table.schema
        elif table.schema != self._schema:
            raise RowError(
                f"{self._where}: rows changed schema from {self._schema} to {table.schema}; "
                "declare `columns` in the sink config"
            )
        self._pending.append(table)
        self._pending_rows += table.num_rows

    def _open_file(self, schema: pa.Schema) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._out = _Digesting(self._fs.open_output_stream(self._path))
        self._stream = pa.BufferedOutputStream(pa.PythonFile(self._out, mode="w"), _BUFFER)
        self._parquet = pq.ParquetWriter(self._stream, schema)

    def _close_file(self) -> WrittenFile:
        assert self._parquet is not None and self._out is not None
        self._parquet.close()
        self._stream.close()
        self._out.close()
        written = WrittenFile(rows=self._count, size=self._out.size, sha256=self._out.sha256)
        self._parquet = self._stream = self._out = None
        return written

    def _write_full_groups(self, final: bool = False) -> None:
        """Write pending data in row groups of ``batch_size`` rows; with ``final``, the rest too."""
        import pyarrow as pa

        size = self.config.batch_size
        if self._pending_rows < (1 if final else size):
            return
        assert self._schema is not None
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        if self._parquet is None:
            self._open_file(self._schema)
        start = 0
        while table.num_rows - start >= size or (final and start < table.num_rows):
            self._parquet.write_table(table.slice(start, size))
            start += size
        rest = table.slice(start)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def _finish(self) -> WrittenFile | None:
        """Write what is left and close the file: what it holds, or None for a task without rows (no
        file at all)."""
        self._rows_to_arrow()
        self._write_full_groups(final=True)
        return self._close_file() if self._parquet is not None else None

    def _drop_file(self) -> None:
        """Let go of a file being written (abort): closed quietly, for the subclass to delete."""
        for closing in (self._parquet, self._stream, self._out):
            if closing is not None:
                with contextlib.suppress(Exception):  # the attempt's output is being discarded
                    closing.close()
        self._parquet = self._stream = self._out = None

    def _committable(self, handle: Mapping[str, Any], checksum: str) -> Committable:
        assert self._task is not None
        return Committable.for_task(self._task, handle=handle, record_count=self._count, checksum=checksum)


def _one_line(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)
