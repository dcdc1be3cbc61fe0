"""Event-driven runs with Airflow's own scheduler, triggerer and DAG processor.

The example DAG ``onceflow_clicks_on_new_records`` (``schedule=ON_NEW_RECORDS``) must start a run by
itself when records arrive, commit exactly those records, start another run for the next records, and
lose or double nothing, however many events its trigger fired meanwhile. Process tasks run their slice
in the task's own process (``ONCEFLOW_EXECUTOR=local``), so no Spark starts.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from local_stack.local_airflow import migrate, start_servers, stop_process_groups
from local_stack.ports import free_port

from onceflow.ledger import EpochStatus, Ledger
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_ID = "onceflow_clicks_on_new_records"
DAG_FILE = ROOT / "dags" / f"{DAG_ID}.py"


@pytest.fixture
def clicks(airflow_env, make_topic, pg_database, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A fresh topic, database, ledger and Airflow home; api-server, scheduler, triggerer and DAG
    processor running on them (stopped afterwards)."""
    topic = make_topic("clicks", partitions=2)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger.connect(ledger_url, check=False) as ledger:
        ledger.upgrade()
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / DAG_FILE.name).symlink_to(DAG_FILE)
    port = free_port()
    env = {
        **airflow_env,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "ONCEFLOW_CLICKS_SUFFIX": topic.removeprefix("clicks"),
        "ONCEFLOW_CLICKS_PG_DSN": pg_database,
        "ONCEFLOW_LEDGER_URL": ledger_url,
        "ONCEFLOW_HOME": str(tmp_path / "home"),
        "ONCEFLOW_EXECUTOR": "local",
    }
    env.pop("ONCEFLOW_SPARK_REMOTE", None)
    migrate(env)
    logs = tmp_path / "airflow"
    procs = start_servers(
        env, logs, (["api-server", "--port", str(port)], ["scheduler"], ["triggerer"], ["dag-processor"])
    )
    try:
        yield {**env, "topic": topic, "pipeline": topic, "table": topic.replace("-", "_")}
    finally:
        stop_process_groups(procs)


def _produce(bootstrap: str, topic: str, first: int, count: int) -> list[int]:
    """``count`` clicks numbered from ``first`` (their ``ms``), spread over both partitions, and one
    record that is not a click (a dead letter); returns the numbers sent."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(first, first + count):
        click = {"user_id": f"u{n % 7}", "page": f"/p{n}", "ms": n}
        producer.produce(topic, key=str(n), value=json.dumps(click), partition=n % 2)
    producer.produce(topic, key="bad", value="{not json", partition=0)
    assert producer.flush(30) == 0
    return list(range(first, first + count))


def _runs(env: dict[str, str]) -> list[tuple[str, str, str]]:
    path = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(
            "SELECT run_id, run_type, state FROM dag_run WHERE dag_id = ? ORDER BY id", (DAG_ID,)
        ).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def _committed_rows(dsn: str, table: str) -> list[tuple[int, int, int]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return []
        rows = conn.execute(f'SELECT ms, _partition, _offset FROM "{table}" ORDER BY ms').fetchall()
    return [(int(r[0]), int(r[1]), int(r[2])) for r in rows]


def _wait_until_caught_up(
    env: dict[str, str], numbers: list[int], deadline: float
) -> list[tuple[str, str, str]]:
    """Until every produced click is committed and no run is queued or running."""
    rows: list[tuple[int, int, int]] = []
    while time.monotonic() < deadline:
        runs = _runs(env)
        rows = _committed_rows(env["ONCEFLOW_CLICKS_PG_DSN"], env["table"])
        busy = any(state in ("queued", "running") for _, _, state in runs)
        if len(rows) >= len(numbers) and not busy:
            return runs
        time.sleep(2)
    logs = Path(env["AIRFLOW_HOME"])
    tail = (logs / "triggerer.log").read_text()[-3000:] if (logs / "triggerer.log").exists() else ""
    pytest.fail(f"not caught up: {len(rows)} of {len(numbers)} rows, runs {_runs(env)}\n{tail}")


def _wait_for_running_run(env: dict[str, str], after: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if any(state == "running" for _, _, state in _runs(env)[after:]):
            return
        time.sleep(0.5)
    pytest.fail(f"no run started: {_runs(env)}")


def test_new_records_start_runs_that_commit_each_record_once(clicks, settings) -> None:
    env = clicks
    dsn, table = env["ONCEFLOW_CLICKS_PG_DSN"], env["table"]
    deadline = time.monotonic() + 170
    sent = _produce(settings.kafka_bootstrap, env["topic"], 0, 40)

    runs = _wait_until_caught_up(env, sent, deadline)
    assert runs, "no DAG run started"
    assert {run_type for _, run_type, _ in runs} == {"asset_triggered"}
    assert {state for _, _, state in runs} == {"success"}, runs
    assert [ms for ms, _, _ in _committed_rows(dsn, table)] == sent

    # More records start another run; records that arrive while it runs are announced during it, and
    # processed by it or by the run after it, never by both.
    first_runs = len(runs)
    sent += _produce(settings.kafka_bootstrap, env["topic"], 40, 25)
    _wait_for_running_run(env, first_runs, deadline)
    sent += _produce(settings.kafka_bootstrap, env["topic"], 65, 15)
    runs = _wait_until_caught_up(env, sent, deadline)
    assert len(runs) > first_runs, "the later records started no run"
    assert {state for _, _, state in runs} == {"success"}, runs

    # A run with nothing new (an extra event, or a person) commits an empty epoch and changes nothing.
    from local_stack.local_airflow import run_airflow

    run_airflow(["dags", "trigger", DAG_ID], env, timeout=120)
    time.sleep(3)
    runs = _wait_until_caught_up(env, sent, deadline)
    assert {state for _, _, state in runs} == {"success"}, runs

    rows = _committed_rows(dsn, table)
    assert [ms for ms, _, _ in rows] == sent  # every click once: none lost, none doubled
    assert len({(p, o) for _, p, o in rows}) == len(rows)
    with Ledger.connect(env["ONCEFLOW_LEDGER_URL"]) as ledger:
        epochs = ledger.epochs(env["pipeline"])
        letters = ledger.dead_letters(env["pipeline"])
        positions = ledger.committed_offsets(env["pipeline"])
    assert {e.status for e in epochs} == {EpochStatus.COMMITTED}
    assert len(epochs) == len(runs)  # one epoch per run
    assert sum(r.span for r in epochs[-1].ranges) == 0  # the manual run's epoch was empty
    # Epochs never overlap: each range starts where the previous epoch of its partition ended.
    ends: dict[tuple[str, int], int] = {}
    for epoch in epochs:
        for r in epoch.ranges:
            assert r.from_offset == ends.get((r.topic, r.partition), 0), (epoch, r)
            ends[(r.topic, r.partition)] = r.until_offset
    assert len(letters) == 3  # one record per batch was not a click
    # The committed position is the end of everything produced: the clicks and the 3 other records.
    assert sum(positions.values()) == len(sent) + 3
