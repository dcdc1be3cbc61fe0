"""postgres_changes on the real PostgreSQL: every task of an epoch holds changes of the same key, all
prepared at once without waiting on each other; the commit applies the last change of each key in
source order, deletes and a truncate included, all at once and only once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from onceflow.sinks.base import Committable
from onceflow.sinks.postgres_2pc import GID_PREFIX
from onceflow.sinks.postgres_changes import PostgresChangesCommitter, PostgresChangesWriter
from tests.integration.sink_helpers import write_task

pytestmark = pytest.mark.integration


@pytest.fixture
def pipeline() -> str:
    return f"pchg-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def config(pg_database: str, pipeline: str) -> Iterator[dict[str, Any]]:
    yield {
        "dsn": pg_database,
        "table": "mirror",
        "columns": {"id": "bigint", "name": "text", "qty": "bigint"},
        "key_columns": ["id"],
        "name": "db",
    }
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", [f"{GID_PREFIX}{pipeline}:"]
        ).fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")


def change(
    op: str, offset: int, id_: int | None, name: str | None = None, qty: int | None = None
) -> dict[str, Any]:
    return {"id": id_, "name": name, "qty": qty, "_op": op, "_partition": 0, "_offset": offset}


def _stage(
    config: dict[str, Any], pipeline: str, epoch: int, tasks: list[list[dict[str, Any]]]
) -> list[Committable]:
    """Every task's writer begun and prepared before any commits: they hold their transactions at once."""
    writers = [
        write_task(PostgresChangesWriter(config), pipeline, epoch, n, rows, sink="db")
        for n, rows in enumerate(tasks)
    ]
    return [w.pre_commit() for w in writers]


def _mirror(dsn: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: r[1:] for r in conn.execute("SELECT id, name, qty FROM mirror").fetchall()}


def test_one_key_changed_in_every_task_is_applied_once_in_source_order(config, pipeline, pg_database) -> None:  # type: ignore[no-untyped-def]
    tasks = [
        [change("r", 0, 1, "a", 1), change("r", 1, 2, "b", 2), change("c", 2, 3, "c", 3)],
        [change("u", 3, 1, "a", 10), change("d", 4, 2), change("u", 5, 3, "c", 30)],
        [change("u", 6, 1, "a", 100), change("c", 7, 2, "b again", 20), change("d", 8, 3), change("d", 9, 3)],
    ]
    committables = _stage(config, pipeline, 1, tasks)
    assert _mirror(pg_database) == {}  # staged, prepared: nothing in the target yet
    committer = PostgresChangesCommitter(config)
    committer.commit(committables)
    want = {1: ("a", 100), 2: ("b again", 20)}
    assert _mirror(pg_database) == want
    committer.commit(committables)  # a repeated commit (recovery) applies nothing twice
    assert _mirror(pg_database) == want
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT count(*) FROM mirror_onceflow_changes").fetchone() == (0,)
    # The next epoch: a truncate empties the table before the changes after it in its partition.
    after = _stage(
        config,
        pipeline,
        2,
        [
            [change("u", 10, 1, "a", 101), change("t", 11, None)],
            [change("c", 12, 5, "e", 5), change("u", 13, 5, "e", 6)],
        ],
    )
    committer.commit(after)
    assert _mirror(pg_database) == {5: ("e", 6)}


def test_an_aborted_epoch_leaves_the_target_and_staging_as_they_were(config, pipeline, pg_database) -> None:  # type: ignore[no-untyped-def]
    committer = PostgresChangesCommitter(config)
    committer.commit(_stage(config, pipeline, 1, [[change("c", 0, 1, "a", 1)]]))
    staged = _stage(config, pipeline, 2, [[change("d", 1, 1)], [change("c", 2, 2, "b", 2)]])
    assert {c.task for c in committer.orphans(pipeline)} == {"s0-t0", "s0-t1"}
    committer.abort(staged)
    assert committer.orphans(pipeline) == []
    assert _mirror(pg_database) == {1: ("a", 1)}
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT count(*) FROM mirror_onceflow_changes").fetchone() == (0,)
