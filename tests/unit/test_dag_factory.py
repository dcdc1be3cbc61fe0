"""The DAG the factory builds for a pipeline spec: its tasks, their order, trigger rules and params."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dag():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "plugins"))
    from onceflow_airflow.dag_factory import build_dag

    return build_dag("examples.orders.pipeline:ORDERS", dag_id="orders_under_test")


def test_one_task_per_step_and_one_spark_submit_per_slice(dag) -> None:  # type: ignore[no-untyped-def]
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    assert sorted(dag.task_ids) == sorted(
        ["recover", "plan", "process_s0", "process_s1", "commit", "report", "abort"]
    )
    assert dag.max_active_runs == 1
    assert dag.get_task("recover").downstream_task_ids == {"plan"}
    assert dag.get_task("plan").downstream_task_ids == {"process_s0", "process_s1"}
    for name in ("process_s0", "process_s1"):
        process = dag.get_task(name)
        assert isinstance(process, SparkSubmitOperator)
        assert process.downstream_task_ids == {"commit", "abort"}
        assert process.retries == 0  # a failed slice aborts the epoch; the next run replays it
        assert process.application.endswith("spark_jobs/onceflow_process.py")
    assert dag.get_task("commit").downstream_task_ids == {"report"}


def test_trigger_rules_and_params(dag) -> None:  # type: ignore[no-untyped-def]
    assert dag.get_task("abort").trigger_rule == "one_failed"
    assert dag.get_task("commit").trigger_rule == "none_failed"  # skipped empty slices are fine
    assert dag.get_task("commit").retries == 2
    assert set(dag.params) == {"max_records_per_partition", "preview", "interval"}
    assert dag.params["preview"] is False
    assert dag.params["interval"] == "auto"
