"""The invariants every scenario must leave standing, checked from the real outputs.

Outputs are read the way a downstream user reads them: PostgreSQL tables with plain SELECTs (only
committed rows are visible), Parquet tables through their commit log, the Kafka output topic with a
read_committed consumer. Protocol leftovers are looked for where they would hide: prepared
transactions, staging folders, an epoch in flight.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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


def _iceberg_table(spec: Pipeline, sink: str, home: Path) -> Any:
    from onceflow.config import Settings
    from onceflow.sinks import iceberg

    found = next(s for s in spec.sinks if s.name == sink)
    config = iceberg.SINK_KIND.config_for(found, Settings.from_env({"ONCEFLOW_HOME": str(home)}))
    parsed = iceberg.IcebergConfig.from_mapping(config)
    return iceberg.tables.load(parsed.open_catalog(), parsed.table)


def iceberg_order_violations(spec: Pipeline, sink: str, home: Path) -> list[str]:
    """Within each data file of the Iceberg sink's current snapshot (one task's output), each source
    partition's rows must keep their offset order, as in the files sink's files."""
    import pyarrow.parquet as pq

    table = _iceberg_table(spec, sink, home)
    if table is None:
        return []
    problems = []
    for task in table.scan().plan_files():
        path = task.file.file_path
        local = path.removeprefix("file://")
        rows = pq.read_table(local, columns=["_partition", "_offset"]).to_pylist()
        problems += _inversions(
            ((int(row["_partition"]), int(row["_offset"])) for row in rows),
            lambda partition, name=Path(local).name: (
                f"iceberg sink {sink}, {name}: source partition {partition}"
            ),
        )
    return problems


def iceberg_leftovers(spec: Pipeline, home: Path) -> list[str]:
    """Markers of staged attempts, and data files that no snapshot references, in Iceberg sinks."""
    from onceflow.sinks import iceberg

    problems = []
    for sink in (s for s in spec.sinks if s.kind == "iceberg"):
        table = _iceberg_table(spec, sink.name, home)
        if table is None:
            continue
        store = iceberg.files.Store.for_location(table.location())
        markers = store.files_under(f"{table.location()}/{iceberg.files.MARKERS}")
        if markers:
            problems.append(f"iceberg sink {sink.name}: staged attempts left: {markers[:3]}")
        referenced = iceberg.referenced_files(table)
        data = store.files_under(iceberg.files.data_root(iceberg._data_path(table), spec.name, sink.name))
        unreferenced = [p for p in data if p not in referenced]
        if unreferenced:
            problems.append(f"iceberg sink {sink.name}: unreferenced data files left: {unreferenced[:3]}")
    return problems


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
    """No epoch in flight, committed offsets contiguous, nothing prepared or staged."""
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
    return problems


def check_records(
    spec: Pipeline, ledger: Ledger, pg: Any, root: Path, workload: Any, bootstrap: str
) -> Verdict:
    """The records pipeline: each good record once in PostgreSQL, the files, Iceberg and Kafka; the rest."""
    expected = set(workload.good)
    sinks = {s.name: s for s in spec.sinks}
    kafka_out = kafka_records(bootstrap, sinks["kafka"].config["topic"])
    files = read_committed_table(root / "files", "records")
    observed = {
        "pg": pg_ids(pg, sinks["pg"].config["table"]),
        "files": files.column("id").to_pylist() if files.num_columns else [],
        "iceberg": iceberg_ids(spec, "iceberg", root / "home"),
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
    verdict.violations += iceberg_order_violations(spec, "iceberg", root / "home")
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
