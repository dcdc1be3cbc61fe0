"""Apache Iceberg sink: data files staged per task attempt, one snapshot per epoch, readable by any engine.

* The **writer** (in a Spark task) writes Parquet data files for its attempt under the table's data
  location (see `files` for the layout), split by the table's partition spec, and returns a
  committable listing each file with its Iceberg metadata: record count, size, column statistics and
  partition values. Nothing is visible: no snapshot references the files yet.
* The **committer** appends every participant's files of an epoch in **one** snapshot (one atomic
  table commit, an ``overwrite`` when a re-run interval replaces earlier epochs' files), whose summary
  names the pipeline, the sink and the epoch. The same metadata commit sets the table property
  ``onceflow.committed-epoch.<pipeline>.<sink>`` to the epoch: epochs of a pipeline commit in order, so
  that one number says which epochs are in the table. A repeated commit reads it (and the snapshots'
  summaries) first and does nothing when its epoch is there. Expiring snapshots never touches table
  properties, so the marker survives any snapshot expiry. A concurrent commit by another writer of the
  table is retried, each time re-reading the marker (pyiceberg's own retry, which would append again
  without looking, is kept off for these commits).
* **Abort** and the sweeper delete an attempt's files and marker; files that a snapshot references are
  never deleted (abort of a committed attempt is refused).

A table is created from the sink's ``columns``, or the pipeline's decoded rows when it has no
transform, at plan time, or else from the first rows a writer sees. Struct, list and map columns nest
to any depth, with field ids that the catalog assigns; a nested field, element or map value is required
unless its row type says ``?`` (a column itself is always nullable). A new column, or a new field of a
struct column, of list elements or of map values, is added as an optional one (Iceberg's additive
evolution, ids kept) in a schema update committed at plan time, before the epoch's snapshot; a field
whose type changed is refused at plan time.

The warehouse may be a bucket (``warehouse: s3://bucket/prefix`` in ``catalog_properties``): the sink's
config then carries the deployment's object-store settings (``s3``), which become pyiceberg's ``s3.*``
FileIO properties and the settings of every `files.Store` the writer, committer and sweeper build.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow import redact
from onceflow.errors import ConfigError
from onceflow.sinks._config import ConfigReader, deployment_default
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.errors import AlreadyCommitted, RowError, StagedOutputLost, WriterStateError
from onceflow.sinks.iceberg import files, nested
from onceflow.sinks.iceberg import table as tables
from onceflow.sinks.registry import SinkKind, SinkSetting

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

    from onceflow.config import Settings
    from onceflow.pipeline import Pipeline

KIND = "iceberg"
SUMMARY_PIPELINE = "onceflow.pipeline"
SUMMARY_SINK = "onceflow.sink"
SUMMARY_EPOCH = "onceflow.epoch"
SUMMARY_ATTEMPT = "onceflow.commit-attempt"
SUMMARY_PARTICIPANTS = "onceflow.participants"
SUMMARY_REPLACES = "onceflow.replaces"
COMMITTED_PROPERTY = "onceflow.committed-epoch"

log = logging.getLogger(__name__)


def default_catalog_properties(home: Any) -> dict[str, str]:
    """pyiceberg's SQL catalog in SQLite under ONCEFLOW_HOME, with its warehouse beside it."""
    return {
        "type": "sql",
        "uri": f"sqlite:///{home}/iceberg/catalog.db",
        "warehouse": f"file://{home}/iceberg/warehouse",
    }


def committed_property(pipeline: str, sink: str) -> str:
    return f"{COMMITTED_PROPERTY}.{pipeline}.{sink}"


@dataclass(frozen=True)
class IcebergConfig:
    """See the `SinkSetting`s of `SINK_KIND` for what each key means."""

    table: str
    catalog: str = "onceflow"
    catalog_properties: tuple[tuple[str, str], ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    partition_by: tuple[tuple[str, str], ...] = ()
    properties: tuple[tuple[str, str], ...] = ()
    rows_per_file: int = 100_000
    commit_retries: int = 10
    name: str | None = None
    kind: str = KIND  # the sink kind whose config this is, for messages
    s3: files.S3Settings | None = None  # the object store of a warehouse in a bucket

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> IcebergConfig:
        config, s3 = files.take_s3(config, KIND)
        reader = ConfigReader(KIND, config)
        parsed = cls(
            table=reader.string("table"),
            catalog=reader.string("catalog", "onceflow"),
            catalog_properties=reader.columns("catalog_properties", required=False),
            columns=reader.columns(required=False),
            partition_by=reader.columns("partition_by", required=False),
            properties=reader.columns("properties", required=False),
            rows_per_file=reader.integer("rows_per_file", 100_000, minimum=1),
            commit_retries=reader.integer("commit_retries", 10, minimum=0),
            name=reader.optional_string("name"),
            s3=s3,
        )
        reader.finish()
        tables.identifier(parsed.table)
        if parsed.columns:
            tables.schema_of(parsed.columns, parsed.where)
        return parsed

    @property
    def where(self) -> str:
        return f"{self.kind} sink {self.name or '?'} table {self.table}"

    def catalog_properties_with_s3(self) -> dict[str, str]:
        """The catalog's properties, with pyiceberg's ``s3.*`` FileIO properties from the object-store
        settings when the sink has them (those the sink's ``catalog_properties`` set themselves win).
        They hold credentials: never print them unredacted."""
        properties = dict(self.catalog_properties)
        if self.s3 is None:
            return properties
        return {**self.s3.iceberg_properties(), **properties}

    def store(self, location: str) -> files.Store:
        """The file system of a location of the table (data files, markers), in the bucket through the
        sink's object-store settings."""
        return files.Store.for_location(location, s3=self.s3)

    def open_catalog(self) -> Catalog:
        if not self.catalog_properties:  # the kind's defaults fill them with the catalog under the home
            raise deployment_default(self.kind, "catalog_properties", "Settings.home (ONCEFLOW_HOME)")
        properties = self.catalog_properties_with_s3()
        try:
            return tables.catalog(self.catalog, properties)
        except Exception as exc:
            raise ConfigError(
                f"{self.where}: cannot open the Iceberg catalog {self.catalog!r} "
                f"({type(exc).__name__}: {' '.join(redact.text(exc).split())}); check catalog_properties"
            ) from exc


def _as_config(config: IcebergConfig | Mapping[str, Any]) -> IcebergConfig:
    return config if isinstance(config, IcebergConfig) else IcebergConfig.from_mapping(config)


def _data_path(table: Table) -> str:
    return str(table.location_provider().data_path)


def is_committed(table: Table, pipeline: str, sink: str, epoch: int) -> bool:
    """Whether the table holds ``epoch`` of (pipeline, sink): the committed-epoch property, which no
    snapshot expiry removes, or a snapshot whose summary names that epoch."""
    mark = table.properties.get(committed_property(pipeline, sink))
    if mark is not None and int(mark) >= epoch:
        return True
    wanted = {SUMMARY_PIPELINE: pipeline, SUMMARY_SINK: sink, SUMMARY_EPOCH: str(epoch)}
    return any(
        s.summary is not None and all(s.summary.get(k) == v for k, v in wanted.items())
        for s in table.snapshots()
    )


def referenced_files(table: Table) -> set[str]:
    """Every data file that any snapshot still in the table's metadata references."""
    seen_manifests: set[str] = set()
    paths: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(entry.data_file.file_path)
    return paths


# ----------------------------------------------------------------------------------------- writer


def _arrow_columns(schema: Any, where: str) -> list[tuple[str, Any]]:
    """A table's columns (pyiceberg types) from the Arrow schema of the first rows, when nothing
    declared them; structs, lists and maps nest to any depth."""
    try:
        return [(field.name, tables.arrow_type(field.type, where, field.name)) for field in schema]
    except ConfigError as exc:
        raise RowError(str(exc)) from exc


class IcebergWriter:
    """Stages a task's output as data files of its attempt, ``rows_per_file`` rows at a time.

    Rows (``write``) and Arrow batches (``write_batch``, a Spark task's path) become the same Arrow data,
    typed by the table's schema: a column the table lacks is refused, a column the rows lack is null.
    The committable's checksum is the SHA-256 of its files' metadata (paths, sizes, counts, statistics).
    """

    def __init__(self, config: IcebergConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        self._task: TaskContext | None = None
        self._table: Table | None = None
        self._store: files.Store | None = None
        self._pending: list[Any] = []  # Arrow tables typed by the table's schema, not yet in data files
        self._pending_rows = 0
        self._files: list[dict[str, Any]] = []
        self._count = 0
        self._write_uuid = uuid.uuid4()
        self._counter: Any = None
        self._done = False

    def begin(self, task: TaskContext) -> None:
        import itertools

        if self._task is not None:
            raise WriterStateError(f"{KIND} writer: begin() called twice (for {task.txn_id})")
        self._task = task
        self._counter = itertools.count(0)
        table = tables.load(self.config.open_catalog(), self.config.table)
        if table is not None:
            self._open(table)

    def _open(self, table: Table) -> None:
        self._table = table
        self._store = start_attempt(table, self._require(), self.config.store(table.location()))

    def _require(self) -> TaskContext:
        if self._task is None or self._done:
            raise WriterStateError(f"{KIND} writer: write/pre_commit needs begin() first and no pre_commit()")
        return self._task

    def write(self, rows: Iterable[Row]) -> None:
        import pyarrow as pa

        self._require()
        chunk = list(rows)
        for row in chunk:
            if not isinstance(row, Mapping):
                raise RowError(f"{self.config.where}: a row must be a mapping, got {type(row).__name__}")
        if not chunk:
            return
        names = list(chunk[0])
        names += sorted(set().union(*chunk).difference(names))  # a key any row has is a column
        schema = self._arrow_schema(names, lambda: _inferred(chunk, self.config.where))
        nested.check_keys(chunk, schema, self.config.where)
        try:
            arrow = pa.Table.from_pylist(chunk, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RowError(f"{self.config.where}: rows do not fit the table's schema: {exc}") from exc
        self._add(arrow)

    def write_batch(self, batch: Any) -> None:
        """Stage an Arrow record batch as `write` stages its rows, without a Python object per value."""
        self._require()
        if batch.num_rows == 0:
            return
        schema = self._arrow_schema(list(batch.schema.names), lambda: batch.schema)
        self._add(fitted(batch, schema, self.config.where))

    def _arrow_schema(self, names: list[str], inferred: Any) -> Any:
        """The table's Arrow schema for data with these column names; the table is created from the
        data (``inferred()``, an Arrow schema) when it does not exist, or given the data's new columns
        when the sink declares none."""
        current = self._table
        fits = current is not None and set(names) <= {f.name for f in current.schema().fields}
        if not fits and (current is None or not self.config.columns):  # declared columns are the contract
            current = self._table_for(inferred())
        assert current is not None
        unknown = [n for n in names if n not in {f.name for f in current.schema().fields}]
        if unknown:
            raise RowError(f"{self.config.where}: columns {unknown} are not in the table")
        return current.schema().as_arrow()

    def _table_for(self, schema: Any) -> Table:
        """The table, created from the data's schema (or given its new columns) when it needs it."""
        cat = self.config.open_catalog()
        wanted = tables.schema_of_types(_arrow_columns(schema, self.config.where))
        table: Table = _with_retries(
            lambda: tables.ensure_table(
                cat,
                self.config.table,
                wanted,
                self.config.partition_by,
                dict(self.config.properties),
                self.config.where,
            )
        )
        if self._table is None:
            self._open(table)
        self._table = table
        return table

    def _add(self, arrow: Any) -> None:
        nested.check_required(arrow, self.config.where)
        self._pending.append(arrow)
        self._pending_rows += arrow.num_rows
        self._count += arrow.num_rows
        if self._pending_rows >= self.config.rows_per_file:
            self._flush(final=False)

    def _flush(self, final: bool = True) -> None:
        """Write pending data as data files of ``rows_per_file`` rows (fewer per partition); unless
        ``final``, a last part smaller than that stays pending."""
        import pyarrow as pa
        from pyiceberg.io.pyarrow import _dataframe_to_data_files
        from pyiceberg.table import TableProperties

        size = self.config.rows_per_file
        if self._pending_rows < (1 if final else size):
            return
        nested.keep_null_lists()
        task = self._require()
        table = self._table
        assert table is not None
        schema = table.schema().as_arrow()
        arrow = pa.concat_tables([t if t.schema == schema else _widened(t, schema) for t in self._pending])
        # The attempt's own data folder, whatever location provider the table uses.
        properties = {
            k: v
            for k, v in table.metadata.properties.items()
            if k != TableProperties.WRITE_PY_LOCATION_PROVIDER_IMPL
        }
        properties[TableProperties.WRITE_DATA_PATH] = files.attempt_data_dir(_data_path(table), task)
        properties[TableProperties.OBJECT_STORE_ENABLED] = "false"
        metadata = table.metadata.model_copy(update={"properties": properties})
        start = 0
        while arrow.num_rows - start >= size or (final and start < arrow.num_rows):
            part = arrow.slice(start, size)
            start += part.num_rows
            try:
                written = list(
                    _dataframe_to_data_files(metadata, part, table.io, self._write_uuid, self._counter)
                )
            except ValueError as exc:
                raise RowError(f"{self.config.where}: rows do not fit the table's schema: {exc}") from exc
            for data_file in written:
                files.make_durable(data_file.file_path)
                self._files.append(files.data_file_to_json(data_file, table.metadata))
        rest = arrow.slice(start)
        self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def pre_commit(self) -> Committable:
        task = self._require()
        self._flush()
        self._done = True
        return finish_attempt(task, self.config.table, self._files, self._count, self._table, self._store)

    def abort(self) -> None:
        drop_attempt(self._task, self._table, self._store)


def start_attempt(table: Table, task: TaskContext, store: files.Store) -> files.Store:
    """Start a task attempt in ``table`` (whose files ``store`` reaches): a fresh data folder, and its
    marker written first (what the orphan scan finds if the attempt dies)."""
    store.delete_dir(files.attempt_data_dir(_data_path(table), task))  # never mix two runs
    started = Committable.for_task(task, handle={"incomplete": True})
    store.write(files.marker_uri(table.location(), task), started.to_json().encode())
    return store


def finish_attempt(
    task: TaskContext,
    table_name: str,
    staged: list[dict[str, Any]],
    count: int,
    table: Table | None,
    store: files.Store | None,
) -> Committable:
    """The attempt's committable (its checksum: the SHA-256 of its files' metadata), also written over
    its marker."""
    import hashlib
    import json

    committable = Committable.for_task(
        task,
        handle={"table": table_name, "files": list(staged)},
        record_count=count,
        checksum=hashlib.sha256(json.dumps(staged, sort_keys=True).encode()).hexdigest(),
    )
    if table is not None and store is not None:
        store.write(files.marker_uri(table.location(), task), committable.to_json().encode())
    return committable


def drop_attempt(task: TaskContext | None, table: Table | None, store: files.Store | None) -> None:
    """Delete an attempt's data folder and marker (nothing when it never started in the table)."""
    if task is None or table is None or store is None:
        return
    store.delete_dir(files.attempt_data_dir(_data_path(table), task))
    store.delete_file(files.marker_uri(table.location(), task))


def fitted(batch: Any, schema: Any, where: str) -> Any:
    """An Arrow batch as a table of ``schema``: its columns cast (nested ones fitted), the columns it
    lacks null; a column that does not fit is a `RowError` naming it."""
    import pyarrow as pa

    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        column = batch.column(index) if index >= 0 else pa.nulls(batch.num_rows, field.type)
        if nested.is_nested(field.type):
            columns.append(nested.fit_column(column, field.type, where, field.name))
            continue
        try:
            columns.append(column if column.type == field.type else column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise RowError(
                f"{where}: column {field.name!r} ({column.type}) does not fit the table's {field.type}: {exc}"
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)


def _inferred(rows: list[Row], where: str) -> Any:
    """The Arrow schema of rows as Arrow infers it (a dict is a struct of the keys the rows have)."""
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows).schema
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise RowError(
            f"{where}: the table's columns cannot be inferred from the rows ({exc}); declare `columns`"
        ) from exc


def _widened(arrow: Any, schema: Any) -> Any:
    """Data staged before the table gained columns, with those columns as nulls."""
    import pyarrow as pa

    columns = [
        arrow.column(f.name) if f.name in arrow.schema.names else pa.nulls(arrow.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


# -------------------------------------------------------------------------------------- committer


def _with_retries(action: Any, attempts: int = 5) -> Any:
    """Run a catalog update, again after a concurrent update of the same table (another task's)."""
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(attempts):
        try:
            return action()
        except CommitFailedException:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (2**attempt) * (1 + random.random()))
    return None


def _single_try(table: Table) -> Table:
    """The same table with pyiceberg's commit retry off: a retry must re-read onceflow's marker first,
    which only the committer's own loop does."""
    from pyiceberg.table import Table, TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    return Table(
        table.name(),
        table.metadata.model_copy(update={"properties": properties}),
        table.metadata_location,
        table.io,
        table.catalog,
    )


class IcebergCommitter:
    """Commits an epoch's data files in one snapshot, idempotently; aborts by deleting unreferenced files."""

    def __init__(self, config: IcebergConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)

    def _load(self) -> Table | None:
        return tables.load(self.config.open_catalog(), self.config.table)

    def commit(self, committables: Sequence[Committable]) -> None:
        """Per epoch: 1. re-read the table; if the marker says the epoch is in, stop; 2. check every
        staged file is there; 3. one metadata commit: the snapshot (append, or overwrite of the replaced
        epochs' files) and the committed-epoch property; a conflict goes back to 1; 4. delete the
        attempts' markers, which are no longer staged output."""
        for epoch, group in _by_epoch(committables).items():
            for c in group:
                if c.handle.get("incomplete"):
                    raise StagedOutputLost(f"{KIND}: {c.sink} epoch {c.epoch} {c.task} never pre-committed")
            table = self._commit_epoch(epoch, group)
            if table is not None:
                store = self.config.store(table.location())
                for c in group:
                    store.delete_file(files.marker_uri(table.location(), c))

    def _commit_epoch(self, epoch: int, group: list[Committable]) -> Table | None:
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        first = group[0]
        specs = [spec for c in group for spec in c.handle.get("files", [])]
        for attempt in range(1, self.config.commit_retries + 2):
            # 1.
            table = self._load()
            if table is None:
                if specs:
                    raise StagedOutputLost(
                        f"{self.config.where}: the table is gone, with epoch {epoch}'s "
                        f"{len(specs)} data files"
                    )
                return None
            if is_committed(table, first.pipeline, first.sink, epoch):
                return table
            # 2.
            store = self.config.store(table.location())
            missing = [s["path"] for s in specs if not store.exists(s["path"])]
            if missing:
                raise StagedOutputLost(
                    f"{self.config.where}: epoch {epoch} is not in the table and {len(missing)} of its data "
                    f"files are gone (e.g. {missing[0]})"
                )
            # 3.
            try:
                self._one_commit(table, epoch, group, specs, attempt)
                return self._load()
            except (CommitFailedException, CommitStateUnknownException) as exc:
                if attempt > self.config.commit_retries:
                    raise
                log.info("%s: epoch %s commit conflicted (%s); retrying", self.config.where, epoch, exc)
                time.sleep(min(0.05 * (2 ** (attempt - 1)), 2.0) * (1 + random.random()))
        return None

    def _one_commit(
        self, table: Table, epoch: int, group: list[Committable], specs: list[dict[str, Any]], attempt: int
    ) -> None:
        first = group[0]
        data_files = [files.data_file_from_json(s, table.metadata) for s in specs]
        summary = {
            SUMMARY_PIPELINE: first.pipeline,
            SUMMARY_SINK: first.sink,
            SUMMARY_EPOCH: str(epoch),
            SUMMARY_ATTEMPT: str(attempt),
            SUMMARY_PARTICIPANTS: str(len(group)),
        }
        replaced = self._replaced_files(table, first) if first.replaces else []
        if first.replaces:
            summary[SUMMARY_REPLACES] = ",".join(str(n) for n in first.replaces)
        transaction = _single_try(table).transaction()
        transaction.set_properties({committed_property(first.pipeline, first.sink): str(epoch)})
        if data_files or replaced:
            update = transaction.update_snapshot(snapshot_properties=summary)
            producer: Any = update.overwrite() if replaced else update.fast_append()
            with producer:
                for data_file in replaced:
                    producer.delete_data_file(data_file)
                for data_file in data_files:
                    producer.append_data_file(data_file)
        transaction.commit_transaction()

    def _replaced_files(self, table: Table, c: Committable) -> list[DataFile]:
        """The live data files that the replaced epochs of this (pipeline, sink) wrote."""
        prefixes = tuple(
            files.epoch_data_dir(_data_path(table), c.pipeline, c.sink, n) + "/" for n in c.replaces
        )
        return [task.file for task in table.scan().plan_files() if task.file.file_path.startswith(prefixes)]

    def abort(self, committables: Sequence[Committable]) -> None:
        """Delete the attempts' data files and markers; refuse when a snapshot references their files."""
        table = self._load()
        if table is None:
            return
        store = self.config.store(table.location())
        referenced: set[str] | None = None
        for c in committables:
            folder = files.attempt_data_dir(_data_path(table), c)
            if is_committed(table, c.pipeline, c.sink, c.epoch):
                if referenced is None:
                    referenced = referenced_files(table)
                held = [p for p in store.files_under(folder) if p in referenced or _plain(p) in referenced]
                if held:
                    raise AlreadyCommitted(f"{KIND}: {held[0]} is in a snapshot of {self.config.table}")
            store.delete_dir(folder)
            store.delete_file(files.marker_uri(table.location(), c))

    def orphans(self, pipeline: str) -> list[Committable]:
        table = self._load()
        if table is None:
            return []
        store = self.config.store(table.location())
        return files.list_markers(store, table.location(), pipeline, self.config.name)


def _plain(uri: str) -> str:
    """``file:///x`` as ``file:/x`` (how some engines spell local paths in manifests) and back."""
    if uri.startswith("file:///"):
        return "file:" + uri.removeprefix("file://")
    if uri.startswith("file:/"):
        return "file://" + uri.removeprefix("file:")
    return uri


def _by_epoch(committables: Sequence[Committable]) -> dict[int, list[Committable]]:
    groups: dict[int, list[Committable]] = {}
    for c in sorted(committables, key=lambda c: (c.epoch, c.task)):
        groups.setdefault(c.epoch, []).append(c)
    return groups


# ------------------------------------------------------------------------------------ plan checks


def wanted_columns(spec: Pipeline, config: IcebergConfig) -> list[tuple[str, str]] | None:
    """The table's columns as known before anything runs: declared, or the decoded rows' when there is
    no transform (nor state); None when only the transform's output will tell."""
    if config.columns:
        return list(config.columns)
    from onceflow.pipeline import AvroFormat

    if isinstance(spec.format, AvroFormat) and not spec.format.pinned:
        return None  # a subject's schema is pinned per slice: the first rows will tell
    if spec.transform is None and spec.state is None:
        from onceflow.decoding.records import row_columns

        columns = row_columns(spec.format)
        unmapped = [
            f"{name} ({type_name})" for name, type_name, _ in columns if tables.row_type(type_name) is None
        ]
        if unmapped:
            raise ConfigError(
                f"{config.where}: the decoded rows' columns {unmapped} have no Iceberg type in this sink yet"
            )
        return [(name, str(tables.row_type(type_name))) for name, type_name, _ in columns]
    return None


def plan_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    """Open each sink's catalog; create its table when the columns are known, or check the existing
    table's schema (adding new fields as optional ones; a changed type is refused in one line). A
    preview (``apply`` false) only checks: it creates and adds nothing."""
    for mapping in configs:
        config = IcebergConfig.from_mapping(mapping)
        cat = config.open_catalog()
        columns = wanted_columns(spec, config)
        if columns is None:
            continue
        wanted = tables.schema_of(columns, config.where)
        if not apply:
            found = tables.load(cat, config.table)
            if found is not None:
                tables.new_fields(found, wanted, config.where)
            continue
        _with_retries(
            lambda cat=cat, config=config, wanted=wanted: tables.ensure_table(
                cat, config.table, wanted, config.partition_by, dict(config.properties), config.where
            )
        )


def _defaults(settings: Settings) -> dict[str, Any]:
    return {"catalog_properties": default_catalog_properties(settings.home)}


def _columns(config: Mapping[str, Any]) -> list[str] | None:
    from onceflow.sinks.registry import configured_columns

    return configured_columns(config)


SINK_KIND = SinkKind(
    name=KIND,
    writer=IcebergWriter,
    committer=IcebergCommitter,
    guarantee="exactly_once",
    replaceable=True,
    columns=_columns,
    plan_checks=plan_checks,
    defaults=_defaults,
    settings=(
        SinkSetting(
            "table",
            "string",
            "the table's identifier, `namespace.name` (a bare name is in `default`; both created if missing)",
            required=True,
        ),
        SinkSetting("catalog", "string", "the catalog's name for pyiceberg", default="onceflow"),
        SinkSetting(
            "catalog_properties",
            "columns",
            "pyiceberg catalog properties, e.g. `{type: rest, uri: …}` or `{type: sql, uri: "
            "postgresql+psycopg://…, warehouse: …}`; a `warehouse: s3://bucket/prefix` is reached with "
            "the `AWS_*` settings, given to pyiceberg as its `s3.*` properties",
            default_from="SQL catalog in SQLite under `ONCEFLOW_HOME/iceberg`",
        ),
        SinkSetting(
            "columns",
            "columns",
            "the table's columns, `{name: type}` (`string`, `long`, `int`, `double`, `boolean`, `date`, "
            "`timestamp`, `decimal(p,s)`, … or Arrow names such as `int64`), or a row type's text such as "
            "`array<struct<sku:string,qty:int>>` or `map<string,int?>` (row names: `int` 64-bit, `float` "
            "double; nested fields required unless `?`); columns nullable",
            default_from="the decoded rows without a transform, else the first rows written",
        ),
        SinkSetting(
            "partition_by",
            "columns",
            "the partition spec of a new table, `{column: transform}` (`identity`, `day`, `hour`, "
            "`bucket[16]`, `truncate[4]`, …)",
            default_from="unpartitioned",
        ),
        SinkSetting("properties", "columns", "table properties of a new table", default_from="none"),
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
