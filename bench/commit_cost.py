"""Commit time against epoch size for each two-phase sink, without Spark.

One epoch of ``rows`` projected records is staged by 4 writers (one per input partition, as the engine's
read tasks would), then the sink's committer commits all 4 committables at once, as the coordinator does.
Only the commit is timed: it is the part of an epoch that runs after the decision, while the output of
the epoch is still invisible. The kind ``files_s3`` is the files sink with its root in the stack's bucket
(`bench.pipelines.s3_root`).
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
from bench.pipelines import PG_COLUMNS, SINKS, TABLE_COLUMNS, s3_root
from onceflow.config import Settings
from onceflow.offsets import OffsetRange
from onceflow.pipeline import SinkSpec
from onceflow.sinks import build_committer, build_writer
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.registry import sink_kind

SINK_KINDS = ("postgres_2pc", "files", "kafka", "delta")
# Measured on request (the s3 step): kinds whose output is in a bucket, by the sink kind they are.
BUCKET_KINDS = ("files_s3",)


def _rows(kind: str, task: int, count: int) -> Iterator[dict[str, Any]]:
    for i in range(task, task + count * PARTITIONS, PARTITIONS):
        row = {"id": i, "amount": amount_of(i), "customer": f"c{i % 5000:05d}"}
        if kind == "kafka":
            yield {"key": str(i), "value": json.dumps(row, separators=(",", ":"))}
        else:
            yield row


def _config(kind: str, name: str, workdir: Path, topic: str, settings: Settings) -> dict[str, Any]:
    """The sink's config as the engine makes it (`SinkKind.config_for`: the deployment's defaults, then
    its own, and the object store's settings for a path in a bucket)."""
    if kind == "files_s3":
        # A prefix of the epoch's own: the table and the staging beside it go with it (`_cleanup`).
        own: dict[str, Any] = {"root": f"{s3_root(workdir)}/commit-{name}", "table": name}
    elif kind == "files":
        own = {"root": str(workdir / "files"), "table": name}
    elif kind == "kafka":
        own = {"topic": topic, "staging_root": str(workdir / "kafka-staging")}
    elif kind == "delta":
        own = {"path": str(workdir / "delta" / name), "columns": TABLE_COLUMNS}
    else:
        own = {"table": name, "columns": PG_COLUMNS}
    return sink_kind(_sink_kind(kind)).config_for(SinkSpec("out", _sink_kind(kind), own), settings)


def _sink_kind(kind: str) -> str:
    """The sink kind a measured kind is (``files_s3`` is ``files``)."""
    return SINKS[kind][1] if kind in BUCKET_KINDS else kind


def stage(kind: str, config: dict[str, Any], pipeline: str, rows: int, topic: str) -> list[Committable]:
    """Pre-commit one epoch of ``rows`` rows in PARTITIONS tasks; returns their committables.

    The tasks' inputs name partitions of ``topic`` (which must exist with PARTITIONS partitions): the Kafka
    sink commits them as its consumer-group marker in the publishing transaction.
    """
    per_task = rows // PARTITIONS
    committables = []
    for task in range(PARTITIONS):
        writer = build_writer(_sink_kind(kind), config)
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
    build_committer(_sink_kind(kind), config).commit(committables)
    committed = time.perf_counter()
    _cleanup(kind, name, workdir, settings, committables[0].pipeline, config)
    return staged - started, committed - staged


def _cleanup(
    kind: str, name: str, workdir: Path, settings: Settings, pipeline: str, config: dict[str, Any]
) -> None:
    dsn = settings.pg_dsn
    if kind == "files_s3":
        from bench.sinks_check import delete_location

        delete_location(config["root"], settings)
    elif kind == "files":
        shutil.rmtree(workdir / "files" / name, ignore_errors=True)
    elif kind == "delta":
        shutil.rmtree(workdir / "delta" / name, ignore_errors=True)
    elif kind in ("postgres_2pc", "plain"):
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{name}"')
            conn.execute("DELETE FROM onceflow_markers WHERE pipeline = %s", [pipeline])
