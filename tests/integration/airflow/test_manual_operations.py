"""Manual operations on the orders DAG, as an operator does them: by task (Airflow) and by CLI.

Each scenario first runs the DAG up to the pre-commits (`--mark-success-pattern` leaves `commit` and
`report` out), then acts on the epoch the way a person would after an incident.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from examples.orders.data import make_orders, produce

from onceflow.ledger import EpochStatus
from tests.integration.airflow.helpers import (
    UP_TO_PRECOMMIT,
    airflow,
    dags_test,
    epochs,
    onceflow_lines,
    read_topic,
    run_id_of,
    task_state,
    task_test,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG = "onceflow_orders"


def _task(stack, task: str, run_id: str) -> list[str]:
    log = airflow(["tasks", "test", DAG, task, run_id], stack.env)
    print(log[-4000:])  # shown by pytest when the test fails
    return onceflow_lines(log)


def _enriched_ids(settings, stack) -> list[int]:
    return sorted(json.loads(v)["order_id"] for v in read_topic(settings.kafka_bootstrap, stack.enriched))


def _last_line(lines: list[str]) -> str:
    """The last line, without Airflow's timestamp, level and logger decoration."""
    assert lines, "no output"
    return lines[-1].split("onceflow: ", 1)[-1].split(" [airflow.", 1)[0].strip()


def test_clear_commit_after_outage_clear_abort_and_dry_run(orders_stack, settings) -> None:
    stack = orders_stack
    first = make_orders(0, 60)
    produce(settings.kafka_bootstrap, stack.topic, first.records)

    # A dry run prints the ranges and leaves nothing in the ledger.
    log = dags_test(stack.env, DAG, conf={"preview": True})
    assert any("dry run" in line and "would read" in line for line in onceflow_lines(log)), log[-3000:]
    assert epochs(stack.ledger_url, stack.pipeline) == []

    # Run 1 pre-commits; its commit meets a sink outage after the decision.
    run1 = run_id_of(dags_test(stack.env, DAG, mark_success=UP_TO_PRECOMMIT))
    assert [e.status for e in epochs(stack.ledger_url, stack.pipeline)] == [EpochStatus.PLANNED]
    stack.set_database_online(settings.pg_dsn, False)
    _task(stack, "commit", run1)
    assert epochs(stack.ledger_url, stack.pipeline)[0].status is EpochStatus.COMMITTING

    # Clearing abort now is refused: the decision is durable. `airflow tasks test` exits 0 whatever
    # the task did, so a refused task exits 3 and Airflow records it failed: it must not look done.
    code, lines = task_test(stack.env, DAG, "abort", run1)
    print("\n".join(lines[-40:]))  # shown by pytest when the test fails
    assert code == 3, lines[-40:]
    assert _last_line(lines).startswith("abort refused: cannot abort epoch 1 "), lines[-5:]
    assert "it is COMMITTING" in _last_line(lines)
    assert task_state(stack.env, DAG, "abort", run1) == "failed"
    assert epochs(stack.ledger_url, stack.pipeline)[0].status is EpochStatus.COMMITTING

    # The database is back: clearing commit finishes the decided commit.
    stack.set_database_online(settings.pg_dsn, True)
    code, lines = task_test(stack.env, DAG, "commit", run1)
    assert code == 0, lines[-40:]
    assert any("decision to commit is durable" in line for line in lines), lines
    assert epochs(stack.ledger_url, stack.pipeline)[0].status is EpochStatus.COMMITTED
    assert stack.order_ids() == first.valid
    assert _enriched_ids(settings, stack) == first.valid

    # Clearing commit again changes nothing, and says so.
    lines = _task(stack, "commit", run1)
    assert any("already committed" in line and "nothing changed" in line for line in lines), lines

    # Run 2 pre-commits; clearing abort rolls it back; run 3 replays its range.
    second = make_orders(1000, 40)
    produce(settings.kafka_bootstrap, stack.topic, second.records)
    run2 = run_id_of(dags_test(stack.env, DAG, mark_success=UP_TO_PRECOMMIT))
    lines = _task(stack, "abort", run2)
    assert any("rolled back" in line for line in lines), lines
    # Committing the aborted epoch is refused in turn.
    code, lines = task_test(stack.env, DAG, "commit", run2)
    assert code == 3, lines[-40:]
    assert _last_line(lines).startswith("commit refused: cannot commit epoch 2 "), lines[-5:]
    assert "it is ABORTED" in _last_line(lines)
    assert [e.status for e in epochs(stack.ledger_url, stack.pipeline)] == [
        EpochStatus.COMMITTED,
        EpochStatus.ABORTED,
    ]
    assert stack.order_ids() == first.valid
    assert (
        stack.pg_rows("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")[0][0] == 0
    )

    dags_test(stack.env, DAG)
    done = epochs(stack.ledger_url, stack.pipeline)
    assert [e.status for e in done] == [EpochStatus.COMMITTED, EpochStatus.ABORTED, EpochStatus.COMMITTED]
    assert done[2].ranges == done[1].ranges  # the aborted range, replayed exactly
    assert stack.order_ids() == first.valid + second.valid
    assert _enriched_ids(settings, stack) == first.valid + second.valid
    rejected = stack.pg_rows(f"SELECT order_id, reason FROM {stack.rejected_table} ORDER BY 1")
    assert {int(i): r.split(":")[0] for i, r in rejected} == {**first.rejected, **second.rejected}  # type: ignore[call-overload]


def _onceflow(stack, *args: str) -> subprocess.CompletedProcess[str]:
    root = str(Path(__file__).resolve().parents[3])
    env = {
        **stack.env,
        "ONCEFLOW_PIPELINES": "examples.orders.pipeline:ORDERS",
        "PYTHONPATH": os.pathsep.join([root, stack.env.get("PYTHONPATH", "")]),
    }
    onceflow = str(Path(sys.executable).parent / "onceflow")
    return subprocess.run([onceflow, *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_commit_after_outage_and_abort(orders_stack, settings) -> None:
    stack = orders_stack
    first = make_orders(0, 30)
    produce(settings.kafka_bootstrap, stack.topic, first.records)
    preview = _onceflow(stack, "preview", stack.pipeline, "--max-records-per-partition", "10")
    assert preview.returncode == 0 and "would read 10 offsets" in preview.stdout, preview.stderr
    assert epochs(stack.ledger_url, stack.pipeline) == []  # a preview writes nothing
    dags_test(stack.env, DAG, mark_success=UP_TO_PRECOMMIT)

    stack.set_database_online(settings.pg_dsn, False)
    failed = _onceflow(stack, "commit", stack.pipeline, "1")
    assert failed.returncode == 1 and "commit" in failed.stderr, failed.stderr
    refused = _onceflow(stack, "abort", stack.pipeline, "1")
    assert refused.returncode == 3 and "COMMITTING" in refused.stderr, refused.stderr
    stack.set_database_online(settings.pg_dsn, True)
    done = _onceflow(stack, "commit", stack.pipeline, "1")
    assert done.returncode == 0 and "COMMITTED" in done.stdout, done.stderr
    again = _onceflow(stack, "commit", stack.pipeline, "1")
    assert again.returncode == 0, again.stderr
    assert stack.order_ids() == first.valid

    second = make_orders(500, 20)
    produce(settings.kafka_bootstrap, stack.topic, second.records)
    dags_test(stack.env, DAG, mark_success=UP_TO_PRECOMMIT)
    aborted = _onceflow(stack, "abort", stack.pipeline, "2")
    assert aborted.returncode == 0 and "ABORTED" in aborted.stdout, aborted.stderr
    assert _onceflow(stack, "abort", stack.pipeline, "2").returncode == 0
    refused = _onceflow(stack, "commit", stack.pipeline, "2")
    assert refused.returncode == 3 and "ABORTED" in refused.stderr, refused.stderr
    assert stack.order_ids() == first.valid
    assert [e.status for e in epochs(stack.ledger_url, stack.pipeline)] == [
        EpochStatus.COMMITTED,
        EpochStatus.ABORTED,
    ]


def test_a_failed_process_task_aborts_the_epoch_and_the_next_run_replays_it(
    orders_stack, settings, tmp_path: Path
) -> None:
    """The Spark driver dies after its tasks pre-committed (SIGKILL): `abort` (trigger rule one_failed)
    rolls the prepared transactions back, and the next run replays exactly that range. Both runs are
    bounded by the ``max_records_per_partition`` param."""
    stack = orders_stack
    data = make_orders(0, 30)
    produce(settings.kafka_bootstrap, stack.topic, data.records)
    # Through spark-submit: on the warm runtime the slice's driver is the task's own process.
    crash_env = {
        **{k: v for k, v in stack.env.items() if k != "ONCEFLOW_SPARK_REMOTE"},
        "ONCEFLOW_CRASH_AT": "slice_after_precommits",
        "ONCEFLOW_CRASH_STATE": str(tmp_path / "crash"),
    }
    (tmp_path / "crash").mkdir()
    dags_test(crash_env, DAG, conf={"max_records_per_partition": 10})
    assert (tmp_path / "crash" / "crashed-slice_after_precommits").exists()
    [failed] = epochs(stack.ledger_url, stack.pipeline)
    assert failed.status is EpochStatus.ABORTED
    assert [r.span for r in failed.ranges] == [10]
    assert stack.order_ids() == []
    assert read_topic(settings.kafka_bootstrap, stack.enriched) == []
    assert (
        stack.pg_rows("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")[0][0] == 0
    )

    dags_test(stack.env, DAG, conf={"max_records_per_partition": 10})
    replayed = epochs(stack.ledger_url, stack.pipeline)[1]
    assert replayed.status is EpochStatus.COMMITTED and replayed.ranges == failed.ranges
    dags_test(stack.env, DAG)
    assert [e.status for e in epochs(stack.ledger_url, stack.pipeline)] == [
        EpochStatus.ABORTED,
        EpochStatus.COMMITTED,
        EpochStatus.COMMITTED,
    ]
    assert stack.order_ids() == data.valid
    assert _enriched_ids(settings, stack) == data.valid
