"""The fault tests' checkers fire on the real outputs: one clean epoch of the records pipeline passes
`invariants.check_records`, then a violation of each kind is planted where a bug would leave it (a row
twice or missing in PostgreSQL, a committed Parquet file with an aborted id and rows out of order, the
same in the bucket's files table with an epoch in two log entries, a staged marker and a data object no
entry names, a duplicate Iceberg row, a staged marker and an unreferenced data file in the Iceberg
table's warehouse in the bucket, the same in the Delta table and an epoch committed to it twice, a
committed Kafka record that must not be there and out of order, a consumer group off the ledger's
position, ranges that do not meet, a dead letter twice and one missing, an epoch in flight, a prepared
transaction, a staged file) and each must be reported, in its own words.
A record in an aborted transaction of the output topic must not count: the output is read with a plain
read_committed consumer.

The checkers that need no service are fired in tests/unit/test_fault_checkers.py.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.config import Settings
from onceflow.ledger import Ledger
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks import iceberg
from onceflow.sinks.files import CommitLogEntry, committed_files, log_entry_path
from onceflow.sinks.kafka import group_id
from tests.faults import harness, invariants
from tests.faults.kafka_output import read_committed
from tests.faults.workload import ABORTED_BASE

pytestmark = [pytest.mark.integration, pytest.mark.faults]

GOOD = 12


@pytest.fixture
def clean_run(
    settings: Settings, pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[harness.Scenario]:
    """The records pipeline after one epoch on the local executor, in this process: 12 good records, an
    aborted transaction and a bad record in, every sink holding the good ones once."""
    from onceflow.engine.runner import run_epoch

    scenario = harness.Scenario(harness.RECORDS, tmp_path, settings, env={"ONCEFLOW_FAULTS_SLICES": "1"})
    scenario.create_topics()
    try:
        scenario.workload.produce(settings.kafka_bootstrap, GOOD, aborted=2, bad=("wrong_type",))
        for key, value in scenario.env.items():
            monkeypatch.setenv(key, value)
        # The spec module names its topics and tables from the environment at import.
        monkeypatch.delitem(sys.modules, "tests.faults.pipelines", raising=False)
        run_epoch(harness.RECORDS, Settings.from_env(), executor="local")
        yield scenario
    finally:
        scenario.drop(pg)


def test_every_planted_violation_of_the_records_pipeline_is_reported(
    clean_run: harness.Scenario, settings: Settings, pg: Any
) -> None:
    scenario, spec = clean_run, clean_run.spec
    clean = scenario.verdict(pg)
    assert clean.violations == []
    assert {(t.sink, t.delivered, t.guarantee) for t in clean.tallies} == {
        (sink, GOOD, "exactly-once") for sink in harness.RECORDS_SINKS
    }

    gid = f"onceflow:{spec.name}:planted"
    expected = [
        *plant_in_postgres(scenario, pg),
        *plant_in_files(scenario),
        *plant_in_bucket(scenario),
        *plant_in_iceberg(scenario),
        *plant_in_delta(scenario),
        *plant_in_kafka(scenario, settings.kafka_bootstrap),
        *plant_in_ledger(scenario),
        f"prepared transactions left: [{gid!r}]",
    ]
    staged = scenario.root / "files" / "_staging" / "epoch=9" / "s0-t0" / "attempt-x" / "part-00000.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"PAR1")
    expected.append("staging left: ['files/_staging/epoch=9/s0-t0/attempt-x/part-00000.parquet']")
    prepared = psycopg.connect(settings.pg_dsn)
    try:
        prepared.tpc_begin(gid)
        prepared.execute("SELECT 1")
        prepared.tpc_prepare()
        violations = scenario.verdict(pg).violations
    finally:
        prepared.close()
        pg.execute(f"ROLLBACK PREPARED '{gid}'")
    unreported = [line for line in expected if not any(line in v for v in violations)]
    assert unreported == [], violations
    assert len(violations) == len(expected), violations


def plant_in_postgres(scenario: harness.Scenario, pg: Any) -> list[str]:
    """One good row twice, another gone."""
    table = scenario.spec.sinks[0].config["table"]
    first, second = sorted(invariants.pg_ids(pg, table))[:2]
    pg.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE id = %s", [first])
    pg.execute(f"DELETE FROM {table} WHERE id = %s", [second])
    return ["sink pg: 1 lost, 1 duplicated, 0 that must not be there"]


def plant_in_files(scenario: harness.Scenario) -> list[str]:
    """A committed file (its own commit log entry) with a good id again and an aborted one, whose source
    partition 1 goes from offset 5 back to 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table_dir = scenario.root / "files" / "records"
    schema = pq.read_schema(committed_files(table_dir)[0])
    rows = [
        {"id": 0, "payload": "p0", "_partition": 1, "_offset": 5},
        {"id": ABORTED_BASE + 77, "payload": "x", "_partition": 1, "_offset": 2},
    ]
    path = table_dir / "epoch=99" / "planted.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    entry = CommitLogEntry(99, scenario.spec.name, "files", ("epoch=99/planted.parquet",), record_count=2)
    log_entry_path(table_dir, 99).write_text(entry.to_json())
    return [
        "sink files: 0 lost, 1 duplicated, 1 that must not be there",
        "files table records, planted.parquet: source partition 1 offset 2 after 5",
    ]


def plant_in_bucket(scenario: harness.Scenario) -> list[str]:
    """In the files table in the bucket, written through S3: a data object with a good id again and an
    aborted one, its source partition 1 going from offset 5 back to 2, committed by a log entry of its
    own; a second log entry of the committed epoch; a staged attempt's marker; a data object in an
    epoch's prefix that no log entry names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bucket = invariants.BucketTable.of(scenario.spec, "files_s3")
    ((logged, entry),) = bucket.entries()
    epoch = int(entry["epoch"])
    with bucket.fs.open_input_file(bucket.live()[0]) as committed:
        schema = pq.ParquetFile(committed).schema_arrow
    rows = [
        {"id": 0, "payload": "p0", "_partition": 1, "_offset": 5},
        {"id": ABORTED_BASE + 79, "payload": "x", "_partition": 1, "_offset": 2},
    ]
    with bucket.fs.open_output_stream(f"{bucket.folder}/epoch=99/planted.parquet") as out:
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), out)
    planted = CommitLogEntry(
        99, scenario.spec.name, "files_s3", ("epoch=99/planted.parquet",), record_count=2
    )
    again = CommitLogEntry(epoch, scenario.spec.name, "files_s3", ())
    ours = f"{scenario.spec.name}/files_s3"  # an attempt's marker and its data object, as the sink names them
    for path, data in (
        (f"{bucket.folder}/_onceflow_log/{99:020d}.json", planted.to_json().encode()),
        (f"{bucket.folder}/_onceflow_log/{98:020d}.json", again.to_json().encode()),
        (f"{bucket.root}/_staging/{ours}/epoch=9/s0-t0/attempt-x.json", b"{}"),
        (f"{bucket.folder}/epoch=9/{ours}/s0-t0-x.parquet", b"PAR1"),
    ):
        with bucket.fs.open_output_stream(path) as out:
            out.write(data)
    return [
        "sink files_s3: 0 lost, 1 duplicated, 1 that must not be there",
        "files sink files_s3 in the bucket, planted.parquet: source partition 1 offset 2 after 5",
        f"files sink files_s3: epoch {epoch} is in log entries [{logged!r}, '{98:020d}.json']",
        "files sink files_s3: staged markers left",
        "files sink files_s3: data objects no log entry names",
    ]


def plant_in_iceberg(scenario: harness.Scenario) -> list[str]:
    """In the Iceberg table, whose warehouse is in the bucket: two rows of one source partition appended
    again, in a data file of their own, the later offset first; a staged attempt's marker and a data
    file no snapshot references, both written through S3."""
    import pyarrow as pa

    spec, home = scenario.spec, scenario.root / "home"
    table = invariants._iceberg_table(spec, "iceberg", home)
    location = table.location()
    assert location.startswith(f"s3://{invariants.BucketTable.of(spec, 'files_s3').root}/warehouse/")
    rows = table.scan().to_arrow()
    first = rows.slice(0, 1).to_pylist()[0]
    same = sorted(
        (r for r in rows.to_pylist() if r["_partition"] == first["_partition"]), key=lambda r: r["_offset"]
    )
    early, late = same[0], same[1]
    table.append(pa.Table.from_pylist([late, early], schema=rows.schema))
    store = invariants.iceberg_config(spec, "iceberg", home).store(location)
    store.write(f"{location}/{iceberg.files.MARKERS}/{spec.name}/iceberg/planted", b"{}")
    root = iceberg.files.data_root(iceberg._data_path(table), spec.name, "iceberg")
    store.write(f"{root}/planted.parquet", b"PAR1")
    return [
        "sink iceberg: 0 lost, 2 duplicated, 0 that must not be there",
        f"source partition {early['_partition']} offset {early['_offset']} after {late['_offset']}",
        "iceberg sink iceberg: staged attempts left",
        "iceberg sink iceberg: unreferenced data files left",
    ]


def plant_in_delta(scenario: harness.Scenario) -> list[str]:
    """In the Delta table: two rows of one source partition appended again by another writer, in a data
    file of their own, the later offset first; a data file of the committed epoch added again by a
    second commit that names the epoch (every reader keeps one copy of a file the log adds twice, but the
    epoch is in two versions); a staged attempt's marker and a staged data file the log does not name."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    from onceflow.sinks.delta import layout

    spec = scenario.spec
    path = invariants._delta_path(spec, "delta")
    table = DeltaTable(path)
    (committed,) = [c for c in table.history() if "onceflow.epoch" in c]
    epoch, ours = int(committed["onceflow.epoch"]), set(table.file_uris())
    rows = table.to_pyarrow_table()
    first = rows.slice(0, 1).to_pylist()[0]
    same = sorted(
        (r for r in rows.to_pylist() if r["_partition"] == first["_partition"]), key=lambda r: r["_offset"]
    )
    early, late = same[0], same[1]
    write_deltalake(path, pa.Table.from_pylist([late, early], schema=rows.schema), mode="append")
    (appended,) = set(DeltaTable(path).file_uris()) - ours

    local = Path(sorted(ours)[0].removeprefix("file://"))
    again = layout.add_action(
        {
            "path": str(local.relative_to(path)),
            "size": local.stat().st_size,
            "partition": {},
            "rows": pq.read_metadata(local).num_rows,
            "mtime_ms": int(local.stat().st_mtime * 1000),
        }
    )
    repeated = {"onceflow.pipeline": spec.name, "onceflow.sink": "delta", "onceflow.epoch": epoch}
    table = DeltaTable(path)
    table.create_write_transaction(
        [again], "append", table.schema(), commit_properties=CommitProperties(custom_metadata=repeated)
    )

    marker = Path(layout.markers_location(path)) / iceberg.files.MARKERS / spec.name / "delta" / "planted"
    marker.parent.mkdir(parents=True, exist_ok=True)  # the committed epoch's folders stay, empty
    marker.write_text("{}")
    staged = Path(iceberg.files.data_root(path, spec.name, "delta")) / "epoch=9" / "s0-t0" / "attempt-x"
    staged.mkdir(parents=True)
    (staged / "part-00000.parquet").write_bytes(b"PAR1")
    return [
        "sink delta: 0 lost, 2 duplicated, 0 that must not be there",
        f"delta sink delta, {Path(appended).name}: source partition {early['_partition']} offset "
        f"{early['_offset']} after {late['_offset']}",
        f"delta sink delta: epoch {epoch} is in table versions [{committed['version']}, "
        f"{committed['version'] + 2}]",
        "delta sink delta: staged attempts left",
        "delta sink delta: unreferenced data files left",
    ]


def plant_in_kafka(scenario: harness.Scenario, bootstrap: str) -> list[str]:
    """In the output topic: a committed record of an aborted id, at source partition 0's offset 0 after
    its later ones, and a good record again in an aborted transaction (which no reader may count). The
    Kafka sink's consumer group moved off the ledger's position."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = next(s for s in scenario.spec.sinks if s.name == "kafka").config["topic"]
    out = [r for r in read_committed(bootstrap, topic) if json.loads(r.value or b"{}")["_partition"] == 0]
    partition, last = out[-1].partition, json.loads(out[-1].value or b"{}")["_offset"]
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"planted-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    for commit, record_id in ((True, ABORTED_BASE + 78), (False, 1)):
        producer.begin_transaction()
        value = {"id": record_id, "payload": "x", "_partition": 0, "_offset": 0}
        producer.produce(topic, json.dumps(value).encode(), partition=partition)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id(scenario.spec.name)})
    try:
        consumer.commit(offsets=[TopicPartition(scenario.workload.topic, 1, 1)], asynchronous=False)
    finally:
        consumer.close()
    return [
        "sink kafka: 0 lost, 0 duplicated, 1 that must not be there",
        f"kafka output partition {partition}: source partition 0 offset 0 after {last}",
        "Kafka sink group offsets differ from the ledger",
    ]


def plant_in_ledger(scenario: harness.Scenario) -> list[str]:
    """A second committed epoch whose range starts two offsets before the first one's end; the first
    epoch's dead letter recorded in it again; a bad record with no dead letter; an epoch left in flight."""
    spec, topic = scenario.spec, scenario.workload.topic
    url = scenario.env["ONCEFLOW_LEDGER_URL"]
    with Ledger.connect(url) as ledger:
        position = ledger.committed_offsets(spec.name)
        end = position[(topic, 0)]
        second = ledger.plan_epoch(spec.name, [OffsetRange(topic, 0, end, end)], [])
        ledger.record_commit_decision(spec.name, second.number)
        ledger.complete_commit(spec.name, second.number)
        in_flight = ledger.plan_epoch(
            spec.name, [OffsetRange(topic, 2, position[(topic, 2)], 99)], [("pg", "x")]
        )
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        db.execute(
            "UPDATE epoch_offsets SET from_offset = from_offset - 2 WHERE pipeline = ? AND epoch = ?",
            (spec.name, second.number),
        )
        db.execute(
            'INSERT INTO dead_letters (pipeline, epoch, topic, "partition", "offset", key, reason, value, '
            'key_size, value_size, created_at) SELECT pipeline, ?, topic, "partition", "offset", key, '
            "reason, value, key_size, value_size, created_at FROM dead_letters WHERE pipeline = ?",
            (second.number, spec.name),
        )
    scenario.workload.bad[(2, 10_000)] = "malformed_json"
    return [
        f"epoch {second.number} starts {topic}[0]@[{end - 2},{end}) at {end - 2}, not at {end}",
        "1 dead letters are recorded twice",
        "!= bad input",
        f"{in_flight} is still in flight after recovery",
    ]


def test_staged_changes_left_in_a_changes_sink_are_reported(settings: Settings, pg: Any) -> None:
    table = f"planted_{uuid.uuid4().hex[:8]}"
    sink = SinkSpec(
        "mirror", "postgres_changes", {"table": table, "columns": {"id": "bigint"}, "key_columns": ["id"]}
    )
    spec = Pipeline(f"planted-{table}", KafkaSource(("in",)), JsonFormat({"id": "int"}), (sink,))
    staging = f"{table}_onceflow_changes"
    assert invariants.staged_changes_left(spec, pg) == []  # no staging table yet
    pg.execute(f"CREATE TABLE {staging} (_pipeline text, _epoch bigint, id bigint)")
    try:
        pg.execute(f"INSERT INTO {staging} VALUES ('another pipeline', 3, 1)")
        assert invariants.staged_changes_left(spec, pg) == []  # another pipeline's rows are its own
        pg.execute(f"INSERT INTO {staging} VALUES (%s, 3, 1), (%s, 3, 2)", [spec.name, spec.name])
        assert invariants.staged_changes_left(spec, pg) == [
            "changes sink mirror: staged changes left (epoch, rows): [(3, 2)]"
        ]
    finally:
        pg.execute(f"DROP TABLE IF EXISTS {staging}")
