"""What the tests of table sinks share: staging an epoch's tasks as the engine's tasks would, each
through its own writer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from onceflow.sinks.base import BatchSinkWriter, Committable, SinkCommitter, TaskContext

Rows = list[dict[str, Any]]


def write_task(
    writer: BatchSinkWriter,
    pipeline: str,
    epoch: int,
    n: int,
    rows: Rows,
    *,
    sink: str = "lake",
    attempt: str = "a0",
    row_by_row: bool = False,
) -> BatchSinkWriter:
    """Task ``s0-t{n}`` of slice 0 begun and its rows written, not yet pre-committed. Odd tasks write one
    Arrow batch (a Spark task's path), even ones rows (one call a row with ``row_by_row``)."""
    writer.begin(TaskContext(pipeline, epoch, 0, f"s0-t{n}", attempt, sink))
    if n % 2:
        writer.write_batch(pa.RecordBatch.from_pylist(rows))
    elif row_by_row:
        for row in rows:
            writer.write([row])
    else:
        writer.write(rows)
    return writer


def stage_tasks(
    make_writer: Callable[[int], BatchSinkWriter],
    pipeline: str,
    epoch: int,
    tasks: list[Rows],
    *,
    sink: str = "lake",
    attempt: str = "a0",
    row_by_row: bool = False,
) -> list[Committable]:
    """Each task's writer (``make_writer(n)``) begun, written and pre-committed, one after another."""
    return [
        write_task(
            make_writer(n), pipeline, epoch, n, rows, sink=sink, attempt=attempt, row_by_row=row_by_row
        ).pre_commit()
        for n, rows in enumerate(tasks)
    ]


def orders_config(**where: Any) -> dict[str, Any]:
    """A sink ``lake`` of orders partitioned by region; ``where`` says where its table is."""
    return {
        "columns": {"id": "long", "region": "string", "qty": "long"},
        "partition_by": {"region": "identity"},
        "name": "lake",
        **where,
    }


def order_rows(n: int, start: int = 0) -> Rows:
    """``n`` orders from id ``start`` on, in both regions (``us`` every third id)."""
    return [{"id": i, "region": "eu" if i % 3 else "us", "qty": i * 10} for i in range(start, start + n)]


def sweep_dead_attempt(
    committer: SinkCommitter, writer: BatchSinkWriter, pipeline: str, left: Callable[[], list[str]]
) -> None:
    """A dead attempt of epoch 3 (its marker and a file written, never pre-committed) is what the
    sweeper finds, and its abort takes every object of it: ``left()`` lists what it staged."""
    writer.begin(TaskContext(pipeline, 3, 0, "s0-t0", "dead", "lake"))
    writer.write(order_rows(2, 30))
    assert left()
    orphans = committer.orphans(pipeline)
    assert [(c.epoch, c.attempt, c.handle.get("incomplete")) for c in orphans] == [(3, "dead", True)]
    committer.abort(orphans)
    assert committer.orphans(pipeline) == [] and left() == []
