"""The delta sink on a real Delta table in a local folder (delta-rs writes the log): every task of an
epoch staged, one commit and one table version per epoch, recognised when repeated; abort and the
sweeper leave no staged file; another writer's appends kept. Each table is read by delta-rs and by a
second reader of this file that replays the log's JSON actions itself and reads the Parquet files
with pyarrow (delta-spark is not available offline), so a fault of one reader cannot hide the other's."""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from onceflow.errors import ConfigError
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.delta import SINK_KIND, DeltaCommitter, DeltaWriter, layout
from onceflow.sinks.errors import AlreadyCommitted, RetryLater, RowError, StagedOutputLost
from tests.integration.delta_helpers import live_files, local_log_actions
from tests.integration.sink_helpers import order_rows, orders_config, stage_tasks

pytestmark = pytest.mark.integration


@pytest.fixture
def pipeline() -> str:
    return f"dl-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    return orders_config(path=str(tmp_path / "lake" / "orders"))


def _stage(
    config: dict[str, Any], pipeline: str, epoch: int, tasks: list[list[dict[str, Any]]]
) -> list[Committable]:
    """Each task's writer begun and pre-committed; odd tasks stage Arrow batches, the first one file
    per two rows."""
    return stage_tasks(
        lambda n: DeltaWriter({**config, "rows_per_file": 2} if n == 0 else config),
        pipeline,
        epoch,
        tasks,
        row_by_row=True,
    )


def _ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def by_delta_rs(path: str, version: int | None = None) -> pa.Table:
    return DeltaTable(path, version=version).to_pyarrow_table()


def by_log_replay(path: str, version: int | None = None) -> pa.Table:
    """The table at ``version`` from the log's JSON commits read here (add and remove actions, partition
    values), each live file read with pyarrow: no delta-rs code on the way."""
    names, live = live_files(local_log_actions(path, version))
    parts = []
    for add in live:
        data = pq.read_table(Path(path) / add["path"])
        for column, value in add["partitionValues"].items():
            data = data.append_column(column, pa.array([value] * data.num_rows, pa.string()))
        parts.append(data.select(names))
    return pa.concat_tables(parts) if parts else pa.table({n: [] for n in names})


def _both(path: str, version: int | None = None) -> list[int]:
    """The table's ids, the same through both readers (asserted)."""
    ours, theirs = by_delta_rs(path, version), by_log_replay(path, version)
    as_rows = {(r["id"], r["region"], r["qty"]) for r in theirs.to_pylist()}
    assert {(r["id"], r["region"], r["qty"]) for r in ours.to_pylist()} == as_rows
    assert ours.num_rows == theirs.num_rows
    return _ids(ours)


def test_epochs_commit_once_in_one_version_each(config: dict[str, Any], pipeline: str) -> None:
    path = config["path"]
    committer = DeltaCommitter(config)
    staged = _stage(config, pipeline, 1, [order_rows(5), order_rows(4, 5), order_rows(3, 9)])
    assert len(staged[0].handle["files"]) >= 3  # at most two rows a file, one region a file
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1", "s0-t2"}
    created = DeltaTable(path).version()  # the writers created the table, empty
    assert _both(path) == []  # staged files are in no version: no reader sees them
    committer.commit(staged)
    table = DeltaTable(path)
    assert table.version() == created + 1
    assert table.transaction_version(f"{pipeline}:lake") == 1
    assert table.metadata().partition_columns == ["region"]
    assert table.history(1)[0]["onceflow.epoch"] == 1
    assert _both(path) == list(range(12))
    assert committer.orphans(pipeline) == []  # markers gone once the files are in the log

    committer.commit(staged)  # repeated (recovery after a crash before the ledger): nothing added
    assert DeltaTable(path).version() == created + 1 and _both(path) == list(range(12))

    # A config that does not name the partitioning still writes the table's: one region a file.
    unnamed = {k: v for k, v in config.items() if k != "partition_by"}
    committer.commit(_stage(unnamed, pipeline, 2, [order_rows(3, 99), []]))
    adds = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    assert {a["partition.region"] for a in adds if "/epoch=2/" in a["path"]} == {"eu", "us"}
    committer.commit(_stage(config, pipeline, 3, [order_rows(1, 200)]))
    assert DeltaTable(path).version() == created + 3
    # Time travel to an epoch's version gives that epoch's table, through both readers.
    assert _both(path, created + 1) == list(range(12))
    assert _both(path, created + 2) == [*range(12), 99, 100, 101]
    assert _both(path) == [*range(12), 99, 100, 101, 200]
    assert DeltaTable(path).transaction_version(f"{pipeline}:lake") == 3

    # A recovered commit of an older epoch finds it covered by the app's transaction version.
    committer.commit(staged)
    assert DeltaTable(path).version() == created + 3


def test_a_foreign_append_between_stage_and_commit_is_kept(config: dict[str, Any], pipeline: str) -> None:
    path = config["path"]
    committer = DeltaCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [order_rows(3)]))
    staged = _stage(config, pipeline, 2, [order_rows(3, 10), order_rows(2, 20)])
    stale = DeltaCommitter(config)
    other = pa.table(
        {"id": pa.array([900, 901], pa.int64()), "region": ["eu", "us"], "qty": pa.array([1, 2], pa.int64())}
    )
    write_deltalake(path, other, mode="append")  # another application appends meanwhile
    committer.commit(staged)
    want = [0, 1, 2, 10, 11, 12, 20, 21, 900, 901]
    assert _both(path) == want
    version = DeltaTable(path).version()
    stale.commit(staged)  # a second committer of the same epoch: recognised, nothing twice
    write_deltalake(path, other.slice(0, 1).set_column(0, "id", pa.array([902], pa.int64())), mode="append")
    committer.commit(staged)
    assert DeltaTable(path).version() == version + 1  # only the foreign append made a version
    assert _both(path) == [*want, 902]


def test_a_conflict_that_cannot_be_resolved_is_one_line(config: dict[str, Any], pipeline: str) -> None:
    """Another writer changes the table's schema after the committer read it: every try conflicts, and
    the failure says so in one line, with nothing of the epoch in the table."""
    path = config["path"]
    committer = DeltaCommitter({**config, "commit_retries": 1})
    staged = _stage(config, pipeline, 1, [order_rows(2)])
    stale = DeltaTable(path)
    version = stale.version()
    grown = pa.table(
        {"id": pa.array([7], pa.int64()), "region": ["eu"], "qty": pa.array([1], pa.int64()), "note": ["x"]}
    )
    write_deltalake(path, grown, mode="append", schema_mode="merge")
    committer._load = lambda: stale  # type: ignore[method-assign]  # it keeps reading the old snapshot
    with pytest.raises(RetryLater, match="conflicts with another writer") as failure:
        committer.commit(staged)
    assert "\n" not in str(failure.value)
    assert DeltaTable(path).version() == version + 1 and _ids(by_delta_rs(path)) == [7]
    DeltaCommitter(config).commit(staged)  # re-reading the table, the commit goes through
    assert _ids(by_delta_rs(path)) == [0, 1, 7]


def test_abort_and_the_sweeper_leave_no_staged_file(config: dict[str, Any], pipeline: str) -> None:
    path = config["path"]
    committer = DeltaCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [order_rows(2)]))
    version = DeltaTable(path).version()
    staged = _stage(config, pipeline, 2, [order_rows(3, 10), order_rows(3, 20)])
    store = layout.Store.for_location(path)
    root = f"{path}/onceflow/{pipeline}/lake/epoch=2"
    assert store.files_under(root)
    assert _both(path) == [0, 1]  # staged but not committed: invisible
    committer.abort(staged)
    committer.abort(staged)  # idempotent
    assert store.files_under(root) == [] and committer.orphans(pipeline) == []
    assert DeltaTable(path).version() == version and _both(path) == [0, 1]

    # A crashed attempt (marker only, files half written) is found by the sweeper and removed.
    writer = DeltaWriter(config)
    writer.begin(TaskContext(pipeline, 3, 0, "s0-t0", "a1", "lake"))
    writer.write(order_rows(1, 30))
    orphans = committer.orphans(pipeline)
    assert [(c.epoch, c.handle.get("incomplete")) for c in orphans] == [(3, True)]
    committer.abort(orphans)
    assert committer.orphans(pipeline) == [] and not store.files_under(
        f"{path}/onceflow/{pipeline}/lake/epoch=3"
    )


def test_a_committed_epoch_is_never_aborted_and_lost_files_are_named(
    config: dict[str, Any], pipeline: str
) -> None:
    path = config["path"]
    committer = DeltaCommitter(config)
    staged = _stage(config, pipeline, 1, [order_rows(2)])
    committer.commit(staged)
    with pytest.raises(AlreadyCommitted):
        committer.abort(staged)
    assert _both(path) == [0, 1]
    lost = _stage(config, pipeline, 2, [order_rows(1, 5)])
    (Path(path) / lost[0].handle["files"][0]["path"]).unlink()
    with pytest.raises(StagedOutputLost, match="epoch 2 is not in the table"):
        committer.commit(lost)
    assert DeltaTable(path).version() == 1


def test_nested_columns_and_a_table_made_from_the_first_rows(tmp_path: Path, pipeline: str) -> None:
    nested: dict[str, Any] = {
        "path": str(tmp_path / "nested"),
        "columns": {
            "id": "long",
            "items": "array<struct<sku:string,qty:int>>",
            "attrs": "map<string,int?>",
            "at": "timestamptz",
            "day": "date",
        },
        "name": "lake",
    }
    row = {
        "id": 1,
        "items": [{"sku": "a", "qty": 2}],
        "attrs": {"k": 1, "n": None},
        "at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "day": datetime.date(2026, 1, 2),
    }
    # The second task stages an Arrow batch, as a Spark task does.
    DeltaCommitter(nested).commit(_stage(nested, pipeline, 1, [[row], [{**row, "id": 2}]]))
    read, again = sorted(by_delta_rs(nested["path"]).to_pylist(), key=lambda r: r["id"])
    assert {**again, "id": 1} == read
    assert read["items"] == [{"sku": "a", "qty": 2}] and dict(read["attrs"]) == {"k": 1, "n": None}
    assert read["at"] == row["at"] and read["day"] == row["day"]

    inferred: dict[str, Any] = {"path": str(tmp_path / "inferred"), "name": "lake"}
    DeltaCommitter(inferred).commit(_stage(inferred, pipeline, 1, [[{"id": 1, "name": "x"}]]))
    assert by_log_replay(inferred["path"]).to_pylist() == [{"id": 1, "name": "x"}]
    with pytest.raises(RowError, match=r"columns \['extra'\] are not in the table"):
        _stage(inferred, pipeline, 2, [[{"id": 2, "extra": 1}]])


def test_plan_checks_create_the_table_or_refuse_in_one_line(tmp_path: Path) -> None:
    spec = Pipeline(
        name="p",
        source=KafkaSource(topics=("in",)),
        format=JsonFormat(schema={"id": "int", "name": "string"}),
        sinks=(SinkSpec("lake", "delta", {"path": str(tmp_path / "t")}),),
    )
    config = {"path": str(tmp_path / "t"), "name": "lake"}
    SINK_KIND.plan_checks(spec, [config], 1, False)
    assert not DeltaTable.is_deltatable(config["path"])  # a preview creates nothing
    SINK_KIND.plan_checks(spec, [config], 1, True)
    names = DeltaTable(config["path"]).schema().to_arrow().names
    assert names[:2] == ["id", "name"] and "_offset" in names  # the decoded rows' columns
    partitioned = {"path": str(tmp_path / "t"), "name": "lake", "partition_by": {"name": "identity"}}
    with pytest.raises(ConfigError, match=r"partitioned by \[\], not by the configured \['name'\]"):
        SINK_KIND.plan_checks(spec, [partitioned], 1, True)
    with pytest.raises(ConfigError, match="create_table is false"):
        SINK_KIND.plan_checks(spec, [{**config, "path": str(tmp_path / "u"), "create_table": False}], 1, True)
    with pytest.raises(ConfigError, match="identity"):
        DeltaWriter({**config, "partition_by": {"name": "day"}})
    with pytest.raises(ConfigError, match="not columns"):
        SINK_KIND.plan_checks(
            spec, [{**config, "columns": {"id": "long"}, "partition_by": {"nope": "identity"}}], 1, True
        )


def test_plan_checks_widen_the_table_and_refuse_what_delta_cannot_keep(tmp_path: Path) -> None:
    """A reader schema that gains a nullable field and a nested one: the plan adds them in one commit,
    rows written before read them as null; a changed type, or transactions that expire, are refused."""

    def spec(schema: dict[str, str]) -> Pipeline:
        return Pipeline(
            name="p",
            source=KafkaSource(topics=("in",)),
            format=JsonFormat(schema=schema),
            sinks=(SinkSpec("lake", "delta", {"path": str(tmp_path / "t")}),),
        )

    config = {"path": str(tmp_path / "t"), "name": "lake"}
    before = {"id": "int", "item": "struct<sku:string>"}
    SINK_KIND.plan_checks(spec(before), [config], 1, True)
    first = DeltaTable(config["path"])
    rows = [{"id": 1, "item": {"sku": "a"}, "_partition": 0, "_offset": 7}]
    write_deltalake(
        config["path"], pa.Table.from_pylist(rows, schema=pa.schema(first.schema().to_arrow())), mode="append"
    )

    after = {"id": "int", "item": "struct<sku:string,qty:int?>", "coupon": "string?"}
    SINK_KIND.plan_checks(spec(after), [config], 1, False)
    assert DeltaTable(config["path"]).version() == 1  # a preview adds nothing
    SINK_KIND.plan_checks(spec(after), [config], 1, True)
    table = DeltaTable(config["path"])
    assert table.version() == 2
    (row,) = table.to_pyarrow_table().to_pylist()
    assert row["coupon"] is None and row["item"] == {"sku": "a", "qty": None}
    SINK_KIND.plan_checks(spec(after), [config], 1, True)
    assert DeltaTable(config["path"]).version() == 2  # nothing new, nothing committed

    with pytest.raises(ConfigError, match=r"the columns \['id \(.*change type") as changed:
        SINK_KIND.plan_checks(spec({**after, "id": "string"}), [config], 1, True)
    assert "\n" not in str(changed.value)
    with pytest.raises(ConfigError, match="create_table is false: add them to the table first"):
        SINK_KIND.plan_checks(
            spec({**after, "note": "string?"}), [{**config, "create_table": False}], 1, True
        )

    expiring = str(tmp_path / "expiring")
    DeltaTable.create(
        expiring,
        pa.schema(first.schema().to_arrow()),
        configuration={"delta.setTransactionRetentionDuration": "interval 1 days"},
    )
    with pytest.raises(ConfigError, match=r"setTransactionRetentionDuration=interval 1 days.*unset it"):
        SINK_KIND.plan_checks(spec(before), [{"path": expiring, "name": "lake"}], 1, True)


def test_the_commit_adds_the_staged_files_as_they_are(config: dict[str, Any], pipeline: str) -> None:
    """The commit rewrites nothing: the table's files are the tasks' staged files, byte for byte."""
    import hashlib

    staged = []
    for n in range(2):
        writer = DeltaWriter(config)
        writer.begin(TaskContext(pipeline, 1, 0, f"s0-t{n}", "a0", "lake"))
        writer.write_batch(pa.RecordBatch.from_pylist(order_rows(5000, 5000 * n)))
        staged.append(writer.pre_commit())
    root = Path(config["path"])
    files = {f["path"]: f for c in staged for f in c.handle["files"]}
    before = {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in files}
    DeltaCommitter(config).commit(staged)
    table = DeltaTable(config["path"])
    in_log = sorted(str(Path(uri.removeprefix("file://")).relative_to(root)) for uri in table.file_uris())
    assert in_log == sorted(files)
    assert {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in files} == before
    assert table.count() == 10_000
