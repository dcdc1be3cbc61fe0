"""`python -m bench.airflow_route`: an epoch through a real Airflow scheduler, DAG run queued → committed.

Starts Airflow 3's api-server, scheduler and DAG processor on a fresh home (defaults otherwise: the
LocalExecutor, its metadata in SQLite), with one DAG (`onceflow_airflow.dag_factory.build_dag`) of the
bench's files pipeline whose process task sends its slice to the warm runtime. For each of ``epochs``
batches of ``per_batch`` records: produce, trigger a run (`airflow dags trigger`), wait until it
succeeds, and read from Airflow's own metadata when the run was queued and when each task was queued,
started and ended. Queued → committed is the run's ``queued_at`` to the end of its ``commit`` task. The
first run opens the pipeline's session on the runtime and is left out of the medians.

It also times what every task process pays before its step runs: a fresh interpreter importing the DAG
file (Airflow's task runner parses it again in each task).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.dataset import create_topic, delete_topics
from bench.follow_latency import produce_batch
from onceflow.config import Settings

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("recover", "plan", "process_s0", "commit", "report")


def _when(stamp: str) -> float:
    """Seconds since the epoch of a timestamp as Airflow's SQLite metadata keeps it (UTC)."""
    parsed = datetime.fromisoformat(stamp)
    if parsed.tzinfo is None:
        from datetime import UTC

        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _run_timings(db_path: Path, dag_id: str, run_id: str) -> dict[str, Any] | None:
    """The run's queue time and each task's queued/start/end, once the run succeeded; None before."""
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        run = db.execute(
            "SELECT state, queued_at, start_date, end_date FROM dag_run WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        ).fetchone()
        if run is None or run[0] in ("queued", "running"):
            return None
        tasks = db.execute(
            "SELECT task_id, state, queued_dttm, start_date, end_date FROM task_instance "
            "WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        ).fetchall()
    queued = _when(run[1])

    def after(stamp: str | None) -> float | None:
        """Seconds after the run was queued; None for a step that never happened (a skipped task)."""
        return round(_when(stamp) - queued, 3) if stamp else None

    return {
        "state": run[0],
        "run_started_s": after(run[2]),
        "run_ended_s": after(run[3]),
        "tasks": {
            task: {"state": state, "queued_s": after(q), "started_s": after(s), "ended_s": after(e)}
            for task, state, q, s, e in tasks
        },
    }


def dag_parse_seconds(dag_file: Path, env: dict[str, str], times: int = 3) -> list[float]:
    """A fresh interpreter importing the DAG file, as each task process does before its step (with the
    plugins folder on its path, as Airflow puts it)."""
    code = f"import runpy, time; t = time.perf_counter(); runpy.run_path({str(dag_file)!r}); " + (
        "print(time.perf_counter() - t)"
    )
    path = os.pathsep.join((env["AIRFLOW__CORE__PLUGINS_FOLDER"], env.get("PYTHONPATH", "")))
    seconds = []
    for _ in range(times):
        parsed = subprocess.run(
            [sys.executable, "-c", code], env={**env, "PYTHONPATH": path}, capture_output=True, text=True
        )
        if parsed.returncode != 0:
            raise RuntimeError(f"parsing {dag_file} failed: {parsed.stderr.strip()[-2000:]}")
        seconds.append(round(float(parsed.stdout.split()[-1]), 3))
    return seconds


def _wait_for_dag(db_path: Path, dag_id: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(db_path)) as db:
            if db.execute("SELECT 1 FROM dag WHERE dag_id = ?", (dag_id,)).fetchone():
                return
        time.sleep(1)
    raise RuntimeError(f"the DAG processor did not register {dag_id} in time")


def measure(settings: Settings, workdir: Path, *, epochs: int = 6, per_batch: int = 1000) -> dict[str, Any]:
    """Queued → committed and per-task timings of ``epochs`` runs (after one that opens the session)."""
    from local_stack.local_airflow import airflow_environment, migrate, start_servers, stop_process_groups
    from local_stack.ports import free_port

    if settings.spark_remote is None:
        raise SystemExit("bench.airflow_route: set ONCEFLOW_SPARK_REMOTE (the warm runtime) first")
    uid = uuid.uuid4().hex[:8]
    name, module, dag_id = f"bench-route-{uid}", f"bench_route_{uid}", f"onceflow_bench_route_{uid}"
    topic = create_topic(settings.kafka_bootstrap, "bench-route")
    (workdir / f"{module}.py").write_text(
        "from pathlib import Path\n\nfrom bench.pipelines import bench_pipeline\n\n"
        f"SPEC = bench_pipeline('files', {name!r}, {topic!r}, Path({str(workdir)!r}), "
        "batch_per_partition=100_000)\n"
    )
    dags = workdir / "dags"
    dags.mkdir(exist_ok=True)
    dag_file = dags / f"{dag_id}.py"
    dag_file.write_text(
        "from onceflow_airflow.dag_factory import build_dag\n\n"
        f"dag = build_dag({module + ':SPEC'!r}, dag_id={dag_id!r})\n"
    )
    home = workdir / "airflow"
    port = free_port()
    env = airflow_environment(settings, ROOT, home, os.environ)
    env.update(
        {
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "PYTHONPATH": os.pathsep.join((str(workdir), env["PYTHONPATH"])),
            "ONCEFLOW_LEDGER_URL": settings.ledger_url,
        }
    )
    migrate(env)
    procs = start_servers(env, home, (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"]))
    db_path = home / "airflow.db"
    runs: list[dict[str, Any]] = []
    try:
        _wait_for_dag(db_path, dag_id, time.monotonic() + 180)
        parse = dag_parse_seconds(dag_file, env)
        for n in range(epochs + 1):
            produce_batch(settings.kafka_bootstrap, topic, n * per_batch, per_batch)
            run_id = f"bench_{uid}_{n}"
            subprocess.run(
                [str(Path(sys.executable).parent / "airflow"), "dags", "trigger", dag_id, "--run-id", run_id],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
            deadline = time.monotonic() + 300
            while (timings := _run_timings(db_path, dag_id, run_id)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"run {run_id} did not end in 300 s; see {home}/scheduler.log")
                time.sleep(0.5)
            if timings["state"] != "success":
                raise RuntimeError(f"run {run_id} ended {timings['state']}: {timings['tasks']}")
            runs.append(timings)
            committed_s = timings["tasks"]["commit"]["ended_s"]
            print(
                f"[onceflow bench] airflow route run {n}: committed {committed_s} s after queued",
                file=sys.stderr,
            )
    finally:
        stop_process_groups(procs)
        delete_topics(settings.kafka_bootstrap, [topic])
    later = runs[1:]
    committed = [r["tasks"]["commit"]["ended_s"] for r in later]
    per_task: dict[str, dict[str, float]] = {}
    previous_end = [0.0] * len(later)
    for task in TASKS:
        waits = [r["tasks"][task]["started_s"] - prev for r, prev in zip(later, previous_end, strict=True)]
        spans = [r["tasks"][task]["ended_s"] - r["tasks"][task]["started_s"] for r in later]
        per_task[task] = {
            "wait_median_s": round(statistics.median(waits), 3),
            "run_median_s": round(statistics.median(spans), 3),
        }
        previous_end = [r["tasks"][task]["ended_s"] for r in later]
    return {
        "records_per_run": per_batch,
        "runs": len(later),
        "queued_to_committed_s": committed,
        "queued_to_committed_median_s": round(statistics.median(committed), 3),
        "per_task": per_task,
        "dag_parse_s": parse,
        "executor": "LocalExecutor (Airflow's default), SQLite metadata",
        "all": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-bench-route-"))
    try:
        settings = Settings.from_env(
            {**os.environ, "ONCEFLOW_LEDGER_URL": f"sqlite:///{workdir / 'ledger.db'}"}
        )
        from onceflow.ledger import Ledger

        with Ledger.connect(settings.ledger_url, check=False) as ledger:
            ledger.upgrade()
        out = measure(settings, workdir, epochs=args.epochs, per_batch=args.records)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({k: v for k, v in out.items() if k != "all"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
