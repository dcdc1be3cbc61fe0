"""delta_changes on a real Delta table in a local folder (delta-rs writes the log): every task of an epoch
holds changes of the same key; the commit applies the last change of each key in source order, deletes
and truncates included, in one Delta commit per epoch, only once (its txn action); abort and the sweeper
leave no staged file. Each table is read by delta-rs and by a replay of the log's JSON actions here,
and the two must agree."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from onceflow.errors import ConfigError
from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.protocol.planning import run_plan_checks
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.delta import DeltaCommitter, DeltaWriter, layout
from onceflow.sinks.delta.changes import SINK_KIND, DeltaChangesCommitter, DeltaChangesWriter
from onceflow.sinks.errors import RowError
from tests.integration.delta_helpers import live_files, local_log_actions
from tests.integration.sink_helpers import stage_tasks

pytestmark = pytest.mark.integration

APP = "{pipeline}:lake"


@pytest.fixture
def pipeline() -> str:
    return f"dchg-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    return {
        "path": str(tmp_path / "lake" / "mirror"),
        "columns": {"id": "long", "region": "string", "name": "string", "qty": "long"},
        "partition_by": {"region": "identity"},
        "key_columns": ["id"],
        "name": "lake",
    }


def change(
    op: str,
    offset: int,
    id_: int | None,
    name: str | None = None,
    qty: int | None = None,
    partition: int = 0,
    region: str | None = "eu",
) -> dict[str, Any]:
    return {
        "id": id_,
        "region": None if op in "dt" else region,
        "name": name,
        "qty": qty,
        "_op": op,
        "_partition": partition,
        "_offset": offset,
    }


def _stage(
    config: dict[str, Any], pipeline: str, epoch: int, tasks: list[list[dict[str, Any]]], attempt: str = "a0"
) -> list[Committable]:
    """Each task's writer begun and pre-committed; odd tasks stage Arrow batches, the first one file per
    two rows."""
    return stage_tasks(
        lambda n: DeltaChangesWriter({**config, "rows_per_file": 2} if n == 0 else config),
        pipeline,
        epoch,
        tasks,
        attempt=attempt,
        row_by_row=True,
    )


def by_log_replay(path: str) -> pa.Table:
    """The table from the log's JSON commits read here (add and remove actions, partition values), each
    live file read with pyarrow: no delta-rs code on the way. (The merge's files keep strings as Arrow
    string views, the staged ones as strings: both are Parquet's UTF-8 strings, read here as strings.)"""
    fields, live = live_files(local_log_actions(path))
    rows: list[dict[str, Any]] = []
    for add in live:
        for row in pq.read_table(Path(path) / add["path"]).to_pylist():
            rows.append({f: add["partitionValues"].get(f, row.get(f)) for f in fields})
    return pa.Table.from_pylist(rows) if rows else pa.table({f: [] for f in fields})


def _mirror(path: str) -> dict[int, tuple[Any, ...]]:
    """The table's rows by key, the same through delta-rs and through the log's replay (asserted)."""
    ours, theirs = DeltaTable(path).to_pyarrow_table(), by_log_replay(path)
    rows = {r["id"]: (r["name"], r["qty"], r["region"]) for r in ours.to_pylist()}
    assert {r["id"]: (r["name"], r["qty"], r["region"]) for r in theirs.to_pylist()} == rows
    assert ours.num_rows == theirs.num_rows == len(rows)  # one row per key
    return {k: v[:2] for k, v in rows.items()}


def _epochs(path: str) -> list[int]:
    """The onceflow epoch of each commit after the table's creation, oldest first."""
    history = sorted(DeltaTable(path).history(), key=lambda h: h["version"])
    return [int(h["onceflow.epoch"]) for h in history if "onceflow.epoch" in h]


def _staged_files(path: str, pipeline: str) -> list[str]:
    return layout.Store.for_location(path).files_under(f"{path}/onceflow/{pipeline}")


def test_changes_over_several_tasks_make_one_version_per_epoch_applied_once(
    config: dict[str, Any], pipeline: str
) -> None:
    path = config["path"]
    committer = DeltaChangesCommitter(config)
    tasks = [
        [
            change("r", 0, 1, "a", 1),
            change("r", 1, 2, "b", 2),
            change("c", 2, 3, "c", 3),
            change("u", 3, 1, "a", 5),
        ],
        [
            change("u", 4, 1, "a", 10),
            change("d", 5, 2),
            change("u", 6, 3, "c", 30),
            change("c", 0, 8, "h", 8, partition=1, region="us"),
        ],
        [
            change("u", 7, 1, "a", 100),
            change("c", 8, 2, "b again", 20),
            change("d", 9, 3),
            change("d", 10, 3),
        ],
    ]
    # Tasks named against source order: the commit must order changes by offset, not by task.
    staged = _stage(config, pipeline, 1, [tasks[2], tasks[0], tasks[1]])
    assert len(staged[0].handle["files"]) == 2  # two files of its own rows, each kept to a change per key
    created = DeltaTable(path).version()  # the writers created the table, empty
    assert _mirror(path) == {}  # staged: in no version
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1", "s0-t2"}
    committer.commit(staged)
    want = {1: ("a", 100), 2: ("b again", 20), 8: ("h", 8)}
    assert _mirror(path) == want
    table = DeltaTable(path)
    assert table.version() == created + 1 and table.transaction_version(APP.format(pipeline=pipeline)) == 1
    assert table.schema().to_arrow().names == ["id", "region", "name", "qty"]  # no op nor position
    assert list(table.metadata().partition_columns) == ["region"]
    committer.commit(staged)  # a repeated commit (recovery) applies nothing twice, and makes no version
    assert DeltaTable(path).version() == created + 1 and _mirror(path) == want
    assert committer.orphans(pipeline) == [] and _staged_files(path, pipeline) == []

    # A commit recovered after a crash between the Delta commit and the ledger: the epoch's changes are
    # staged again by new attempts, found in the log, applied nothing, and their files go.
    second = [[change("u", 11, 1, "a", 1000)], [change("c", 12, 4, "d", 4)]]
    committer.commit(_stage(config, pipeline, 2, second))
    version = DeltaTable(path).version()
    assert _mirror(path) == {**want, 1: ("a", 1000), 4: ("d", 4)}
    again = _stage(config, pipeline, 2, [[change("u", 11, 1, "a", -1)]], attempt="a1")
    committer.commit(again)
    assert DeltaTable(path).version() == version and _mirror(path)[1] == ("a", 1000)
    assert _staged_files(path, pipeline) == [] and committer.orphans(pipeline) == []

    # A key moves partition; another is inserted, updated and deleted within the epoch (so never seen).
    committer.commit(
        _stage(
            config,
            pipeline,
            3,
            [
                [change("u", 13, 2, "b", 21, region="us"), change("c", 14, 5, "e", 5)],
                [change("u", 15, 5, "e", 6), change("d", 16, 5), change("d", 1, 8, partition=1)],
            ],
        )
    )
    want = {1: ("a", 1000), 2: ("b", 21), 4: ("d", 4)}
    assert _mirror(path) == want
    regions = {r["id"]: r["region"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()}
    assert regions == {1: "eu", 2: "us", 4: "eu"}
    assert _epochs(path) == [1, 2, 3]
    assert DeltaTable(path).version() == created + 3


def test_a_truncate_empties_the_table_before_the_changes_after_it_in_one_version(
    config: dict[str, Any], pipeline: str
) -> None:
    """The truncate drops the changes before it in its partition (another partition's stay) and every row
    of the table; the emptied table and the changes after it are one version."""
    path = config["path"]
    committer = DeltaChangesCommitter(config)
    committer.commit(
        _stage(
            config,
            pipeline,
            1,
            [[change("c", 0, 1, "a", 1), change("c", 1, 2, "b", 2)], [change("c", 2, 3, "c", 3)]],
        )
    )
    version = DeltaTable(path).version()
    committer.commit(
        _stage(
            config,
            pipeline,
            2,
            [
                [change("u", 3, 1, "a", 10), change("t", 4, None), change("c", 0, 9, "i", 9, partition=1)],
                [change("c", 5, 5, "e", 5), change("u", 6, 5, "e", 6), change("c", 7, 2, "b", 20)],
            ],
        )
    )
    assert _mirror(path) == {2: ("b", 20), 5: ("e", 6), 9: ("i", 9)}
    assert DeltaTable(path).version() == version + 1
    # A truncate with nothing after it: the table is empty, in one more version.
    committer.commit(_stage(config, pipeline, 3, [[change("c", 8, 6, "f", 6), change("t", 9, None)]]))
    assert _mirror(path) == {}
    assert DeltaTable(path).version() == version + 2 and _epochs(path) == [1, 2, 3]


def test_an_epoch_that_changes_no_row_is_recorded_once(config: dict[str, Any], pipeline: str) -> None:
    """A delete of a key the table lacks changes nothing, so the merge makes no version; the epoch is
    still recorded (a commit of its txn action alone), so a repeat applies nothing."""
    path = config["path"]
    committer = DeltaChangesCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [[change("c", 0, 1, "a", 1)]]))
    committer.commit(_stage(config, pipeline, 2, [[change("d", 1, 7)]]))
    table = DeltaTable(path)
    assert table.transaction_version(APP.format(pipeline=pipeline)) == 2 and _epochs(path) == [1, 2]
    commit = json.loads(
        (Path(path) / "_delta_log" / f"{table.version():020d}.json").read_text().splitlines()[0]
    )
    assert commit["commitInfo"]["onceflow.epoch"] == 2
    # Another writer (the append sink of another pipeline) adds key 7 afterwards: a recovered commit of
    # epoch 2 must not delete it.
    other = DeltaWriter({"path": path, "name": "lake"})
    other.begin(TaskContext(f"{pipeline}-other", 1, 0, "s0-t0", "a0", "lake"))
    other.write([{"id": 7, "region": "eu", "name": "g", "qty": 7}])
    DeltaCommitter({"path": path, "name": "lake"}).commit([other.pre_commit()])
    committer.commit(_stage(config, pipeline, 2, [[change("d", 1, 7)]], attempt="a1"))
    assert _mirror(path) == {1: ("a", 1), 7: ("g", 7)}


def test_abort_and_the_sweeper_leave_no_staged_file(config: dict[str, Any], pipeline: str) -> None:
    path = config["path"]
    committer = DeltaChangesCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [[change("c", 0, 1, "a", 1)]]))
    version = DeltaTable(path).version()
    staged = _stage(config, pipeline, 2, [[change("d", 1, 1)], [change("c", 2, 2, "b", 2)]])
    assert [p for p in _staged_files(path, pipeline) if "/epoch=2/" in p]
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1"}
    committer.abort(staged)
    committer.abort(staged)  # idempotent
    assert _staged_files(path, pipeline) == [] and committer.orphans(pipeline) == []
    assert DeltaTable(path).version() == version and _mirror(path) == {1: ("a", 1)}

    # A crashed attempt (marker only, a file half staged) is found by the sweeper and removed.
    writer = DeltaChangesWriter({**config, "rows_per_file": 1})
    writer.begin(TaskContext(pipeline, 3, 0, "s0-t0", "a1", "lake"))
    writer.write([change("u", 3, 1, "a", 3)])
    assert _staged_files(path, pipeline)
    orphans = committer.orphans(pipeline)
    assert [(c.epoch, c.handle.get("incomplete")) for c in orphans] == [(3, True)]
    committer.abort(orphans)
    assert committer.orphans(pipeline) == [] and _staged_files(path, pipeline) == []
    assert _mirror(path) == {1: ("a", 1)}


def test_what_it_cannot_apply_is_refused_in_one_line(config: dict[str, Any], settings: Any) -> None:
    def spec(fmt: JsonFormat, sink_config: dict[str, Any]) -> Pipeline:
        return Pipeline(
            name="dchg-refusals",
            source=KafkaSource(topics=("t",)),
            format=fmt,
            sinks=(SinkSpec("lake", "delta_changes", sink_config),),
        )

    schema = {"id": "int", "region": "string?", "name": "string?", "qty": "int?"}
    sink = {k: v for k, v in config.items() if k != "name"}
    with pytest.raises(
        ConfigError, match=r"^delta_changes sink config key_columns=None: expected a non-empty list"
    ):
        SINK_KIND.build_writer({k: v for k, v in config.items() if k != "key_columns"})
    with pytest.raises(ConfigError, match=r"key_columns \['key'\] are not among the columns"):
        SINK_KIND.build_committer({**config, "key_columns": ["key"]})
    with pytest.raises(ConfigError, match=r"'columns' is required"):
        SINK_KIND.build_writer({k: v for k, v in config.items() if k != "columns"})
    with pytest.raises(ConfigError, match=r"columns \['_op'\] are the staged changes' own"):
        SINK_KIND.build_writer({**config, "columns": {**config["columns"], "_op": "string"}})
    with pytest.raises(ConfigError, match=r"apply change events by key: give the format changes="):
        run_plan_checks(spec(JsonFormat(schema=schema), sink), settings, apply=False)
    with pytest.raises(ConfigError, match=r"not the change stream's key \['name'\]"):
        run_plan_checks(spec(JsonFormat(schema=schema, changes=Debezium(key=("name",))), sink), settings)
    assert not DeltaTable.is_deltatable(config["path"])  # nothing was created on the way
    # A change without its key cannot be applied by key.
    writer = DeltaChangesWriter(config)
    writer.begin(TaskContext("dchg-refusals", 1, 0, "s0-t0", "a0", "lake"))
    with pytest.raises(RowError, match=r"a change without a value of its key columns \['id'\]"):
        writer.write([change("u", 0, None, "a", 1)])
    writer.abort()
