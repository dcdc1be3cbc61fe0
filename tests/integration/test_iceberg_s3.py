"""The Iceberg sinks with their warehouse in a bucket of the stack's S3 server and their SQL catalog in
PostgreSQL: one snapshot per epoch, recognised when repeated; abort and the sweeper leave no staged
object; and a pipeline on the warm Spark runtime writing such a table.

Each table is read back by two readers that share nothing with the sink's code: pyiceberg's own scan
through a catalog loaded here from the same properties, and pyarrow reading each snapshot's data files
from the bucket (an `S3FileSystem` made here from the AWS variables). Objects are listed through boto3,
so what a test says is left in the bucket is what the S3 server holds.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow.parquet as pq
import pytest

from onceflow import redact
from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.sinks import iceberg
from onceflow.sinks.errors import AlreadyCommitted
from onceflow.sinks.iceberg import IcebergCommitter, IcebergConfig, IcebergWriter
from onceflow.sinks.iceberg.changes import IcebergChangesCommitter, IcebergChangesWriter
from onceflow.storage.s3 import S3Settings
from tests.integration.pipeline_helpers import epochs_that_read, produce_views, views_pipeline
from tests.integration.s3_helpers import BUCKET, bucket_fs, objects
from tests.integration.sink_helpers import order_rows, orders_config, stage_tasks, sweep_dead_attempt

pytestmark = pytest.mark.integration

PIPELINE: Pipeline | None = None  # set by the pipeline test; `run_until` loads it as this module's attribute


def catalog_properties(pg_dsn: str, warehouse: str) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": pg_dsn.replace("postgresql://", "postgresql+psycopg://"),
        "warehouse": warehouse,
    }


@pytest.fixture
def config(pg_database: str, bucket_prefix: str, s3: S3Settings) -> dict[str, Any]:
    return orders_config(
        table="lake.events",
        catalog="onceflow",
        catalog_properties=catalog_properties(pg_database, f"{bucket_prefix}/warehouse"),
        s3=s3.to_config(),
    )


@pytest.fixture
def pipeline() -> str:
    return f"ice-s3-{uuid.uuid4().hex[:10]}"


def _stage(config: dict[str, Any], pipeline: str, epoch: int, tasks: list[list[dict[str, Any]]]) -> list[Any]:
    """Each task's writer begun and pre-committed; odd tasks stage Arrow batches (a Spark task's path),
    the first task one file per two rows."""
    return stage_tasks(
        lambda n: IcebergWriter({**config, "rows_per_file": 2} if n == 0 else config), pipeline, epoch, tasks
    )


def fresh_table(config: dict[str, Any], s3: S3Settings) -> Any:
    """The table through a catalog loaded here, from the sink's catalog properties and the bucket's
    FileIO properties (none of the sink's code, nor its per-process catalog cache)."""
    from pyiceberg.catalog import load_catalog

    properties = {**config["catalog_properties"], **s3.iceberg_properties()}
    catalog = load_catalog(config.get("catalog", "onceflow"), **properties)
    return catalog.load_table(tuple(config["table"].split(".")))


def by_pyiceberg(table: Any, snapshot_id: int | None = None) -> list[tuple[int, str, int]]:
    scanned = table.scan(snapshot_id=snapshot_id).to_arrow()
    return sorted((r["id"], r["region"], r["qty"]) for r in scanned.to_pylist())


def by_pyarrow(table: Any, snapshot_id: int) -> list[tuple[int, str, int]]:
    """The snapshot's rows from its data files, each read from the bucket with pyarrow; an identity
    partition's column is in the files as Iceberg writes them."""
    fs = bucket_fs()
    paths = [task.file.file_path for task in table.scan(snapshot_id=snapshot_id).plan_files()]
    assert all(p.startswith(f"s3://{BUCKET}/") for p in paths), paths
    rows: list[tuple[int, str, int]] = []
    for path in paths:
        data = pq.read_table(path.removeprefix("s3://"), filesystem=fs)
        rows += [(r["id"], r["region"], r["qty"]) for r in data.to_pylist()]
    return sorted(rows)


def _both(table: Any, snapshot_id: int) -> list[int]:
    ours, theirs = by_pyiceberg(table, snapshot_id), by_pyarrow(table, snapshot_id)
    assert ours == theirs
    return [r[0] for r in ours]


def test_epochs_commit_once_in_one_snapshot_each_in_a_bucket(
    config: dict[str, Any], pipeline: str, bucket_prefix: str, s3: S3Settings
) -> None:
    committer = IcebergCommitter(config)
    staged = _stage(config, pipeline, 1, [order_rows(5), order_rows(4, 5)])
    assert len(staged[0].handle["files"]) >= 3  # two rows a file, one region a file
    assert all(f["path"].startswith(f"{bucket_prefix}/warehouse/") for c in staged for f in c.handle["files"])
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1"}
    assert fresh_table(config, s3).current_snapshot() is None  # staged objects are in no snapshot

    committer.commit(staged)
    table = fresh_table(config, s3)
    assert len(table.snapshots()) == 1
    first = table.snapshots()[0]
    assert first.summary is not None and first.summary[iceberg.SUMMARY_EPOCH] == "1"
    assert _both(table, first.snapshot_id) == list(range(9))
    assert committer.orphans(pipeline) == []  # markers gone once the files are in a snapshot

    committer.commit(staged)  # repeated (recovery after a crash before the ledger): nothing added
    IcebergCommitter(config).commit(staged)  # another committer, its own catalog: nothing either
    assert len(fresh_table(config, s3).snapshots()) == 1

    second_epoch = _stage(config, pipeline, 2, [order_rows(3, 100), order_rows(2, 200)])
    committer.commit(second_epoch)
    committer.commit(second_epoch)
    table = fresh_table(config, s3)
    snapshots = table.snapshots()
    assert [s.summary[iceberg.SUMMARY_EPOCH] for s in snapshots if s.summary] == ["1", "2"]
    assert _both(table, snapshots[0].snapshot_id) == list(range(9))  # each snapshot, the table as of it
    assert _both(table, snapshots[1].snapshot_id) == [*range(9), 100, 101, 102, 200, 201]
    assert table.properties[iceberg.committed_property(pipeline, "lake")] == "2"
    # The table's metadata and data are objects of the bucket, under the warehouse.
    keys = objects(s3, f"{bucket_prefix}/warehouse")
    assert any(k.endswith(".metadata.json") for k in keys) and any(k.endswith(".parquet") for k in keys)
    assert [k for k in keys if f"/{iceberg.files.MARKERS}/" in k] == []


def test_abort_and_the_sweeper_leave_no_staged_object(
    config: dict[str, Any], pipeline: str, bucket_prefix: str, s3: S3Settings
) -> None:
    committer = IcebergCommitter(config)
    first = _stage(config, pipeline, 1, [order_rows(3)])
    committer.commit(first)
    staged = _stage(config, pipeline, 2, [order_rows(3, 10), order_rows(3, 20)])
    table = fresh_table(config, s3)
    epoch_dir = iceberg.files.epoch_data_dir(iceberg._data_path(table), pipeline, "lake", 2)
    assert len(objects(s3, epoch_dir)) >= 2
    committer.abort(staged)
    committer.abort(staged)  # idempotent
    assert objects(s3, epoch_dir) == [] and committer.orphans(pipeline) == []
    assert by_pyiceberg(fresh_table(config, s3)) == [(0, "us", 0), (1, "eu", 10), (2, "eu", 20)]

    # A dead attempt (its marker written, a data file written, never pre-committed) is what the sweeper
    # finds; its abort takes every object of it.
    dead_dir = iceberg.files.epoch_data_dir(iceberg._data_path(table), pipeline, "lake", 3)
    writer = IcebergWriter({**config, "rows_per_file": 1})
    sweep_dead_attempt(committer, writer, pipeline, lambda: objects(s3, dead_dir))
    assert objects(s3, f"{table.location()}/{iceberg.files.MARKERS}") == []

    # A committed epoch's files are never deleted.
    with pytest.raises(AlreadyCommitted):
        committer.abort(first)
    table = fresh_table(config, s3)
    assert _both(table, table.snapshots()[-1].snapshot_id) == [0, 1, 2]


def test_the_bucket_settings_never_show_in_config_or_errors(config: dict[str, Any], s3: S3Settings) -> None:
    parsed = IcebergConfig.from_mapping(config)
    properties = parsed.catalog_properties_with_s3()
    assert properties["warehouse"].startswith("s3://")
    assert properties["s3.endpoint"] == s3.endpoint_url and properties["s3.region"] == s3.region
    assert s3.secret_access_key is not None and s3.access_key_id is not None
    for shown in (repr(parsed), redact.text(properties), redact.text(json.dumps(properties))):
        assert s3.secret_access_key not in shown and s3.access_key_id not in shown
    # A catalog that cannot be opened is named in one line, without them.
    unreachable = "postgresql+psycopg://onceflow:onceflow@127.0.0.1:1/none"
    broken = {**config, "catalog_properties": {**config["catalog_properties"], "uri": unreachable}}
    with pytest.raises(ConfigError, match="cannot open the Iceberg catalog") as failure:
        IcebergConfig.from_mapping(broken).open_catalog()
    message = str(failure.value)
    assert "\n" not in message
    assert s3.secret_access_key not in message and s3.access_key_id not in message


def test_changes_apply_in_one_snapshot_per_epoch_in_a_bucket(
    config: dict[str, Any], pipeline: str, bucket_prefix: str, s3: S3Settings
) -> None:
    changes = {**config, "columns": {"id": "long", "name": "string"}, "key_columns": ["id"]}
    changes.pop("partition_by")

    def stage(epoch: int, tasks: list[list[dict[str, Any]]]) -> list[Any]:
        return stage_tasks(lambda _: IcebergChangesWriter(changes), pipeline, epoch, tasks)

    def op(kind: str, offset: int, id_: int, name: str | None = None) -> dict[str, Any]:
        return {"id": id_, "name": name, "_op": kind, "_partition": 0, "_offset": offset}

    committer = IcebergChangesCommitter(changes)
    first = stage(1, [[op("c", 0, 1, "a"), op("c", 1, 2, "b")], [op("c", 2, 3, "c"), op("u", 3, 1, "a2")]])
    committer.commit(first)
    second = stage(2, [[op("d", 4, 2), op("u", 5, 3, "c2")], [op("c", 6, 4, "d")]])
    committer.commit(second)
    committer.commit(second)  # repeated: nothing applied twice
    table = fresh_table(changes, s3)
    assert [s.summary[iceberg.SUMMARY_EPOCH] for s in table.snapshots() if s.summary] == ["1", "2"]
    rows = sorted((r["id"], r["name"]) for r in table.scan().to_arrow().to_pylist())
    assert rows == [(1, "a2"), (3, "c2"), (4, "d")]
    assert committer.orphans(pipeline) == []
    staged_dirs = [
        iceberg.files.epoch_data_dir(iceberg._data_path(table), pipeline, "lake", n) for n in (1, 2)
    ]
    assert [k for d in staged_dirs for k in objects(s3, d) if "/s0-t" in k] == []  # staged changes gone


def test_a_pipeline_on_the_spark_runtime_writes_its_table_into_the_bucket(
    settings: Settings,
    s3: S3Settings,
    make_topic: Any,
    pg_database: str,
    bucket_prefix: str,
    run_settings: Settings,
) -> None:
    from onceflow.engine.runner import run_until

    global PIPELINE
    topic = make_topic("ice-s3", partitions=2)
    name = f"ice_s3_{uuid.uuid4().hex[:8]}"
    sink_config = {
        "table": "web.views",
        "catalog_properties": catalog_properties(pg_database, f"{bucket_prefix}/warehouse"),
        "columns": {"id": "long", "page": "string", "_partition": "int"},
    }
    PIPELINE = views_pipeline(name, topic, SinkSpec("lake", "iceberg", sink_config))
    assert run_settings.s3 is not None  # the AWS variables: what the sink's config gets under `s3`
    produce_views(settings.kafka_bootstrap, topic, range(120))

    run_until(f"{__name__}:PIPELINE", run_settings, until_caught_up=True, executor="connect")

    table = fresh_table({**sink_config, "name": "lake"}, s3)
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(120))
    committed = [e.number for e in epochs_that_read(run_settings, name)]
    assert len(committed) >= 2
    snapshots = table.snapshots()
    assert [int(s.summary[iceberg.SUMMARY_EPOCH]) for s in snapshots if s.summary] == committed
    rows = sorted(r[0] for r in by_pyarrow_ids(table, snapshots[-1].snapshot_id))
    assert rows == list(range(120))
    # Nothing staged is left: no marker, and every data object of the pipeline is in a snapshot.
    data = objects(s3, iceberg.files.data_root(iceberg._data_path(table), name, "lake"))
    referenced = {p.removeprefix(f"s3://{BUCKET}/") for p in iceberg.referenced_files(table)}
    assert data and set(data) == referenced
    assert objects(s3, f"{table.location()}/{iceberg.files.MARKERS}") == []


def by_pyarrow_ids(table: Any, snapshot_id: int) -> list[tuple[int]]:
    fs = bucket_fs()
    rows: list[tuple[int]] = []
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        data = pq.read_table(task.file.file_path.removeprefix("s3://"), filesystem=fs, columns=["id"])
        rows += [(i,) for i in data.column("id").to_pylist()]
    return rows
