"""The invariants every scenario must leave standing, checked from the real outputs.

Outputs are read the way a downstream user reads them: PostgreSQL tables with plain SELECTs (only
committed rows are visible), Parquet tables through their commit log (in a bucket, with a reader of the
checker's own), the Kafka output topic with a read_committed consumer. Protocol leftovers are looked for
where they would hide: prepared transactions, staging folders and markers, an epoch in flight.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import Pipeline
from onceflow.sinks.files import committed_files, read_committed_table
from onceflow.sinks.kafka import KafkaCommitter
from tests.faults.kafka_output import read_committed


@dataclass
class SinkTally:
    """What one sink holds compared with what it should: the numbers behind a guarantee."""

    sink: str
    expected: int
    delivered: int = 0  # expected ids present at least once
    lost: int = 0
    duplicates: int = 0  # extra copies of expected ids
    unexpected: int = 0  # ids that should never appear (aborted records)

    @property
    def guarantee(self) -> str:
        """As the seeds define it: anything lost is at-most-once; duplicates alone at-least-once."""
        if self.lost:
            return "at-most-once"
        return "at-least-once" if self.duplicates else "exactly-once"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "guarantee": self.guarantee}


def tally(sink: str, expected: set[int], observed: list[int]) -> SinkTally:
    counts = Counter(observed)
    return SinkTally(
        sink=sink,
        expected=len(expected),
        delivered=len(expected & counts.keys()),
        lost=len(expected - counts.keys()),
        duplicates=sum(n - 1 for i, n in counts.items() if i in expected and n > 1),
        unexpected=sum(n for i, n in counts.items() if i not in expected),
    )


def pg_ids(pg: Any, table: str) -> list[int]:
    exists = pg.execute("SELECT to_regclass(%s)", [table]).fetchone()[0]
    if exists is None:
        return []
    return [row[0] for row in pg.execute(f"SELECT id FROM {table}").fetchall()]


def kafka_records(bootstrap: str, topic: str) -> list[tuple[int, dict[str, Any]]]:
    """Every committed record of ``topic`` as (output partition, JSON value), in offset order: read by a
    plain read_committed consumer (`kafka_output`), not by the pipeline's own reader."""
    return [(r.partition, json.loads(r.value or b"null")) for r in read_committed(bootstrap, topic)]


def _inversions(rows: Iterable[tuple[Any, int]], where: Callable[[Any], str]) -> list[str]:
    """One line per row whose offset is not above the last one of its group (an output partition and
    source partition, or a file and source partition): the order invariant, checked once for every
    output that has an order."""
    last: dict[Any, int] = {}
    problems = []
    for group, offset in rows:
        if group in last and offset <= last[group]:
            problems.append(f"{where(group)} offset {offset} after {last[group]}")
        last[group] = offset
    return problems


def order_violations(records: list[tuple[int, dict[str, Any]]]) -> list[str]:
    """Within each output partition, each source partition's records must keep their offset order."""
    return _inversions(
        (((out, int(value["_partition"])), int(value["_offset"])) for out, value in records),
        lambda g: f"kafka output partition {g[0]}: source partition {g[1]}",
    )


def files_order_violations(root: Path | str, table: str) -> list[str]:
    """Within each committed file of a files sink (one task's output), each source partition's rows must
    keep their offset order."""
    import pyarrow.parquet as pq

    problems = []
    for path in committed_files(Path(root) / table):
        rows = pq.read_table(path, columns=["_partition", "_offset"]).to_pylist()
        problems += _inversions(
            ((int(row["_partition"]), int(row["_offset"])) for row in rows),
            lambda partition, name=path.name: f"files table {table}, {name}: source partition {partition}",
        )
    return problems


@dataclass
class Verdict:
    tallies: list[SinkTally] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"tallies": [t.to_dict() for t in self.tallies], "violations": self.violations}


def iceberg_ids(spec: Pipeline, sink: str, home: Path) -> list[int]:
    """The ids an engine reading the Iceberg sink's table sees (pyiceberg's scan of the current snapshot)."""
    table = _iceberg_table(spec, sink, home)
    return [] if table is None else table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()


def iceberg_config(spec: Pipeline, sink: str, home: Path) -> Any:
    """The Iceberg sink's config as the pipeline's processes parse it: the catalog the kind's defaults put
    under ``home`` when the sink names none, and the stack's S3 settings (the ``AWS_*`` variables) for a
    warehouse in a bucket, which become pyiceberg's FileIO properties and the table's `Store`."""
    from onceflow.config import Settings
    from onceflow.sinks import iceberg

    found = next(s for s in spec.sinks if s.name == sink)
    settings = Settings.from_env({**os.environ, "ONCEFLOW_HOME": str(home)})
    return iceberg.IcebergConfig.from_mapping(iceberg.SINK_KIND.config_for(found, settings))


def _iceberg_table(spec: Pipeline, sink: str, home: Path) -> Any:
    from onceflow.sinks import iceberg

    parsed = iceberg_config(spec, sink, home)
    return iceberg.tables.load(parsed.open_catalog(), parsed.table)


def iceberg_order_violations(spec: Pipeline, sink: str, home: Path) -> list[str]:
    """Within each data file of the Iceberg sink's current snapshot (one task's output), each source
    partition's rows must keep their offset order, as in the files sink's files. The files are read
    through the table's `Store` (a folder or the bucket), not through pyiceberg's scan."""
    import pyarrow.parquet as pq

    table = _iceberg_table(spec, sink, home)
    if table is None:
        return []
    store = iceberg_config(spec, sink, home).store(table.location())
    problems = []
    for task in table.scan().plan_files():
        path = task.file.file_path
        name = path.rsplit("/", 1)[1]
        rows = pq.read_table(store.path(path), columns=["_partition", "_offset"], filesystem=store.fs)
        problems += _inversions(
            ((int(row["_partition"]), int(row["_offset"])) for row in rows.to_pylist()),
            lambda partition, name=name: f"iceberg sink {sink}, {name}: source partition {partition}",
        )
    return problems


def iceberg_leftovers(spec: Pipeline, home: Path) -> list[str]:
    """Markers of staged attempts, and data files that no snapshot references, in Iceberg sinks (in a
    folder or in the bucket)."""
    from onceflow.sinks import iceberg

    problems = []
    for sink in (s for s in spec.sinks if s.kind == "iceberg"):
        table = _iceberg_table(spec, sink.name, home)
        if table is None:
            continue
        store = iceberg_config(spec, sink.name, home).store(table.location())
        markers = store.files_under(f"{table.location()}/{iceberg.files.MARKERS}")
        if markers:
            problems.append(f"iceberg sink {sink.name}: staged attempts left: {markers[:3]}")
        referenced = iceberg.referenced_files(table)
        data = store.files_under(iceberg.files.data_root(iceberg._data_path(table), spec.name, sink.name))
        unreferenced = [p for p in data if p not in referenced]
        if unreferenced:
            problems.append(f"iceberg sink {sink.name}: unreferenced data files left: {unreferenced[:3]}")
    return problems


def drop_iceberg_warehouses(spec: Pipeline, home: Path) -> None:
    """Delete every object of the Iceberg sinks' warehouses that are in a bucket (a warehouse in a folder
    stays with the scenario's folder, as its catalog does)."""
    from onceflow.storage.s3 import is_s3

    for sink in (s for s in spec.sinks if s.kind == "iceberg"):
        parsed = iceberg_config(spec, sink.name, home)
        warehouse = dict(parsed.catalog_properties).get("warehouse", "")
        if is_s3(warehouse):
            parsed.store(warehouse).delete_dir(warehouse)


def _delta_path(spec: Pipeline, sink: str) -> str:
    from onceflow.sinks.delta import DeltaConfig

    found = next(s for s in spec.sinks if s.name == sink)
    return DeltaConfig.from_mapping(found.config).path


def _delta_table(spec: Pipeline, sink: str) -> Any:
    """The Delta sink's table at its current version, or None before the first plan created it."""
    from deltalake import DeltaTable

    path = _delta_path(spec, sink)
    return DeltaTable(path) if DeltaTable.is_deltatable(path) else None


def delta_ids(spec: Pipeline, sink: str) -> list[int]:
    """The ids an engine reading the Delta sink's table sees (delta-rs at the table's current version)."""
    table = _delta_table(spec, sink)
    return [] if table is None else table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()


def delta_order_violations(spec: Pipeline, sink: str) -> list[str]:
    """Within each data file of the Delta sink's current version (one task's output), each source
    partition's rows must keep their offset order, as in the files sink's files."""
    import pyarrow.parquet as pq

    table = _delta_table(spec, sink)
    if table is None:
        return []
    problems = []
    for uri in table.file_uris():
        local = uri.removeprefix("file://")
        rows = pq.read_table(local, columns=["_partition", "_offset"]).to_pylist()
        problems += _inversions(
            ((int(row["_partition"]), int(row["_offset"])) for row in rows),
            lambda partition, name=Path(local).name: (
                f"delta sink {sink}, {name}: source partition {partition}"
            ),
        )
    return problems


def delta_repeated_epochs(spec: Pipeline, sink: str) -> list[str]:
    """Each epoch of the pipeline is in at most one version of the Delta sink's table (a second commit of
    an epoch is a duplicate, even when every reader drops a data file added twice), and the table's
    ``txn`` version for the pipeline's sink is the last epoch its commits name."""
    from onceflow.sinks.delta.committer import committed_epoch

    table = _delta_table(spec, sink)
    if table is None:
        return []
    versions: dict[int, list[int]] = {}
    for commit in table.history():
        if commit.get("onceflow.pipeline") == spec.name and commit.get("onceflow.sink") == sink:
            versions.setdefault(int(commit["onceflow.epoch"]), []).append(int(commit["version"]))
    problems = [
        f"delta sink {sink}: epoch {epoch} is in table versions {sorted(found)}"
        for epoch, found in sorted(versions.items())
        if len(found) > 1
    ]
    last, txn = max(versions, default=-1), committed_epoch(table, spec.name, sink)
    if txn != last:
        problems.append(f"delta sink {sink}: the txn version is {txn}, the last committed epoch {last}")
    return problems


def delta_leftovers(spec: Pipeline) -> list[str]:
    """In Delta sinks: markers of staged attempts, data files in onceflow's staging area of the table that
    the log does not reference, and an epoch committed twice (`delta_repeated_epochs`)."""
    from onceflow.sinks.delta import layout
    from onceflow.sinks.iceberg import files

    problems = []
    for sink in (s for s in spec.sinks if s.kind == "delta"):
        table = _delta_table(spec, sink.name)
        if table is None:
            continue
        path = _delta_path(spec, sink.name)
        store = layout.Store.for_location(path)
        markers = store.files_under(f"{layout.markers_location(path)}/{files.MARKERS}")
        if markers:
            problems.append(f"delta sink {sink.name}: staged attempts left: {markers[:3]}")
        referenced = {store.path(uri) for uri in table.file_uris()}
        data = store.files_under(files.data_root(path, spec.name, sink.name))
        unreferenced = [uri for uri in data if store.path(uri) not in referenced]
        if unreferenced:
            problems.append(f"delta sink {sink.name}: unreferenced data files left: {unreferenced[:3]}")
        problems += delta_repeated_epochs(spec, sink.name)
    return problems


# A files sink's commit log entry in a bucket: ``{table}/_onceflow_log/{epoch:020d}.json``.
_LOG_ENTRY = re.compile(r"[0-9]{20}\.json")


@dataclass
class BucketTable:
    """A files sink's table in the bucket as the checker reads it on its own, through pyarrow's S3 file
    system: the log entries' JSON, the Parquet objects they name, the objects under the table and the
    staging. None of the sink's code reads here, so a bug in its reader cannot hide one in its commit."""

    spec: Pipeline
    sink: str
    root: str  # bucket/prefix, without the scheme
    table: str
    s3: Any  # S3Settings

    @classmethod
    def of(cls, spec: Pipeline, sink: str) -> BucketTable:
        from onceflow.storage.s3 import S3Settings

        found = next(s for s in spec.sinks if s.name == sink)
        settings = S3Settings.from_env(os.environ)
        if settings is None:
            raise AssertionError(f"files sink {sink} writes to {found.config['root']}: no AWS_* settings")
        root = found.config["root"].removeprefix("s3://").rstrip("/")
        return cls(spec, sink, root, found.config["table"], settings)

    @cached_property
    def fs(self) -> Any:
        return self.s3.filesystem()

    @property
    def folder(self) -> str:
        return f"{self.root}/{self.table}"

    def objects(self, prefix: str) -> list[str]:
        """Every object under ``prefix`` (bucket/key), recursively, sorted."""
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
        return sorted(i.path for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File)

    def entries(self) -> list[tuple[str, dict[str, Any]]]:
        """The commit log: (object name, parsed entry) in name order, which is epoch order."""
        found = []
        for path in self.objects(f"{self.folder}/_onceflow_log"):
            name = path.rsplit("/", 1)[1]
            if _LOG_ENTRY.fullmatch(name):
                with self.fs.open_input_stream(path) as stream:
                    found.append((name, json.loads(stream.read())))
        return found

    def live(self) -> list[str]:
        """The data objects the log makes the table (every entry's adds minus later removes), as paths."""
        live: dict[str, None] = {}
        for _, entry in self.entries():
            for name in entry.get("removes", ()):
                live.pop(name, None)
            for name in entry["adds"]:
                live[name] = None
        return [f"{self.folder}/{name}" for name in live]

    def read(self, path: str, columns: list[str]) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=columns, filesystem=self.fs).to_pylist()

    def staged_bytes(self) -> int:
        """The bytes of the pipeline's markers under ``_staging/`` (none once no epoch is in flight)."""
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(
            f"{self.root}/_staging/{self.spec.name}", recursive=True, allow_not_found=True
        )
        return sum(i.size for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File)

    def ids(self) -> list[int]:
        return [int(row["id"]) for path in self.live() for row in self.read(path, ["id"])]

    def order_violations(self) -> list[str]:
        """Within each committed data object (one task's output), each source partition's rows must keep
        their offset order."""
        problems = []
        for path in self.live():
            rows = self.read(path, ["_partition", "_offset"])
            name = path.rsplit("/", 1)[1]
            problems += _inversions(
                ((int(row["_partition"]), int(row["_offset"])) for row in rows),
                lambda partition, name=name: (
                    f"files sink {self.sink} in the bucket, {name}: source partition {partition}"
                ),
            )
        return problems

    def leftovers(self) -> list[str]:
        """An epoch in two log entries, markers of staged attempts, and data objects under the table's
        ``epoch=N/`` prefixes that no log entry names."""
        problems = []
        entries = self.entries()
        epochs: dict[int, list[str]] = {}
        for name, entry in entries:
            epochs.setdefault(int(entry["epoch"]), []).append(name)
        problems += [
            f"files sink {self.sink}: epoch {epoch} is in log entries {names}"
            for epoch, names in sorted(epochs.items())
            if len(names) > 1
        ]
        markers = self.objects(f"{self.root}/_staging/{self.spec.name}")
        if markers:
            problems.append(f"files sink {self.sink}: staged markers left: {markers[:3]}")
        named = {f"{self.folder}/{name}" for _, entry in entries for name in entry["adds"]}
        unnamed = [
            path
            for path in self.objects(self.folder)
            if path.removeprefix(f"{self.folder}/").startswith("epoch=") and path not in named
        ]
        if unnamed:
            problems.append(f"files sink {self.sink}: data objects no log entry names: {unnamed[:3]}")
        return problems

    def delete(self) -> None:
        """Every object under the sink's root, by name (pyarrow's deletes would leave a folder object for
        each emptied prefix, and a whole-prefix delete trips over those)."""
        from onceflow.storage.s3 import delete_objects

        delete_objects(self.s3, [f"s3://{path}" for path in self.objects(self.root)])

    def reader_agrees(self, ids: list[int]) -> list[str]:
        """The sink's own reader (`read_committed_table`) must see the ids the log names, no more."""
        from onceflow.sinks.files import read_committed_table

        read = read_committed_table(f"s3://{self.root}", self.table, s3=self.s3)
        found = read.column("id").to_pylist() if read.num_columns else []
        if sorted(found) == sorted(ids):
            return []
        return [
            f"files sink {self.sink}: read_committed_table reads {len(found)} ids, the log names {len(ids)}"
        ]


def bucket_tables(spec: Pipeline) -> list[BucketTable]:
    """The pipeline's files sinks whose root is in a bucket."""
    return [
        BucketTable.of(spec, s.name)
        for s in spec.sinks
        if s.kind == "files" and str(s.config["root"]).startswith("s3://")
    ]


def staged_changes_left(spec: Pipeline, pg: Any) -> list[str]:
    """Rows of the pipeline's change sinks (`postgres_changes`) still staged: once every epoch is
    committed or aborted, each staged change was applied (and deleted with its epoch) or rolled back."""
    problems = []
    for sink in (s for s in spec.sinks if s.kind == "postgres_changes"):
        staging = sink.config.get("staging_table") or f"{sink.config['table']}_onceflow_changes"
        if pg.execute("SELECT to_regclass(%s)", [staging]).fetchone()[0] is None:
            continue
        left = pg.execute(
            f"SELECT _epoch, count(*) FROM {staging} WHERE _pipeline = %s GROUP BY _epoch", [spec.name]
        ).fetchall()
        if left:
            problems.append(f"changes sink {sink.name}: staged changes left (epoch, rows): {left}")
    return problems


def check_protocol_clean(spec: Pipeline, ledger: Ledger, pg: Any, root: Path) -> list[str]:
    """No epoch in flight, committed offsets contiguous, nothing prepared or staged, no epoch committed
    twice to a Delta table or a files sink's log in a bucket."""
    problems = []
    if (open_epoch := ledger.open_epoch(spec.name)) is not None:
        problems.append(f"{open_epoch} is still in flight after recovery")
    position: dict[tuple[str, int], int] = {}
    for epoch in ledger.epochs(spec.name):
        if epoch.status is not EpochStatus.COMMITTED:
            continue
        for r in epoch.ranges:
            key = (r.topic, r.partition)
            if key in position and r.from_offset != position[key]:
                problems.append(f"epoch {epoch.number} starts {r} at {r.from_offset}, not at {position[key]}")
            position[key] = r.until_offset
    prepared = pg.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", [f"onceflow:{spec.name}:%"]
    ).fetchall()
    if prepared:
        problems.append(f"prepared transactions left: {[g for (g,) in prepared]}")
    problems += staged_changes_left(spec, pg)
    staged = sorted(str(p.relative_to(root)) for p in root.glob("**/_staging/**/*") if p.is_file())
    if staged:
        problems.append(f"staging left: {staged[:5]}")
    problems += iceberg_leftovers(spec, root / "home")
    problems += delta_leftovers(spec)
    for table in bucket_tables(spec):
        problems += table.leftovers()
    return problems


def check_records(
    spec: Pipeline, ledger: Ledger, pg: Any, root: Path, workload: Any, bootstrap: str
) -> Verdict:
    """The records pipeline: each good record once in PostgreSQL, the files (in a folder and in the bucket),
    Iceberg, Delta and Kafka; the rest."""
    expected = set(workload.good)
    sinks = {s.name: s for s in spec.sinks}
    kafka_out = kafka_records(bootstrap, sinks["kafka"].config["topic"])
    files = read_committed_table(root / "files", "records")
    bucket = BucketTable.of(spec, "files_s3")
    observed = {
        "pg": pg_ids(pg, sinks["pg"].config["table"]),
        "files": files.column("id").to_pylist() if files.num_columns else [],
        "files_s3": bucket.ids(),
        "iceberg": iceberg_ids(spec, "iceberg", root / "home"),
        "delta": delta_ids(spec, "delta"),
        "kafka": [int(value["id"]) for _, value in kafka_out],
    }
    verdict = Verdict([tally(name, expected, ids) for name, ids in observed.items()])
    for t in verdict.tallies:
        if (t.lost, t.duplicates, t.unexpected) != (0, 0, 0):
            verdict.violations.append(
                f"sink {t.sink}: {t.lost} lost, {t.duplicates} duplicated, "
                f"{t.unexpected} that must not be there"
            )
    verdict.violations += order_violations(kafka_out)
    verdict.violations += files_order_violations(root / "files", "records")
    verdict.violations += bucket.order_violations()
    verdict.violations += bucket.reader_agrees(observed["files_s3"])
    verdict.violations += iceberg_order_violations(spec, "iceberg", root / "home")
    verdict.violations += delta_order_violations(spec, "delta")
    verdict.violations += check_protocol_clean(spec, ledger, pg, root)
    # The Kafka sink's consumer group stands where the ledger's committed position does.
    committed = ledger.committed_offsets(spec.name)
    group = KafkaCommitter(
        {**sinks["kafka"].config, "name": "kafka", "bootstrap": bootstrap}
    ).committed_offsets(spec.name, committed)
    behind = {tp: (group.get(tp), pos) for tp, pos in committed.items() if pos > 0 and group.get(tp) != pos}
    if behind:
        verdict.violations.append(f"Kafka sink group offsets differ from the ledger: {behind}")
    # Every bad record is a dead letter with its reason, at its own position, once.
    stored = [(d.letter.partition, d.letter.offset, d.letter.code) for d in ledger.dead_letters(spec.name)]
    letters = {(partition, offset): code for partition, offset, code in stored}
    if len(letters) != len(stored):
        verdict.violations.append(f"{len(stored) - len(letters)} dead letters are recorded twice")
    if letters != workload.bad:
        verdict.violations.append(
            f"dead letters {sorted(letters.items())} != bad input {sorted(workload.bad.items())}"
        )
    return verdict
