"""Commit time against epoch size for each two-phase sink, without Spark.

One epoch of ``rows`` projected records is staged by 4 writers (one per input partition, as the engine's
read tasks would), then the sink's committer commits all 4 committables at once, as the coordinator does.
Only the commit is timed: it is the part of an epoch that runs after the decision, while the output of
the epoch is still invisible.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.dataset import PARTITIONS, amount_of
from bench.pipelines import PG_COLUMNS, TABLE_COLUMNS
from onceflow.config import Settings
from onceflow.offsets import OffsetRange
from onceflow.sinks import build_committer, build_writer
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.registry import sink_kind

SINK_KINDS = ("postgres_2pc", "files", "kafka", "delta")


def _rows(kind: str, task: int, count: int) -> Iterator[dict[str, Any]]:
    for i in range(task, task + count * PARTITIONS, PARTITIONS):
        row = {"id": i, "amount": amount_of(i), "customer": f"c{i % 5000:05d}"}
        if kind == "kafka":
            yield {"key": str(i), "value": json.dumps(row, separators=(",", ":"))}
        else:
            yield row


def _config(kind: str, name: str, workdir: Path, topic: str, settings: Settings) -> dict[str, Any]:
    """The sink's config as `SinkKind.config_for` makes it: the deployment's defaults, then its own."""
    if kind == "files":
        own: dict[str, Any] = {"root": str(workdir / "files"), "table": name}
    elif kind == "kafka":
        own = {"topic": topic, "staging_root": str(workdir / "kafka-staging")}
    elif kind == "delta":
        own = {"path": str(workdir / "delta" / name), "columns": TABLE_COLUMNS}
    else:
        own = {"table": name, "columns": PG_COLUMNS}
    return {**sink_kind(kind).defaults(settings), **own, "name": "out"}


def stage(kind: str, config: dict[str, Any], pipeline: str, rows: int, topic: str) -> list[Committable]:
    """Pre-commit one epoch of ``rows`` rows in PARTITIONS tasks; returns their committables.

    The tasks' inputs name partitions of ``topic`` (which must exist with PARTITIONS partitions): the Kafka
    sink commits them as its consumer-group marker in the publishing transaction.
    """
    per_task = rows // PARTITIONS
    committables = []
    for task in range(PARTITIONS):
        writer = build_writer(kind, config)
        inputs = (OffsetRange(topic, task, 0, per_task),)
        writer.begin(TaskContext(pipeline, 1, 0, f"s0-t{task}", "a0", "out", inputs))
        batch: list[dict[str, Any]] = []
        for row in _rows(kind, task, per_task):
            batch.append(row)
            if len(batch) == 5000:
                writer.write(batch)
                batch = []
        writer.write(batch)
        committables.append(writer.pre_commit())
    return committables


def commit_seconds(kind: str, rows: int, workdir: Path, settings: Settings, topic: str) -> float:
    """Stage then commit one epoch of ``rows`` rows in a fresh table/folder; returns the commit's seconds.

    ``topic`` (4 partitions) receives the Kafka sink's records and stands for the epoch's input.
    """
    return stage_and_commit_seconds(kind, rows, workdir, settings, topic)[1]


def stage_and_commit_seconds(
    kind: str, rows: int, workdir: Path, settings: Settings, topic: str
) -> tuple[float, float]:
    """(seconds to write and pre-commit an epoch through the sink's writers, seconds to commit it)."""
    name = f"bench_commit_{uuid.uuid4().hex[:8]}"
    config = _config(kind, name, workdir, topic, settings)
    started = time.perf_counter()
    committables = stage(kind, config, f"bench-commit-{uuid.uuid4().hex[:6]}", rows, topic)
    staged = time.perf_counter()
    build_committer(kind, config).commit(committables)
    committed = time.perf_counter()
    _cleanup(kind, name, workdir, settings.pg_dsn, committables[0].pipeline)
    return staged - started, committed - staged


def _cleanup(kind: str, name: str, workdir: Path, dsn: str, pipeline: str) -> None:
    if kind == "files":
        shutil.rmtree(workdir / "files" / name, ignore_errors=True)
    elif kind == "delta":
        shutil.rmtree(workdir / "delta" / name, ignore_errors=True)
    elif kind in ("postgres_2pc", "plain"):
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{name}"')
            conn.execute("DELETE FROM onceflow_markers WHERE pipeline = %s", [pipeline])
