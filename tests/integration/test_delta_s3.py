"""The Delta sinks with their table in a bucket of the stack's S3 server: one table version per epoch,
recognised when repeated (the ``txn`` action); writers that race for one table version, where delta-rs's
put-if-absent of the log entry lets exactly one win and the others retry after it; abort and the sweeper
leave no staged object; and ``delta_changes`` applying upserts and deletes.

Each table is read back by delta-rs at every version, and by a second reader that shares nothing with
the sink nor delta-rs: it replays the log's JSON commits fetched from the bucket and reads each live
add action's file with pyarrow (`S3FileSystem` made from the AWS variables). Objects are listed through
boto3, so what a test says is left in the bucket is what the S3 server holds.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from onceflow.config import Settings
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.sinks.base import Committable
from onceflow.sinks.delta import DeltaCommitter, DeltaConfig, DeltaWriter
from onceflow.sinks.delta.changes import DeltaChangesCommitter, DeltaChangesWriter
from onceflow.sinks.delta.history import version_of_epoch
from onceflow.sinks.errors import AlreadyCommitted
from onceflow.storage.s3 import S3Settings
from tests.integration.delta_helpers import live_files
from tests.integration.pipeline_helpers import epochs_that_read, produce_views, views_pipeline
from tests.integration.s3_helpers import bucket_fs, objects
from tests.integration.sink_helpers import order_rows, orders_config, stage_tasks, sweep_dead_attempt

pytestmark = pytest.mark.integration

PIPELINE: Pipeline | None = None  # set by the pipeline test; `run_until` loads it as this module's attribute


@pytest.fixture
def options(s3: S3Settings) -> dict[str, str]:
    return s3.delta_options()


@pytest.fixture
def config(bucket_prefix: str, s3: S3Settings) -> dict[str, Any]:
    return orders_config(path=f"{bucket_prefix}/lake/orders", s3=s3.to_config())


@pytest.fixture
def pipeline() -> str:
    return f"dl-s3-{uuid.uuid4().hex[:10]}"


def _stage(
    config: dict[str, Any], pipeline: str, epoch: int, tasks: list[list[dict[str, Any]]]
) -> list[Committable]:
    """Each task's writer begun and pre-committed; odd tasks stage Arrow batches (a Spark task's path),
    the first task one file per two rows."""
    return stage_tasks(
        lambda n: DeltaWriter({**config, "rows_per_file": 2} if n == 0 else config), pipeline, epoch, tasks
    )


def by_delta_rs(path: str, options: dict[str, str], version: int | None = None) -> pa.Table:
    return DeltaTable(path, version=version, storage_options=options).to_pyarrow_table()


def log_actions(path: str, version: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The log's JSON commits up to ``version``, fetched from the bucket with pyarrow: (version, action)."""
    fs = bucket_fs()
    from pyarrow import fs as pafs

    log = f"{path.removeprefix('s3://')}/_delta_log"
    entries = fs.get_file_info(pafs.FileSelector(log, recursive=False))
    assert not [e for e in entries if ".checkpoint" in e.path], "this reader replays JSON commits only"
    commits = sorted((int(e.base_name.split(".")[0]), e.path) for e in entries if e.path.endswith(".json"))
    found = []
    for number, key in commits:
        if version is not None and number > version:
            break
        with fs.open_input_stream(key) as stream:
            text = stream.read().decode()
        found += [(number, json.loads(line)) for line in text.splitlines() if line.strip()]
    return found


def by_log_replay(path: str, version: int | None = None) -> pa.Table:
    """The table at ``version``: the log's add and remove actions replayed here, each live add action's
    file read from the bucket with pyarrow, its partition values added as the action gives them."""
    fs = bucket_fs()
    names, live = live_files(action for _, action in log_actions(path, version))
    parts = []
    for add in live:
        data = pq.read_table(f"{path.removeprefix('s3://')}/{add['path']}", filesystem=fs)
        for column, value in add["partitionValues"].items():
            data = data.append_column(column, pa.array([value] * data.num_rows, pa.string()))
        parts.append(data.select(names))
    return pa.concat_tables(parts) if parts else pa.table({n: [] for n in names})


def _both(path: str, options: dict[str, str], version: int | None = None) -> list[int]:
    """The table's ids at ``version``, the same rows through both readers (asserted)."""
    ours, theirs = by_delta_rs(path, options, version), by_log_replay(path, version)
    as_rows = sorted((r["id"], r["region"], r["qty"]) for r in theirs.to_pylist())
    assert sorted((r["id"], r["region"], r["qty"]) for r in ours.to_pylist()) == as_rows
    return sorted(r[0] for r in as_rows)


def test_epochs_commit_once_in_one_version_each_in_a_bucket(
    config: dict[str, Any], options: dict[str, str], pipeline: str, s3: S3Settings
) -> None:
    path = config["path"]
    committer = DeltaCommitter(config)
    staged = _stage(config, pipeline, 1, [order_rows(5), order_rows(4, 5)])
    assert len(staged[0].handle["files"]) >= 3  # two rows a file, one region a file
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1"}
    created = DeltaTable(path, storage_options=options).version()  # the writers made the table, empty
    assert _both(path, options) == []  # staged objects are in no version: no reader sees them

    committer.commit(staged)
    table = DeltaTable(path, storage_options=options)
    assert table.version() == created + 1
    assert table.transaction_version(f"{pipeline}:lake") == 1
    assert _both(path, options) == list(range(9))
    assert committer.orphans(pipeline) == []  # markers gone once the files are in the log

    committer.commit(staged)  # repeated (recovery after a crash before the ledger): nothing added
    DeltaCommitter(config).commit(staged)  # another committer of the same epoch: nothing either
    assert DeltaTable(path, storage_options=options).version() == created + 1

    committer.commit(_stage(config, pipeline, 2, [order_rows(3, 100), order_rows(2, 200)]))
    assert DeltaTable(path, storage_options=options).version() == created + 2
    # Every version is the table as of its epoch, through both readers; the log maps epochs to them.
    assert _both(path, options, created) == []
    assert _both(path, options, created + 1) == list(range(9))
    assert _both(path, options, created + 2) == [*range(9), 100, 101, 102, 200, 201]
    for epoch in (1, 2):
        assert version_of_epoch(path, pipeline, "lake", epoch, storage_options=options) == created + epoch
    # The log and the data are objects of the bucket, under the table's prefix.
    keys = objects(s3, path)
    assert any("/_delta_log/" in k and k.endswith(".json") for k in keys)
    assert [k for k in keys if "/_onceflow/" in k] == []  # no marker left


def test_another_writer_between_stage_and_commit_is_kept(
    config: dict[str, Any], options: dict[str, str], pipeline: str
) -> None:
    path = config["path"]
    committer = DeltaCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [order_rows(3)]))
    staged = _stage(config, pipeline, 2, [order_rows(3, 10), order_rows(2, 20)])
    other = pa.table(
        {"id": pa.array([900, 901], pa.int64()), "region": ["eu", "us"], "qty": pa.array([1, 2], pa.int64())}
    )
    write_deltalake(path, other, mode="append", storage_options=options)  # another application appends
    committer.commit(staged)
    want = [0, 1, 2, 10, 11, 12, 20, 21, 900, 901]
    assert _both(path, options) == want
    version = DeltaTable(path, storage_options=options).version()
    DeltaCommitter(config).commit(staged)  # a second committer of the same epoch: nothing twice
    assert DeltaTable(path, storage_options=options).version() == version and _both(path, options) == want


def test_commits_that_race_for_one_version_each_land_once(
    config: dict[str, Any], options: dict[str, str], pipeline: str
) -> None:
    """Our epoch's commit, a second committer of the same epoch and another application's append, all
    built on the same table version, run at once: the log entry of the next version is written with a
    put-if-absent, so one of them wins it and the others find it taken, re-read the log and go after
    it (the append) or find their epoch there (the second committer)."""
    path = config["path"]
    DeltaCommitter(config).commit(_stage(config, pipeline, 1, [order_rows(3)]))
    staged = _stage(config, pipeline, 2, [order_rows(3, 10), order_rows(2, 20)])
    base = DeltaTable(path, storage_options=options).version()
    other = pa.table({"id": pa.array([900], pa.int64()), "region": ["eu"], "qty": pa.array([1], pa.int64())})

    starts: list[DeltaTable] = []  # the table as each racer reads it first

    def stale_committer() -> DeltaCommitter:
        """A committer whose first read of the table is the version all the racers start from."""
        committer = DeltaCommitter(config)
        reads = [DeltaTable(path, storage_options=options)]
        starts.append(reads[0])
        fresh = committer._load
        committer._load = lambda: reads.pop() if reads else fresh()  # type: ignore[method-assign]
        return committer

    first, second = stale_committer(), stale_committer()
    foreign = DeltaTable(path, storage_options=options)
    starts.append(foreign)
    racers = [
        lambda: first.commit(staged),
        lambda: second.commit(staged),
        lambda: write_deltalake(foreign, other, mode="append"),
    ]
    # Each racer is built on the same version: whichever comes second finds that version's log entry
    # taken (its put-if-absent refused) and must go after it.
    assert [t.version() for t in starts] == [base] * len(racers)
    errors: list[BaseException] = []
    start = threading.Barrier(len(racers))

    def run(racer: Any) -> None:
        start.wait()
        try:
            racer()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    table = DeltaTable(path, storage_options=options)
    assert table.version() == base + 2  # our epoch once, the append once
    assert table.transaction_version(f"{pipeline}:lake") == 2
    assert _both(path, options) == [0, 1, 2, 10, 11, 12, 20, 21, 900]
    commits = [a["commitInfo"] for v, a in log_actions(path) if v > base and "commitInfo" in a]
    assert len(commits) == 2 and sum(1 for c in commits if c.get("onceflow.epoch") == 2) == 1


def test_put_if_absent_lets_exactly_one_of_racing_commits_win(
    config: dict[str, Any], options: dict[str, str], pipeline: str
) -> None:
    """Without retries, writers of the same table version from the same snapshot: the S3 server's
    conditional put lets one log entry in and refuses the rest; none overwrites another's."""
    path = config["path"]
    DeltaCommitter(config).commit(_stage(config, pipeline, 1, [order_rows(1)]))
    base = DeltaTable(path, storage_options=options).version()
    tables = [DeltaTable(path, storage_options=options) for _ in range(4)]
    outcomes: dict[int, str] = {}
    start = threading.Barrier(len(tables))

    def append(n: int) -> None:
        row = pa.table(
            {"id": pa.array([500 + n], pa.int64()), "region": ["eu"], "qty": pa.array([n], pa.int64())}
        )
        start.wait()
        try:
            write_deltalake(
                tables[n], row, mode="append", commit_properties=CommitProperties(max_commit_retries=0)
            )
            outcomes[n] = "won"
        except CommitFailedError:
            outcomes[n] = "refused"

    threads = [threading.Thread(target=append, args=(n,)) for n in range(len(tables))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    winners = [n for n, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == len(tables) and len(winners) == 1
    assert DeltaTable(path, storage_options=options).version() == base + 1
    assert _both(path, options) == [0, 500 + winners[0]]


def test_abort_and_the_sweeper_leave_no_staged_object(
    config: dict[str, Any], options: dict[str, str], pipeline: str, s3: S3Settings
) -> None:
    path = config["path"]
    committer = DeltaCommitter(config)
    first = _stage(config, pipeline, 1, [order_rows(3)])
    committer.commit(first)
    version = DeltaTable(path, storage_options=options).version()
    staged = _stage(config, pipeline, 2, [order_rows(3, 10), order_rows(3, 20)])
    epoch_dir = f"{path}/onceflow/{pipeline}/lake/epoch=2"
    assert len(objects(s3, epoch_dir)) >= 2
    committer.abort(staged)
    committer.abort(staged)  # idempotent
    assert objects(s3, epoch_dir) == [] and committer.orphans(pipeline) == []
    assert DeltaTable(path, storage_options=options).version() == version
    assert _both(path, options) == [0, 1, 2]

    # A dead attempt (marker and a file written, never pre-committed) is what the sweeper finds; its
    # abort takes every object of it.
    dead_dir = f"{path}/onceflow/{pipeline}/lake/epoch=3"
    writer = DeltaWriter({**config, "rows_per_file": 1})
    sweep_dead_attempt(committer, writer, pipeline, lambda: objects(s3, dead_dir))
    assert objects(s3, f"{path}/_onceflow") == []

    # A committed epoch's files are never deleted: delta-rs names them by s3:// URL.
    with pytest.raises(AlreadyCommitted):
        committer.abort(first)
    assert _both(path, options) == [0, 1, 2]


def test_the_bucket_settings_never_show_in_the_config(config: dict[str, Any], s3: S3Settings) -> None:
    parsed = DeltaConfig.from_mapping(config)
    assert parsed.storage_options == s3.delta_options()
    assert parsed.storage_options is not None and parsed.storage_options["AWS_CONDITIONAL_PUT"] == "etag"
    assert s3.secret_access_key is not None and s3.access_key_id is not None
    assert s3.secret_access_key not in repr(parsed) and s3.access_key_id not in repr(parsed)


def change(op: str, offset: int, id_: int, name: str | None = None, partition: int = 0) -> dict[str, Any]:
    return {"id": id_, "name": name, "_op": op, "_partition": partition, "_offset": offset}


def test_changes_apply_upserts_and_deletes_once_in_a_bucket(
    bucket_prefix: str, s3: S3Settings, options: dict[str, str], pipeline: str
) -> None:
    config: dict[str, Any] = {
        "path": f"{bucket_prefix}/lake/mirror",
        "columns": {"id": "long", "name": "string"},
        "key_columns": ["id"],
        "name": "lake",
        "s3": s3.to_config(),
    }

    def stage(epoch: int, tasks: list[list[dict[str, Any]]]) -> list[Committable]:
        return stage_tasks(lambda _: DeltaChangesWriter(config), pipeline, epoch, tasks)

    def table_rows(version: int | None = None) -> list[tuple[int, str]]:
        read = by_delta_rs(config["path"], options, version)
        return sorted((r["id"], r["name"]) for r in read.to_pylist())

    committer = DeltaChangesCommitter(config)
    first = stage(
        1,
        [[change("c", 0, 1, "a"), change("c", 1, 2, "b")], [change("c", 2, 3, "c"), change("u", 3, 1, "a2")]],
    )
    committer.commit(first)
    after_first = DeltaTable(config["path"], storage_options=options).version()
    assert table_rows() == [(1, "a2"), (2, "b"), (3, "c")]
    # Epoch 2: a key deleted, one updated then deleted in another task, one updated, one inserted.
    second = stage(
        2,
        [
            [change("d", 4, 2), change("u", 5, 3, "c2"), change("c", 6, 4, "x")],
            [change("u", 1, 5, "y", partition=1), change("d", 7, 4)],
        ],
    )
    committer.commit(second)
    committer.commit(second)  # repeated: nothing applied twice
    table = DeltaTable(config["path"], storage_options=options)
    assert table.version() == after_first + 1 and table.transaction_version(f"{pipeline}:lake") == 2
    assert table_rows() == [(1, "a2"), (3, "c2"), (5, "y")]
    assert table_rows(after_first) == [(1, "a2"), (2, "b"), (3, "c")]
    live = sorted((r["id"], r["name"]) for r in by_log_replay(config["path"]).to_pylist())
    assert live == table_rows()
    assert committer.orphans(pipeline) == []
    assert [
        k for k in objects(s3, config["path"]) if f"/onceflow/{pipeline}/" in k or "/_onceflow/" in k
    ] == []


def test_a_pipeline_on_the_spark_runtime_writes_its_table_into_the_bucket(
    settings: Settings,
    s3: S3Settings,
    options: dict[str, str],
    make_topic: Any,
    bucket_prefix: str,
    run_settings: Settings,
) -> None:
    from onceflow.engine.runner import run_until

    global PIPELINE
    topic = make_topic("delta-s3", partitions=2)
    name = f"delta_s3_{uuid.uuid4().hex[:8]}"
    path = f"{bucket_prefix}/lake/views"
    PIPELINE = views_pipeline(
        name, topic, SinkSpec("lake", "delta", {"path": path, "columns": {"id": "long", "page": "string"}})
    )
    produce_views(settings.kafka_bootstrap, topic, range(120))

    run_until(f"{__name__}:PIPELINE", run_settings, until_caught_up=True, executor="connect")

    table = DeltaTable(path, storage_options=options)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(120))
    assert sorted(by_log_replay(path).column("id").to_pylist()) == list(range(120))
    read = [e.number for e in epochs_that_read(run_settings, name)]
    assert len(read) >= 2 and table.version() == len(read)  # version 0 made the table
    assert table.transaction_version(f"{name}:lake") == read[-1]
    assert [k for k in objects(s3, path) if "/_onceflow/" in k] == []
