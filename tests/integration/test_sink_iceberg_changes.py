"""iceberg_changes on a real Iceberg table (pyiceberg's SQL catalog, Parquet files): every task of an epoch
holds changes of the same key; the commit applies the last change of each key in source order, deletes
and truncates included, in one snapshot per epoch, only once, rewriting only the files that hold a
changed key; abort leaves nothing; Spark reads the same table."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from onceflow.errors import ConfigError
from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.protocol.planning import run_plan_checks
from onceflow.sinks.base import Committable
from onceflow.sinks.iceberg import files
from onceflow.sinks.iceberg.changes import SINK_KIND, IcebergChangesCommitter, IcebergChangesWriter
from tests.integration.sink_helpers import stage_tasks
from tests.integration.test_iceberg_pipeline import spark_sql

pytestmark = pytest.mark.integration


@pytest.fixture
def pipeline() -> str:
    return f"ichg-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    return {
        "table": "cdc.mirror",
        "catalog": "onceflow",
        "catalog_properties": {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse",
        },
        "columns": {"id": "long", "name": "string", "qty": "long"},
        "key_columns": ["id"],
        "name": "lake",
    }


def change(
    op: str, offset: int, id_: int | None, name: str | None = None, qty: int | None = None, partition: int = 0
) -> dict[str, Any]:
    return {"id": id_, "name": name, "qty": qty, "_op": op, "_partition": partition, "_offset": offset}


def _stage(
    config: dict[str, Any], pipeline: str, epoch: int, tasks: list[list[dict[str, Any]]]
) -> list[Committable]:
    """Each task's writer begun and pre-committed; odd tasks stage Arrow batches, the first one file per
    two rows."""
    return stage_tasks(
        lambda n: IcebergChangesWriter({**config, "rows_per_file": 2} if n == 0 else config),
        pipeline,
        epoch,
        tasks,
        row_by_row=True,
    )


def _table(config: dict[str, Any]) -> Any:
    return IcebergChangesCommitter(config)._load()


def _mirror(config: dict[str, Any]) -> dict[int, tuple[Any, ...]]:
    rows = _table(config).scan().to_arrow().to_pylist()
    return {r["id"]: (r["name"], r["qty"]) for r in rows}


def _data_files(config: dict[str, Any]) -> set[str]:
    return {t.file.file_path for t in _table(config).scan().plan_files()}


def test_changes_over_several_tasks_make_one_snapshot_per_epoch_applied_once(  # type: ignore[no-untyped-def]
    config, pipeline, tmp_path
) -> None:
    committer = IcebergChangesCommitter(config)
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
            change("c", 0, 8, "h", 8, 1),
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
    assert _table(config).current_snapshot() is None  # staged: the table has no snapshot yet
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1", "s0-t2"}
    committer.commit(staged)
    want = {1: ("a", 100), 2: ("b again", 20), 8: ("h", 8)}
    assert _mirror(config) == want
    table = _table(config)
    assert [f.name for f in table.schema().fields] == ["id", "name", "qty"]  # no op nor position
    first = table.current_snapshot()
    assert first is not None and first.summary is not None and first.summary["onceflow.epoch"] == "1"
    committer.commit(staged)  # a repeated commit (recovery) applies nothing twice, and makes no snapshot
    assert _table(config).current_snapshot().snapshot_id == first.snapshot_id
    assert _mirror(config) == want
    assert committer.orphans(pipeline) == []  # the staged changes are gone with their markers
    assert all(
        not files.Store.for_location("file:///").exists(s["path"]) for c in staged for s in c.handle["files"]
    )

    # New keys only: the epoch's file is added, the file of keys 1..8 is not rewritten (its bounds).
    before = _data_files(config)
    committer.commit(
        _stage(config, pipeline, 2, [[change("c", 11, 100, "x", 1)], [change("c", 12, 102, "z", 3)]])
    )
    assert before < _data_files(config)
    # Changes of keys 2 and 8 rewrite that file alone; the file of keys 100 and 102 stays, though key
    # 101, new, lies within its bounds.
    newer = _data_files(config) - before
    committer.commit(
        _stage(
            config,
            pipeline,
            3,
            [
                [change("u", 13, 2, "b", 21)],
                [change("d", 14, 8, partition=1), change("c", 1, 101, "y", 2, 1)],
            ],
        )
    )
    assert newer < _data_files(config) and not before & _data_files(config)
    want = {1: ("a", 100), 2: ("b", 21), 100: ("x", 1), 101: ("y", 2), 102: ("z", 3)}
    assert _mirror(config) == want

    # A truncate empties the table before the changes after it in its partition; another partition's
    # changes before it stay.
    committer.commit(
        _stage(
            config,
            pipeline,
            4,
            [
                [change("u", 15, 1, "a", 101), change("t", 16, None), change("c", 2, 9, "i", 9, 1)],
                [change("c", 17, 5, "e", 5), change("u", 18, 5, "e", 6), change("u", 19, 102, "z", 4)],
            ],
        )
    )
    want = {5: ("e", 6), 9: ("i", 9), 102: ("z", 4)}
    assert _mirror(config) == want
    snapshots = _table(config).snapshots()
    assert [s.summary["onceflow.epoch"] for s in snapshots] == ["1", "2", "3", "4"]


@pytest.mark.slow
def test_spark_reads_the_rewritten_table(config, pipeline) -> None:  # type: ignore[no-untyped-def]
    """A copy-on-write snapshot (files deleted and added at once) read by Spark through Iceberg's own
    catalog: a local Spark starts, so this takes several seconds."""
    committer = IcebergChangesCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [[change("c", 0, 1, "a", 1), change("c", 1, 2, "b", 2)]]))
    committer.commit(_stage(config, pipeline, 2, [[change("u", 2, 1, "a", 10)], [change("d", 3, 2)]]))
    assert _table(config).current_snapshot().summary.operation.value == "overwrite"
    (rows,) = spark_sql(config["catalog_properties"], "SELECT id, name, qty FROM onceflow.cdc.mirror")
    assert {r["id"]: (r["name"], r["qty"]) for r in rows} == _mirror(config) == {1: ("a", 10)}


def test_an_aborted_epoch_leaves_the_table_and_no_staged_files(config, pipeline) -> None:  # type: ignore[no-untyped-def]
    committer = IcebergChangesCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [[change("c", 0, 1, "a", 1)]]))
    snapshot = _table(config).current_snapshot()
    staged = _stage(config, pipeline, 2, [[change("d", 1, 1)], [change("c", 2, 2, "b", 2)]])
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1"}
    committer.abort(staged)
    assert committer.orphans(pipeline) == []
    table = _table(config)
    store = files.Store.for_location(table.location())
    root = files.data_root(str(table.location_provider().data_path), pipeline, "lake")
    assert not [p for p in store.files_under(root) if "/epoch=2/" in p]
    assert table.current_snapshot().snapshot_id == snapshot.snapshot_id
    assert _mirror(config) == {1: ("a", 1)}


def test_what_it_cannot_apply_is_refused_before_anything_runs(config, settings) -> None:  # type: ignore[no-untyped-def]
    def spec(fmt: JsonFormat, sink_config: dict[str, Any]) -> Pipeline:
        return Pipeline(
            name="ichg-refusals",
            source=KafkaSource(topics=("t",)),
            format=fmt,
            sinks=(SinkSpec("lake", "iceberg_changes", sink_config),),
        )

    schema = {"id": "int", "name": "string?", "qty": "int?"}
    sink = {k: v for k, v in config.items() if k != "name"}
    with pytest.raises(ConfigError, match=r"apply change events by key: give the format changes="):
        run_plan_checks(spec(JsonFormat(schema=schema), sink), settings, apply=False)
    with pytest.raises(ConfigError, match=r"key_columns \['key'\] are not among the columns"):
        run_plan_checks(
            spec(JsonFormat(schema=schema, changes=Debezium()), {**sink, "key_columns": ["key"]}), settings
        )
    with pytest.raises(ConfigError, match=r"not the change stream's key \['name'\]"):
        run_plan_checks(spec(JsonFormat(schema=schema, changes=Debezium(key=("name",))), sink), settings)
    with pytest.raises(ConfigError, match=r"columns \['_op'\] are the staged changes' own"):
        SINK_KIND.build_writer({**config, "columns": {"id": "long", "_op": "string"}})
