"""`airflow backfill create` over past hourly intervals of the orders DAG, with a real scheduler.

Each interval's records carry timestamps inside it, so each backfill run's epoch must read exactly its
interval (bounded by the offsets at the interval's end), the runs must go in order, and re-running an
interval (reprocess behaviour ``completed``) must change nothing and say so in the task log.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from examples.orders.data import make_orders, produce
from local_stack.local_airflow import migrate, start_servers, stop_process_groups
from local_stack.ports import free_port

from onceflow.ledger import EpochStatus, Ledger
from tests.integration.airflow.helpers import airflow

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG = "onceflow_orders"
HOUR = timedelta(hours=1)


@pytest.fixture
def scheduler_env(orders_stack, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A fresh Airflow home with a running api-server and scheduler (the backfill's executor)."""
    port = free_port()
    env = {
        **orders_stack.env,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
    }
    migrate(env)
    airflow(["dags", "reserialize"], env)
    # Unpaused (a paused DAG's backfill runs stay queued), but with no scheduled run of its own: with
    # catchup off, unpausing would schedule the latest interval, which would read the backfilled data
    # first. Nothing recomputes the next run here, since no DAG processor runs.
    with contextlib.closing(sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")) as db:
        db.execute("UPDATE dag SET is_paused = 0, next_dagrun_create_after = NULL WHERE dag_id = ?", (DAG,))
        db.commit()
    logs = tmp_path / "airflow"
    procs = start_servers(env, logs, (["api-server", "--port", str(port)], ["scheduler"]))
    try:
        yield env
    finally:
        stop_process_groups(procs)


def _runs(env: dict[str, str]) -> tuple[dict[str, str], int]:
    """Run states, and how many backfills the scheduler has not marked completed yet."""
    with contextlib.closing(sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")) as db:
        runs = dict(db.execute("SELECT run_id, state FROM dag_run WHERE dag_id = ?", (DAG,)).fetchall())
        open_backfills = db.execute("SELECT count(*) FROM backfill WHERE completed_at IS NULL").fetchone()[0]
    return runs, int(open_backfills)


def _wait_for_runs(env: dict[str, str], count: int, timeout: float = 600) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs, open_backfills = _runs(env)
        done = all(state in ("success", "failed") for state in runs.values())
        if len(runs) >= count and done and open_backfills == 0:
            return runs
        time.sleep(3)
    pytest.fail(f"backfill runs did not finish in {timeout} s: {_runs(env)}")


def _backfill(env: dict[str, str], start: datetime, end: datetime, *extra: str) -> str:
    """``airflow backfill create``; tried again when Airflow's SQLite metadata DB was locked by the
    running scheduler. A locked attempt may still have created the backfill before it failed: then the
    backfill is there (not completed) and is not created twice."""
    _, open_before = _runs(env)
    for _ in range(3):
        out = airflow(
            [
                "backfill", "create", "--dag-id", DAG,
                "--from-date", start.isoformat(), "--to-date", end.isoformat(),
                "--max-active-runs", "1", *extra,
            ],
            env,
        )  # fmt: skip
        if "[exit 0]" in out or "database is locked" not in out:
            return out
        time.sleep(3)
        if _runs(env)[1] > open_before:
            return f"{out}\n(the locked attempt created the backfill all the same)\n[exit 0]"
    return out


def test_backfill_processes_each_interval_once_and_a_rerun_is_a_no_op(
    orders_stack, scheduler_env, settings
) -> None:
    stack, env = orders_stack, scheduler_env
    t0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 5 * HOUR
    batches = [make_orders(1000 * i, 8 + i, bad_every=1000) for i in range(3)]
    for i, batch in enumerate(batches):
        stamp = int((t0 + i * HOUR + timedelta(minutes=10)).timestamp() * 1000)
        produce(settings.kafka_bootstrap, stack.topic, batch.records, timestamp_ms=stamp, transactional=False)
    # Newer records, after the backfilled range: no backfill epoch may read them.
    late = make_orders(9000, 5, bad_every=1000)
    produce(settings.kafka_bootstrap, stack.topic, late.records)

    created = _backfill(env, t0, t0 + 2 * HOUR)
    assert "[exit 0]" in created, created[-3000:]
    runs = _wait_for_runs(env, 3)
    assert set(runs.values()) == {"success"}, runs

    with Ledger.connect(stack.ledger_url) as ledger:
        epochs = ledger.epochs(stack.pipeline)
        per_epoch = {
            e.number: sum(
                p.record_count for p in ledger.participants(stack.pipeline, e.number) if p.sink == "orders_pg"
            )
            for e in epochs
        }
    assert [e.status for e in epochs] == [EpochStatus.COMMITTED] * 3
    assert [e.data_interval_start for e in epochs] == [t0, t0 + HOUR, t0 + 2 * HOUR]
    assert [per_epoch[e.number] for e in epochs] == [len(b.valid) for b in batches]
    assert stack.order_ids() == sorted(i for b in batches for i in b.valid)

    # Re-run the middle interval: the run is re-executed, and its plan says there is nothing to do.
    again = _backfill(env, t0 + HOUR, t0 + HOUR, "--reprocess-behavior", "completed")
    assert "[exit 0]" in again, again[-3000:]
    time.sleep(5)
    _wait_for_runs(env, 3)
    plan_logs = "".join(
        p.read_text() for p in (Path(env["AIRFLOW_HOME"]) / "logs").rglob("*task_id=plan*/*.log")
    )
    assert "nothing to do" in plan_logs, plan_logs[-3000:]
    assert [e.status for e in Ledger.connect(stack.ledger_url).epochs(stack.pipeline)] == [
        EpochStatus.COMMITTED
    ] * 3
    assert stack.order_ids() == sorted(i for b in batches for i in b.valid)
