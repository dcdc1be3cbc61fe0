"""postgres_upsert with ``changes``: a change stream applied by key while processing, on the real
PostgreSQL. Each task applies the last change of each of its keys at pre-commit, in one transaction:
a replayed task leaves the same table (deletes included), an attempt that dies applies nothing, and a
truncate or a spec that could split a key's changes over tasks is refused in one line."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from onceflow.errors import ConfigError
from onceflow.pipeline import Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.base import TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.postgres_upsert import SINK_KIND, UpsertWriter

pytestmark = pytest.mark.integration


def change(op: str, partition: int, offset: int, id_: int, name: str | None = None) -> dict[str, Any]:
    return {"id": id_, "name": name, "_op": op, "_partition": partition, "_offset": offset}


@pytest.fixture
def config(pg_database: str) -> dict[str, Any]:
    return {
        "dsn": pg_database,
        "table": f"upsert_changes_{uuid.uuid4().hex[:8]}",
        "columns": {"id": "bigint", "name": "text"},
        "key_columns": ["id"],
        "changes": True,
        "name": "mirror",
    }


def _apply(config: dict[str, Any], task: str, rows: list[dict[str, Any]], batches: int = 2) -> None:
    writer = UpsertWriter(config)
    writer.begin(TaskContext("upsert-changes", 1, 0, task, "a0", "mirror"))
    size = -(-len(rows) // batches)
    for start in range(0, len(rows), size):
        writer.write(rows[start : start + size])
    writer.pre_commit()


def _table(config: dict[str, Any]) -> dict[int, str]:
    with psycopg.connect(config["dsn"]) as conn:
        return dict(conn.execute(f"SELECT id, name FROM {config['table']}").fetchall())


def test_each_task_applies_its_last_change_per_key_and_a_replay_leaves_the_same_table(config) -> None:  # type: ignore[no-untyped-def]
    first = [
        change("r", 0, 0, 1, "a"),
        change("c", 0, 1, 2, "b"),
        change("u", 0, 2, 1, "a2"),
        change("d", 0, 3, 2),
        change("c", 0, 4, 2, "b again"),  # deleted, then inserted again: the last change wins
        change("c", 0, 5, 3, "c"),
        change("d", 0, 6, 3),
    ]
    other_partition = [change("c", 1, 0, 10, "x"), change("u", 1, 1, 10, "y")]
    _apply(config, "s0-t0", first)
    _apply(config, "s0-t1", other_partition)
    want = {1: "a2", 2: "b again", 10: "y"}
    assert _table(config) == want
    _apply(config, "s0-t0", first, batches=3)  # the task replayed, in other batches
    assert _table(config) == want
    _apply(config, "s0-t0", [change("d", 0, 7, 1), change("d", 0, 8, 99)])  # a key never there: nothing
    _apply(config, "s0-t0", [change("d", 0, 7, 1)])  # the same delete again
    assert _table(config) == {2: "b again", 10: "y"}


def test_an_attempt_that_dies_before_its_pre_commit_applies_nothing(config) -> None:  # type: ignore[no-untyped-def]
    _apply(config, "s0-t0", [change("c", 0, 0, 1, "a")])
    dying = UpsertWriter(config)
    dying.begin(TaskContext("upsert-changes", 2, 0, "s0-t0", "a0", "mirror"))
    dying.write([change("d", 0, 1, 1), change("c", 0, 2, 5, "e")])
    dying.abort()
    assert _table(config) == {1: "a"}


def test_a_truncate_and_a_spec_that_splits_a_partition_are_refused_in_one_line(config) -> None:  # type: ignore[no-untyped-def]
    writer = UpsertWriter(config)
    writer.begin(TaskContext("upsert-changes", 1, 0, "s0-t0", "a0", "mirror"))
    with pytest.raises(RowError, match="truncate is not applied by postgres_upsert"):
        writer.write([{"id": None, "name": None, "_op": "t", "_partition": 0, "_offset": 0}])
    writer.abort()

    def spec(**limits: int) -> Pipeline:
        return Pipeline(
            name="upsert-changes",
            source=KafkaSource(topics=("t",)),
            format=JsonFormat(schema={"id": "int", "name": "string?"}, changes=Debezium(key=("id",))),
            sinks=(SinkSpec("mirror", "postgres_upsert", config),),
            **limits,
        )

    with pytest.raises(ConfigError, match="max_records_per_task >= max_records_per_partition"):
        SINK_KIND.plan_checks(
            spec(max_records_per_partition=100_000, max_records_per_task=50_000), [config], 1, False
        )
    SINK_KIND.plan_checks(spec(max_records_per_task=100_000), [config], 1, False)
    SINK_KIND.plan_checks(spec(), [config], 1, False)  # the defaults: one task per partition's range
    records = Pipeline(
        name="upsert-records",
        source=KafkaSource(topics=("t",)),
        format=JsonFormat(schema={"id": "int", "name": "string?"}),
        sinks=(SinkSpec("mirror", "postgres_upsert", config),),
    )
    with pytest.raises(ConfigError, match="give the format changes=Debezium"):
        SINK_KIND.plan_checks(records, [config], 1, False)
