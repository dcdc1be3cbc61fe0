"""The warm runtime's memory over many distinct pipelines: whether it stays flat.

Every distinct pipeline joins a Spark Connect session of its own, and in Spark 4.1 each session that runs
Python gets a Python worker factory of its own on every executor (SPARK-54055). So the step runs N
distinct pipelines, E small epochs in all, one pipeline after another as a scheduler would, and samples
the proportional set size of every runtime process (`local_stack.footprint`) in the background: the
runtime at rest before the first epoch, its peak, what it holds at rest after the last (once the
executors' idle Python workers have had time to go), by kind, and whether the second half of the run
peaked above its first half as the soak judges it. Memory alone cannot see a JVM heap that fills to its
cap, so flat also asks that the later pipelines run as fast as the earlier ones and that the JVMs spend
little of the run collecting garbage.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from local_stack.footprint import FLAT_FACTOR, FLAT_MARGINS, Collector, collector, footprint, halves_growth
from local_stack.spark_runtime import SparkRuntime

from bench import sinks_check
from bench.dataset import PARTITIONS, delete_topics, produce
from bench.epochs import run_to_end
from bench.pipelines import bench_pipeline
from onceflow.config import Settings

TARGET_MB = 1536.0  # the 1.5 GB for the whole runtime
INTERVAL_S = 2.0
# Spark closes idle forked workers after a minute; the runtime's daemons go 30 s later (checked every 10 s).
SETTLE_S = 120.0
# A tenth of the second half (its median pipeline, `pace`) may take FLAT_FACTOR times the first half's
# slowest tenth plus this.
PACE_MARGIN_S = 2.0
# The share of the run's wall time the JVMs may spend collecting garbage: a heap at its cap spends more.
GC_SHARE_LIMIT = 0.10


@dataclass
class Point:
    """One sample of the runtime, with how far the run was."""

    seconds: float
    pipelines: int
    epochs: int
    total_mb: float
    jvm_mb: float
    python_mb: float
    python_processes: int
    python_daemons: int
    sessions: int
    pss_mb: dict[str, float]


@dataclass
class Sampler:
    """Samples the runtime every ``interval_s`` in a thread while the pipelines run."""

    runtime: SparkRuntime
    interval_s: float = INTERVAL_S
    points: list[Point] = field(default_factory=list)
    pipelines: int = 0
    epochs: int = 0
    _started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> Point:
        now = footprint(self.runtime)
        point = Point(
            round(time.monotonic() - self._started, 1),
            self.pipelines,
            self.epochs,
            now.total_mb,
            now.jvm_mb,
            now.pss_mb.get("python", 0.0),
            now.python_processes,
            now.python_daemons,
            now.sessions,
            now.pss_mb,
        )
        self.points.append(point)
        return point

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="runtime-pss", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


def epochs_per_pipeline(pipelines: int, epochs: int) -> list[int]:
    """``epochs`` spread over ``pipelines`` as evenly as they go, every pipeline at least one."""
    base, extra = divmod(max(epochs, pipelines), pipelines)
    return [base + (1 if i < extra else 0) for i in range(pipelines)]


def verdict(points: list[Point], pipeline_s: list[float]) -> dict[str, Any]:
    """Flat or not, by the soak's rule, over the samples taken while pipelines ran (the rest before and
    after is the run's start and end, not its course), and over each pipeline's wall time."""
    running = [p for p in points if p.epochs > 0]
    out: dict[str, Any] = {"flat": True}
    for name, values, margin in (
        ("total_mb", [p.total_mb for p in running], FLAT_MARGINS["total_mb"]),
        ("python_processes", [float(p.python_processes) for p in running], FLAT_MARGINS["python_processes"]),
        ("pace_s", pace(pipeline_s), PACE_MARGIN_S),
    ):
        growth = halves_growth(values, FLAT_FACTOR, margin)
        if growth is None:
            out["flat"] = None
            continue
        out[name] = asdict(growth) | {"flat": growth.flat}
        out["flat"] = out["flat"] and growth.flat
    return out


def pace(pipeline_s: list[float], windows: int = 10) -> list[float]:
    """Each tenth of the run's pipelines by its median wall time: one slow pipeline (a worker started
    again, a Kafka rebalance) is noise, a run that slows down throughout is not."""
    size = max(1, len(pipeline_s) // windows)
    return [median(pipeline_s[i : i + size]) for i in range(0, len(pipeline_s), size)]


def collecting(before: Collector | None, after: Collector | None, wall_s: float) -> dict[str, Any] | None:
    """What the JVMs' collectors did during the run, and whether it stayed within GC_SHARE_LIMIT of the
    wall time; None when either probe could not tell."""
    if before is None or after is None or wall_s <= 0:
        return None
    spent = round(after.gc_s - before.gc_s, 1)
    return {
        "gc_s": spent,
        "share": round(spent / wall_s, 3),
        "full_gcs": after.full_gcs - before.full_gcs,
        "old_used_after": round(after.old_used, 3),
        "old_capacity_mb": after.old_capacity_mb,
        "limit": GC_SHARE_LIMIT,
        "flat": spent / wall_s <= GC_SHARE_LIMIT,
    }


def kinds(point: Point) -> dict[str, Any]:
    """A sample by kind of process: the JVMs and the Python processes, with their counts."""
    return {
        "total_mb": point.total_mb,
        "jvm_mb": point.jvm_mb,
        "python_mb": point.python_mb,
        "python_processes": point.python_processes,
        "python_daemons": point.python_daemons,
        "sessions": point.sessions,
        "pss_mb": point.pss_mb,
    }


def summary(
    points: list[Point], settle_s: float, pipeline_s: list[float], gc: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The run at rest before, at its peak and at rest after, with the verdict: flat only when memory,
    Python processes and pace stay flat and, where the collectors could be read, GC stayed in bounds."""
    start, end = points[0], points[-1]
    peak = max(points, key=lambda p: p.total_mb)
    judged = verdict(points, pipeline_s)
    if gc is not None and judged["flat"] is not None:
        judged["flat"] = judged["flat"] and gc["flat"]
    return {
        "start": kinds(start),
        "peak": kinds(peak) | {"pipelines": peak.pipelines, "epochs": peak.epochs},
        "end": kinds(end) | {"settled_s": settle_s},
        "target_mb": TARGET_MB,
        "peak_within_target": peak.total_mb <= TARGET_MB,
        **judged,
        "gc": gc,
    }


def measure(
    settings: Settings,
    workdir: Path,
    remote: str,
    *,
    pipelines: int = 100,
    epochs: int = 1000,
    batch_per_partition: int = 25,
    interval_s: float = INTERVAL_S,
    settle_s: float = SETTLE_S,
    say: Any = print,
) -> dict[str, Any]:
    """Run ``pipelines`` distinct files pipelines, ``epochs`` epochs of ``batch_per_partition`` ×
    partitions records in all, on ``remote``; the runtime's footprint over the run."""
    runtime = SparkRuntime.from_env()
    plan = epochs_per_pipeline(pipelines, epochs)
    batch = batch_per_partition * PARTITIONS
    data = produce(settings.kafka_bootstrap, max(plan) * batch, "bench-runtime-memory")
    sampler = Sampler(runtime, interval_s)
    sampler.sample()  # at rest, before the first epoch
    run_id = uuid.uuid4().hex[:6]
    epoch_s: list[float] = []
    first_epoch_s: list[float] = []
    pipeline_s: list[float] = []
    collected = collector(runtime.pids())
    started = time.monotonic()
    sampler.start()
    try:
        for number, count in enumerate(plan):
            name = f"bench-mem-{run_id}-{number:03d}"
            spec = bench_pipeline("files", name, data.topic, workdir, batch_per_partition=batch_per_partition)
            begun = time.monotonic()
            try:
                run = run_to_end(spec, settings, count * batch, remote)
            finally:
                sinks_check.drop_output(spec, settings)
            pipeline_s.append(round(time.monotonic() - begun, 2))
            sampler.pipelines += 1
            sampler.epochs += len(run.epochs)
            first_epoch_s.append(run.epochs[0].total_s)
            epoch_s += [e.total_s for e in run.epochs[1:]]
            if (number + 1) % max(1, pipelines // 10) == 0:
                now = sampler.sample()
                say(
                    f"runtime memory: {number + 1} pipelines, {sampler.epochs} epochs: "
                    f"{now.total_mb:.0f} MB, {now.python_processes} Python processes, "
                    f"{now.sessions} sessions, {time.monotonic() - started:.0f} s"
                )
    finally:
        sampler.stop()
        delete_topics(settings.kafka_bootstrap, [data.topic])
    wall_s = time.monotonic() - started
    gc = collecting(collected, collector(runtime.pids()), wall_s)
    time.sleep(settle_s)
    sampler.sample()  # at rest again
    return {
        "pipelines": pipelines,
        "epochs": sampler.epochs,
        "records_per_epoch": batch,
        "wall_s": round(wall_s, 1),
        "interval_s": interval_s,
        "first_epoch_median_s": round(median(first_epoch_s), 2),
        "later_epoch_median_s": round(median(epoch_s), 2) if epoch_s else None,
        **summary(sampler.points, settle_s, pipeline_s, gc),
        "pipeline_s": pipeline_s,
        "samples": [asdict(p) for p in sampler.points],
    }
