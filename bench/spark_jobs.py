"""`python -m bench.spark_jobs`: what one epoch costs Spark itself, read from Spark's REST API.

Produces ``--records`` records, runs one epoch of the bench's files pipeline (decode, filter,
projection) on the warm runtime (``ONCEFLOW_SPARK_REMOTE``), then asks the Connect server's REST API
(``/api/v1/applications/<id>/jobs`` and ``/stages/<id>``) for the jobs its slices ran (each slice tags
its queries, `onceflow.engine.connect.slice_tag`): how many jobs, stages and tasks, and how many bytes
they shuffled. A slice in one pass is one job of one stage with no shuffle. Prints one JSON object;
writes only under a temporary folder (its ledger too) and to a topic of its own, both deleted afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench import pipelines
from bench.dataset import NESTED_SCHEMA, delete_topics, nested_record, produce, record
from bench.pipelines import NESTED_TRANSFORM, SPEC_ENV, SPEC_PATH, bench_pipeline
from onceflow.pipeline import JsonFormat


def rest(ui: str, path: str) -> Any:
    """One answer of Spark's REST API (``ui`` is the application's web UI, e.g. http://host:4040)."""
    with urllib.request.urlopen(f"{ui.rstrip('/')}/api/v1/{path}", timeout=30) as answer:
        return json.load(answer)


def tagged_jobs(ui: str, tag: str) -> tuple[str, list[dict[str, Any]]]:
    """The application's id and its jobs whose tags contain ``tag`` (Spark Connect prefixes a client's
    tags with its session's)."""
    app = rest(ui, "applications")[0]["id"]
    jobs = rest(ui, f"applications/{app}/jobs")
    return app, [j for j in jobs if any(tag in t for t in j.get("jobTags", ()))]


def job_costs(ui: str, app: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Jobs, the stages they ran (skipped ones apart), tasks, and shuffle bytes read and written."""
    stages = tasks = shuffle_read = shuffle_write = skipped = 0
    for stage_id in sorted({s for job in jobs for s in job["stageIds"]}):
        for attempt in rest(ui, f"applications/{app}/stages/{stage_id}"):
            if attempt["status"] == "SKIPPED":
                skipped += 1
                continue
            stages += 1
            tasks += int(attempt["numTasks"])
            shuffle_read += int(attempt["shuffleReadBytes"])
            shuffle_write += int(attempt["shuffleWriteBytes"])
    return {
        "jobs": len(jobs),
        "stages": stages,
        "skipped_stages": skipped,
        "tasks": tasks,
        "shuffle_read_bytes": shuffle_read,
        "shuffle_write_bytes": shuffle_write,
        "job_seconds": [
            round(_seconds(j["completionTime"]) - _seconds(j["submissionTime"]), 2)
            for j in sorted(jobs, key=lambda j: j["jobId"])
            if j.get("completionTime")
        ],
    }


def _seconds(stamp: str) -> float:
    """Seconds since the epoch of a REST API time such as ``2026-11-25T15:04:05.123GMT``."""
    from datetime import UTC, datetime

    parsed = datetime.strptime(stamp.removesuffix("GMT"), "%Y-%m-%dT%H:%M:%S.%f")
    return parsed.replace(tzinfo=UTC).timestamp()


# CPU seconds so far by role, then by process: {role: {pid: seconds}}. An executor's reaped children
# (Python workers that exited) sit under the executor's pid negated.
CpuTimes = dict[str, dict[int, float]]


def cpu_seconds_by_role() -> CpuTimes:
    """CPU seconds (user + system) so far of each process that can work on an epoch, by role: the
    Connect server, the executors' JVMs (on a lean runtime the server alone, counted once, as an
    executor), their Python workers, the Kafka broker(s), PostgreSQL and this process (the slice's
    driver). Each process counts its own seconds and its reaped children's (an executor's go to its
    Python workers, under its pid negated), so a worker that exits moves its seconds to its daemon, and
    a daemon to its executor, without being counted twice."""
    import psutil
    from local_stack.spark_runtime import SparkRuntime

    runtime = SparkRuntime.from_env()
    executors = runtime.executor_pids()
    roles: dict[str, list[psutil.Process]] = {"driver": [psutil.Process()]}
    server = runtime.pid("connect")
    if server is not None and server not in executors:
        with contextlib.suppress(psutil.Error):
            roles["connect server"] = [psutil.Process(server)]
    seconds: CpuTimes = {}
    for pid in executors:
        with contextlib.suppress(psutil.Error):
            executor = psutil.Process(pid)
            roles.setdefault("executor JVMs", []).append(executor)
            roles.setdefault("executor Python workers", []).extend(executor.children(recursive=True))
            times = executor.cpu_times()
            reaped = seconds.setdefault("executor Python workers", {})
            reaped[-pid] = times.children_user + times.children_system
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if "kafka.Kafka" in cmdline:
            roles.setdefault("Kafka broker", []).append(proc)
        elif proc.info["name"] == "postgres":
            roles.setdefault("PostgreSQL", []).append(proc)
    for role, procs in roles.items():
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                spent = times.user + times.system
                if role != "executor JVMs":  # theirs are the Python role's, under the executor's -pid
                    spent += times.children_user + times.children_system
                seconds.setdefault(role, {})[proc.pid] = spent
    return seconds


def cpu_spent(before: CpuTimes, after: CpuTimes) -> dict[str, float]:
    """Each role's CPU seconds between two looks: its total after minus its total before. A process
    that exited in between has its seconds in its parent's reaped children's (each process above counts
    its own and its reaped children's), so the totals hold them once; one new since the first look
    counts from zero."""
    return {
        role: round(max(0.0, sum(pids.values()) - sum(before.get(role, {}).values())), 2)
        for role, pids in after.items()
    }


def default_ui() -> str:
    """The Connect server's web UI, as the local stack starts it."""
    host = os.environ.get("ONCEFLOW_SPARK_HOST", "127.0.0.1")
    return f"http://{host}:{os.environ.get('ONCEFLOW_SPARK_UI_PORT') or 14040}"


def measure(records: int, ui: str, *, nested: bool = False) -> dict[str, Any]:
    """One epoch of ``records`` on the warm runtime and what it cost Spark: jobs, stages, tasks, shuffle.
    ``nested``: the nested step's orders and pipeline instead of the flat data set's."""
    from onceflow.config import Settings
    from onceflow.engine.connect import slice_tag
    from onceflow.engine.runner import run_epoch
    from onceflow.ledger import Ledger

    workdir = Path(tempfile.mkdtemp(prefix="onceflow-bench-jobs-"))
    settings = Settings.from_env({**os.environ, "ONCEFLOW_LEDGER_URL": f"sqlite:///{workdir / 'ledger.db'}"})
    with Ledger.connect(settings.ledger_url, check=False) as ledger:  # a ledger of its own
        ledger.upgrade()
    value, fmt, transform = (
        (nested_record, JsonFormat(schema=NESTED_SCHEMA), NESTED_TRANSFORM)
        if nested
        else (record, None, None)
    )
    dataset = produce(settings.kafka_bootstrap, records, prefix="bench-jobs", value=value)
    name = f"bench-jobs-{uuid.uuid4().hex[:8]}"
    spec = bench_pipeline(
        "files", name, dataset.topic, workdir, batch_per_partition=records, fmt=fmt, transform=transform
    )
    os.environ[SPEC_ENV] = spec.to_json()
    importlib.reload(pipelines)  # its SPEC is read from the environment at import
    try:
        cpu_before = cpu_seconds_by_role()
        started = time.perf_counter()
        outcome = run_epoch(SPEC_PATH, settings, executor="connect")
        seconds = time.perf_counter() - started
        cpu_after = cpu_seconds_by_role()
        tag = slice_tag(spec.name, outcome.epoch.number, 0, outcome.epoch.attempt_token).rsplit("-s0-", 1)[0]
        app, jobs = tagged_jobs(ui, tag)
        return {
            "records": records,
            "slices": len(outcome.planned.slices_with_tasks),
            "epoch_seconds": round(seconds, 2),
            **job_costs(ui, app, jobs),
            "cpu_seconds": cpu_spent(cpu_before, cpu_after),  # where the machine's CPU went
        }
    finally:
        delete_topics(settings.kafka_bootstrap, [dataset.topic])
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--ui", default=default_ui(), help="the Connect server's web UI")
    parser.add_argument("--nested", action="store_true", help="the nested step's orders and pipeline")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.records, args.ui, nested=args.nested)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
