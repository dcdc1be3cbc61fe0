"""postgres_2pc on the real PostgreSQL: prepared rows stay invisible until COMMIT PREPARED elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from onceflow.offsets import OffsetRange
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import AlreadyCommitted, ConflictingAttempt, RowError, StagedOutputLost
from onceflow.sinks.postgres_2pc import GID_PREFIX, PostgresTwoPhaseCommitter, PostgresTwoPhaseWriter

pytestmark = pytest.mark.integration


@pytest.fixture
def pipeline() -> str:
    return f"p2pc-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def config(pg_database: str, pipeline: str) -> Iterator[dict[str, Any]]:
    yield {"dsn": pg_database, "table": "events", "columns": {"id": "bigint PRIMARY KEY", "payload": "text"}}
    # Prepared transactions block DROP DATABASE: roll back this test's own (and only those).
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s)",
            [f"{GID_PREFIX}{pipeline}:"],
        ).fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")


def task(pipeline: str, epoch: int = 1, name: str = "s0-t0", attempt: str = "a1") -> TaskContext:
    return TaskContext(pipeline, epoch, 0, name, attempt, "out", (OffsetRange("in", 0, 0, 3),))


def stage(config: dict[str, Any], ctx: TaskContext, ids: list[int]) -> Committable:
    writer = PostgresTwoPhaseWriter(config)
    writer.begin(ctx)
    writer.write({"id": i, "payload": f"row-{i}"} for i in ids)
    return writer.pre_commit()


def ids_in(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM events ORDER BY id").fetchall()]


def test_prepared_rows_are_invisible_until_another_connection_commits(
    config: dict[str, Any], pipeline: str
) -> None:
    committable = stage(config, task(pipeline), [1, 2, 3])
    assert committable.record_count == 3
    assert ids_in(config["dsn"]) == []
    PostgresTwoPhaseCommitter(config).commit([Committable.from_json(committable.to_json())])
    assert ids_in(config["dsn"]) == [1, 2, 3]
    with psycopg.connect(config["dsn"]) as conn:
        marker = conn.execute(
            "SELECT attempt, record_count FROM onceflow_markers WHERE pipeline = %s", [pipeline]
        )
        assert marker.fetchall() == [("a1", 3)]


def test_commit_twice_is_commit_once_and_abort_after_commit_is_refused(
    config: dict[str, Any], pipeline: str
) -> None:
    committables = [stage(config, task(pipeline, name=f"s0-t{i}"), [i * 10, i * 10 + 1]) for i in range(2)]
    committer = PostgresTwoPhaseCommitter(config)
    committer.commit(committables)
    committer.commit(committables)
    assert ids_in(config["dsn"]) == [0, 1, 10, 11]
    with pytest.raises(AlreadyCommitted):
        committer.abort(committables[:1])
    assert committer.orphans(pipeline) == []


def test_abort_after_prepare_leaves_nothing_and_a_later_commit_is_refused(
    config: dict[str, Any], pipeline: str
) -> None:
    committable = stage(config, task(pipeline), [1, 2])
    committer = PostgresTwoPhaseCommitter(config)
    committer.abort([committable])
    committer.abort([committable])
    assert ids_in(config["dsn"]) == []
    with pytest.raises(StagedOutputLost):
        committer.commit([committable])


def test_orphans_are_found_by_pipeline_and_rolled_back(config: dict[str, Any], pipeline: str) -> None:
    stage(config, task(pipeline, epoch=4, name="s0-t0"), [1])
    stage(config, task(pipeline, epoch=4, name="s0-t1"), [2])
    other = f"{pipeline}-other"
    stage(config, task(other, epoch=4), [3])
    try:
        committer = PostgresTwoPhaseCommitter(config)
        orphans = committer.orphans(pipeline)
        assert [(c.pipeline, c.epoch, c.task, c.attempt, c.sink) for c in orphans] == [
            (pipeline, 4, "s0-t0", "a1", "out"),
            (pipeline, 4, "s0-t1", "a1", "out"),
        ]
        committer.abort(orphans)
        assert committer.orphans(pipeline) == []
        assert len(committer.orphans(other)) == 1
    finally:
        PostgresTwoPhaseCommitter(config).abort(PostgresTwoPhaseCommitter(config).orphans(other))
    assert ids_in(config["dsn"]) == []


def test_attempts_of_one_task_stage_side_by_side_and_only_one_can_commit(
    config: dict[str, Any], pipeline: str
) -> None:
    first = stage(config, task(pipeline, attempt="a1"), [1])
    # A retry (or speculative copy) is not blocked by the prepared first attempt, whose process may be dead.
    second = stage(config, task(pipeline, attempt="a2"), [2])
    committer = PostgresTwoPhaseCommitter(config)
    committer.commit([first])
    committer.commit([first])  # idempotent
    with pytest.raises(ConflictingAttempt, match="attempt 'a1' of task s0-t0 is committed"):
        committer.commit([second])
    committer.abort([second])
    assert committer.orphans(pipeline) == []
    assert ids_in(config["dsn"]) == [1]
    with pytest.raises(ConflictingAttempt, match="this attempt"):
        PostgresTwoPhaseWriter(config).begin(task(pipeline, attempt="a1"))


def test_a_marker_table_keyed_per_task_is_widened_to_one_marker_per_attempt(
    config: dict[str, Any], pipeline: str
) -> None:
    import psycopg

    with psycopg.connect(config["dsn"], autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS onceflow_markers")
        conn.execute(
            "CREATE TABLE onceflow_markers (pipeline text NOT NULL, epoch bigint NOT NULL,"
            " sink text NOT NULL, task text NOT NULL, attempt text NOT NULL, record_count bigint NOT NULL,"
            " committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pipeline, epoch, sink, task))"
        )
    first = stage(config, task(pipeline, attempt="a1"), [1])
    second = stage(config, task(pipeline, attempt="a2"), [2])
    PostgresTwoPhaseCommitter(config).commit([second])
    PostgresTwoPhaseCommitter(config).abort([first])
    assert ids_in(config["dsn"]) == [2]


def test_a_row_with_an_unknown_column_fails_and_abort_discards_the_attempt(
    config: dict[str, Any], pipeline: str
) -> None:
    writer = PostgresTwoPhaseWriter(config)
    writer.begin(task(pipeline))
    with pytest.raises(RowError, match="colour"):
        writer.write([{"id": 1, "payload": "x", "colour": "red"}])
    writer.abort()
    assert PostgresTwoPhaseCommitter(config).orphans(pipeline) == []
    stage(config, task(pipeline, attempt="a2"), [5])  # the marker of the failed attempt is not left behind


_KILLED_WRITER = """
import json, sys
from onceflow.offsets import OffsetRange
from onceflow.sinks.base import TaskContext
from onceflow.sinks.postgres_2pc import PostgresTwoPhaseWriter
config, pipeline = json.loads(sys.argv[1]), sys.argv[2]
writer = PostgresTwoPhaseWriter(config)
writer.begin(TaskContext(pipeline, 7, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, 2),)))
writer.write([{"id": 1, "payload": "a"}, {"id": 2, "payload": "b"}])
print(writer.pre_commit().to_json(), flush=True)
sys.stdin.read()
"""


def test_a_writer_killed_after_prepare_leaves_a_transaction_the_coordinator_commits(
    config: dict[str, Any], pipeline: str
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, json.dumps(config), pipeline],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    committable = Committable.from_json(line)
    committer = PostgresTwoPhaseCommitter(config)
    assert [c.task for c in committer.orphans(pipeline)] == ["s0-t0"]
    assert ids_in(config["dsn"]) == []
    committer.commit([committable])
    assert ids_in(config["dsn"]) == [1, 2]
    assert committer.orphans(pipeline) == []
